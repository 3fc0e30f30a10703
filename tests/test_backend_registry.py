"""tests/test_backend_registry.py: the registry: lazy loading, one owner per name, plugins."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import honed
from honed.backend import (
    Availability,
    Backend,
    GraphInfo,
    TorchInductorBackend,
    TorchInductorBackendConfig,
    availability,
    backend_from_recipe,
    lookup_backend,
    register_backend,
)
from honed.backend import registry as reg

from conftest import TinyMLP

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, path: Path | None = None) -> str:
    """Run ``code`` in a fresh interpreter (``path`` first on sys.path); its stdout."""
    env_path = [str(path)] if path else []
    script = f"import sys; sys.path[:0] = {env_path!r}\n" + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test do not outlive it."""
    monkeypatch.setattr(reg, "_LOADED", dict(reg._LOADED))


def test_import_honed_loads_no_backend_module() -> None:
    out = _python(
        """
        import sys, honed
        heavy = ["onnxruntime", "tensorrt", "torch_tensorrt", "torchao", "torch_inductor",
                 "torch_inductor_aot", "cuda_graphs"]
        print("LOADED", [m for m in heavy if "honed.backend." + m in sys.modules])
        honed.backend.TorchInductorBackend
        print("AFTER", "honed.backend.torch_inductor" in sys.modules,
              "honed.backend.onnxruntime" in sys.modules)
        """
    )
    assert "LOADED []" in out
    assert "AFTER True False" in out


def test_lookup_finds_builtins_and_refuses_unknown_names() -> None:
    assert lookup_backend("TorchInductorBackend") is TorchInductorBackend
    assert "TorchInductorAotBackend" in honed.backend.list_backends()
    with pytest.raises(honed.ConfigError, match=r"no backend named 'Nope'; known: TorchEager"):
        lookup_backend("Nope")


def test_register_refuses_a_taken_name(clean_registry: None) -> None:
    class Mine(Backend):
        def build(self, module: torch.nn.Module, example_inputs: list[Any]) -> Any:
            return module

    assert register_backend(Mine) is Mine
    assert lookup_backend("Mine") is Mine
    assert register_backend(Mine) is Mine  # the same class again is no duplicate

    class Other(Backend):
        pass

    with pytest.raises(honed.ConfigError, match=r"a backend named 'Mine' is registered already"):
        register_backend(Other, name="Mine")
    # A built-in's name is taken before its module is even loaded.
    with pytest.raises(honed.ConfigError, match=r"'TensorRTBackend' is registered already .*"):
        register_backend(Other, name="TensorRTBackend")
    with pytest.raises(honed.ConfigError, match=r"not a subclass of honed\.backend\.Backend"):
        register_backend(object, name="Thing")  # type: ignore[type-var]


def _user_class_named_like_a_builtin() -> type[Backend]:
    class TorchInductorBackend(Backend):  # a user's class, named like the built-in
        def build(self, module: torch.nn.Module, example_inputs: list[Any]) -> Callable[..., Any]:
            return module

    return TorchInductorBackend


def test_a_user_class_named_like_a_builtin_never_replaces_it() -> None:
    user_cls = _user_class_named_like_a_builtin()
    builtin = TorchInductorBackend(TorchInductorBackendConfig(mode="reduce-overhead"))
    rebuilt = backend_from_recipe(builtin.recipe())
    assert type(rebuilt) is TorchInductorBackend
    assert lookup_backend("TorchInductorBackend") is TorchInductorBackend
    # The user's class is stored under its qualified name and comes back as itself.
    recipe = user_cls().recipe()
    assert recipe["backend"] == f"{__name__}.{user_cls.__qualname__}"
    assert type(backend_from_recipe(recipe)) is user_cls


def test_recipes_of_unregistered_classes_use_qualified_names() -> None:
    class Local(Backend):
        pass

    assert Local().recipe()["backend"].endswith(".Local")
    assert type(backend_from_recipe(Local().recipe())) is Local
    assert backend_from_recipe({"backend": "not.loaded.Anywhere", "config": None}) is None


class _Raising(Backend):
    @classmethod
    def available(cls) -> Availability:
        raise RuntimeError("driver exploded")


class _Lying(Backend):
    @classmethod
    def available(cls) -> Availability:
        return "yes"  # type: ignore[return-value]


def test_availability_turns_a_raising_check_into_a_verdict() -> None:
    verdict = availability(_Raising)
    assert not verdict.ok
    assert verdict.reason == "_Raising.available() raised RuntimeError: driver exploded"
    assert not availability(_Lying).ok
    assert "not an Availability" in availability(_Lying).reason


def test_a_raising_available_fails_only_its_candidate() -> None:
    model = honed.Module(TinyMLP().eval(), "raising-available")
    report = honed.tune(model, [torch.randn(4, 16)], strategy=honed.OneBackendStrategy(_Raising()))
    row = next(c for g in report.graphs for c in g.candidates if not c.is_baseline)
    assert row.status == "failed"
    assert row.reason.startswith("unavailable: _Raising.available() raised RuntimeError")


class _NeedsProbe(Backend):
    requires = ("honed_probe_lib",)

    @classmethod
    def available(cls) -> Availability:
        import honed_probe_lib  # type: ignore[import-not-found]  # noqa: F401

        return Availability(True)


class _NeedsAbsent(Backend):
    requires = ("honed_absent_lib",)


def test_installed_only_answers_without_importing_what_a_backend_requires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A library that is installed but fails to import: only a real import finds that out.
    (tmp_path / "honed_probe_lib.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with reg.installed_only():
        assert availability(_NeedsProbe).ok
        verdict = availability(_NeedsAbsent)
        assert not verdict.ok and verdict.reason == "honed_absent_lib is not installed"
        with reg.installed_only():  # blocks nest: the inner one's end leaves the outer in force
            pass
        assert availability(_NeedsProbe).ok
    assert "honed_probe_lib" not in sys.modules
    # Outside the block (and on other threads) the check is the backend's own, import included.
    outside = availability(_NeedsProbe)
    assert not outside.ok and "RuntimeError: imported" in outside.reason


def test_default_backends_fit_the_kind_of_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from honed.backend._defaults import default_candidates

    cuda = torch.device("cuda")
    image = GraphInfo(cuda, min_shapes=((1, 3, 224, 224),))
    tokens = GraphInfo(cuda, min_shapes=((1, 128), (1, 128)))
    names_image = [b.name for b in default_candidates(cuda, image)]
    names_tokens = [b.name for b in default_candidates(cuda, tokens)]
    wanted = "TorchInductorBackend(mode=reduce-overhead, bf16 weights, channels_last)"
    assert wanted in names_image and wanted not in names_tokens
    assert "TorchInductorAotBackend(bf16 weights, channels_last, CUDA graphs)" in names_image
    assert "TorchInductorBackend(mode=reduce-overhead, bf16 weights)" in names_tokens
    assert "TorchInductorAotBackend(bf16 weights, CUDA graphs)" in names_tokens
    # On CUDA every AOTInductor candidate replays CUDA graphs, and max-autotune without CUDA
    # graphs (never within 3 % of a suite row's best, the longest builds) is not a default.
    assert all("CUDA graphs" in n for n in names_tokens if n.startswith("TorchInductorAot"))
    assert not [n for n in names_image + names_tokens if "max-autotune" in n]
    assert not any("channels_last" in b.name for b in default_candidates(cuda, None))
    cpu = [b.name for b in default_candidates(torch.device("cpu"), image)]
    assert cpu == [
        "TorchInductorBackend",
        "TorchInductorBackend(dynamic=False)",
        "TorchInductorAotBackend",
        "ONNXRuntimeBackend",
    ]
    # Only what is available here is offered.
    monkeypatch.setattr(reg, "availability", lambda cls: Availability(cls.__name__ != "X"))
    assert [b.name for b in honed.backend.default_backends(cuda, image)] == names_image


def test_candidates_say_what_they_cost_and_may_gain() -> None:
    from honed.backend._defaults import default_candidates

    cuda = torch.device("cuda")
    by_name = {
        b.name: b for b in default_candidates(cuda, GraphInfo(cuda, min_shapes=((1, 3, 8, 8),)))
    }
    eager = honed.backend.TorchEagerBackend()
    autotune = honed.backend.TorchInductorBackend(
        honed.backend.TorchInductorBackendConfig(mode="max-autotune-no-cudagraphs")
    )
    default = by_name["TorchInductorBackend"]
    assert eager.expected_cost == 0 < default.expected_cost < autotune.expected_cost
    bf16 = by_name["TorchInductorBackend(mode=reduce-overhead, bf16 weights)"]
    assert bf16.expected_gain > by_name["TorchInductorBackend(mode=reduce-overhead)"].expected_gain
    assert Backend().expected_cost == 1.0 and Backend().expected_gain == 1.0


# -- third-party backends through the honed.backends entry-point group ---------------------------
_PLUGIN = '''
"""A tiny third-party backend: runs the module as it is."""
from honed.backend import Backend


class TinyPluginBackend(Backend):
    portability = 0

    def build(self, module, example_inputs):
        return module


class TorchInductorBackend(Backend):
    """Named like a built-in: must be refused."""

    def build(self, module, example_inputs):
        raise AssertionError("the built-in must win")
'''

_ENTRY_POINTS = """[honed.backends]
TinyPlugin = honed_tiny_plugin:TinyPluginBackend
TorchInductorBackend = honed_tiny_plugin:TorchInductorBackend
Broken = honed_tiny_plugin_missing:Nothing
"""


def _install_plugin(root: Path) -> Path:
    """An installed distribution (package plus .dist-info) in ``root``, found on sys.path."""
    (root / "honed_tiny_plugin").mkdir(parents=True)
    (root / "honed_tiny_plugin" / "__init__.py").write_text(_PLUGIN)
    info = root / "honed_tiny_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: honed-tiny-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(_ENTRY_POINTS)
    return root


@pytest.mark.integration  # installs a package
def test_an_installed_plugin_is_found_used_and_cannot_shadow_a_builtin(tmp_path: Path) -> None:
    site = _install_plugin(tmp_path / "site")
    out = _python(
        """
        import logging, torch, honed
        from honed.backend import lookup_backend, available_backends, backend_from_recipe
        logging.basicConfig(level=logging.ERROR, format="LOG %(message)s")
        cls = lookup_backend("TinyPlugin")
        print("PLUGIN", cls.__module__, cls.__name__)
        print("BUILTIN", lookup_backend("TorchInductorBackend").__module__)
        verdicts = available_backends()
        print("TINY", verdicts["TinyPlugin"].ok)
        print("BROKEN", verdicts["Broken"].ok, verdicts["Broken"].reason)
        recipe = cls().recipe()
        print("RECIPE", recipe["backend"], type(backend_from_recipe(recipe)).__name__)
        model = honed.Module(torch.nn.Linear(4, 2).eval(), "plugin")
        report = honed.tune(model, [torch.randn(3, 4)],
                            strategy=honed.OneBackendStrategy(cls()))
        print("SELECTED", report.selected())
        """,
        site,
    )
    assert "PLUGIN honed_tiny_plugin TinyPluginBackend" in out
    assert "BUILTIN honed.backend.torch_inductor" in out
    assert "TINY True" in out
    assert "BROKEN False the plugin failed to load: ModuleNotFoundError" in out
    assert "RECIPE TinyPlugin TinyPluginBackend" in out
    assert "SELECTED ['TinyPluginBackend']" in out
    assert "LOG honed: backend plugin 'TorchInductorBackend'" in out
    assert "a backend named 'TorchInductorBackend' is registered already" in out

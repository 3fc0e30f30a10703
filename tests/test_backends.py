"""tests/test_backends.py: backend configs, availability and the seed snippets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import honed
from honed.backend import (
    Backend,
    TorchEagerBackend,
    TorchEagerBackendConfig,
    TorchInductorBackend,
    TorchInductorBackendConfig,
    backend_from_recipe,
)

from conftest import TinyMLP, batches


def test_inductor_config_has_the_seed_fields_and_defaults() -> None:
    cfg = TorchInductorBackendConfig()
    assert (cfg.fullgraph, cfg.dynamic, cfg.mode, cfg.options) == (False, None, None, None)
    assert (cfg.autocast_enabled, cfg.autocast_dtype) == (False, None)
    for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        assert TorchInductorBackendConfig(mode=mode).mode == mode


def test_mode_with_options_is_a_config_error() -> None:
    with pytest.raises(honed.ConfigError, match="either mode or options"):
        TorchInductorBackendConfig(mode="max-autotune", options={"max_autotune": True})
    with pytest.raises(honed.ConfigError, match="unknown mode 'fastest'"):
        TorchInductorBackendConfig(mode="fastest")
    with pytest.raises(honed.ConfigError, match=r"float16 or torch\.bfloat16"):
        TorchInductorBackendConfig(autocast_enabled=True, autocast_dtype=torch.int8)


def test_recipe_round_trip_keeps_the_config() -> None:
    backend = TorchInductorBackend(
        TorchInductorBackendConfig(
            mode="max-autotune", autocast_enabled=True, autocast_dtype=torch.bfloat16
        )
    )
    rebuilt = backend_from_recipe(backend.recipe())
    assert isinstance(rebuilt, TorchInductorBackend)
    assert rebuilt.config == backend.config
    assert (
        rebuilt.name == "TorchInductorBackend(mode=max-autotune, autocast_enabled=True, "
        "autocast_dtype=bfloat16)"
    )


def test_wrong_config_type_is_refused() -> None:
    with pytest.raises(honed.ConfigError, match="takes a TorchInductorBackendConfig"):
        TorchInductorBackend(TorchEagerBackendConfig())  # type: ignore[arg-type]


def test_builtin_backends_are_available_here() -> None:
    assert TorchEagerBackend.available().ok
    assert TorchInductorBackend.available().ok


def test_eager_autocast_returns_the_eager_dtype() -> None:
    model = TinyMLP().eval()
    backend = TorchEagerBackend(
        TorchEagerBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16)
    )
    fn = backend.build(model, [])
    x = batches(4)[0]
    out = fn(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, model(x), atol=5e-2, rtol=5e-2)


def test_backend_without_build_says_what_to_implement() -> None:
    class Empty(Backend):
        pass

    with pytest.raises(NotImplementedError, match=r"implement build\(module, example_inputs\)"):
        Empty().build(TinyMLP(), [])


def test_seed_inductor_quick_start_runs() -> None:
    # From the seed torch-inductor-backend.txt, with `aitune.torch` replaced by `honed`
    # (mode "default" instead of "max-autotune" to keep CPU compile time small).
    import honed as ait
    from honed.backend import TorchInductorBackend, TorchInductorBackendConfig

    model = TinyMLP().eval()
    input_data = batches(2, 4)
    config = TorchInductorBackendConfig(mode="default")
    backend = TorchInductorBackend(config)
    from honed.tune_strategy import OneBackendStrategy

    strategy = ait.OneBackendStrategy(backend=backend)
    model = ait.Module(model, "my-model", strategy=strategy)
    ait.tune(model, input_data)
    assert isinstance(OneBackendStrategy(backend=backend), ait.OneBackendStrategy)
    assert model.report.selected() == ["TorchInductorBackend(mode=default)"]
    torch.testing.assert_close(model(input_data[0]), model.module(input_data[0]))


def test_seed_torch_tensorrt_aot_snippet_with_inductor(tmp_path: Path) -> None:
    # The seed torch-tensorrt-aot-backend.txt's quick start, `aitune.torch` -> `honed`, with the
    # TensorRT backend swapped for Inductor (TensorRT cannot be installed on our machines).
    import honed as ait
    from honed.backend import TorchInductorBackend, TorchInductorBackendConfig

    model = TinyMLP().eval()
    input_data = batches(2, 4)
    config = TorchInductorBackendConfig(mode="default")
    backend = TorchInductorBackend(config)

    from honed.tune_strategy import OneBackendStrategy

    strategy = OneBackendStrategy(backend=backend)

    model = ait.Module(model, "my-model", strategy=strategy)
    ait.tune(model, input_data)

    # Save compiled model
    ait.save(model, tmp_path / "model.ait")

    # Later: Load and use
    fresh = ait.Module(TinyMLP().eval(), "my-model", strategy=strategy)
    ait.load(fresh, tmp_path / "model.ait")
    assert fresh.is_tuned
    torch.testing.assert_close(fresh(input_data[1]), model(input_data[1]))

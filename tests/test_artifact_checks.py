"""tests/test_artifact_checks.py: crafted artifacts get one line naming the entry; warm loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from safetensors.torch import save as st_save

import honed
from honed import _core
from honed.backend import Backend, Sample
from honed.cli import main

from conftest import TinyMLP, batches

PROFILE = {
    "graph_key": "((*,),{})|float32,cpu,2",
    "axes": [
        [
            {"kind": "batch", "name": "batch", "min": 1, "opt": 4, "max": 8},
            {"kind": "static", "name": "", "min": 16, "opt": 16, "max": 16},
        ]
    ],
    "batch_axes": [0],
    "min_batch": 1,
    "opt_batch": 4,
    "max_batch": 8,
}
SAMPLE = "samples/tiny/0.safetensors"


def _sample_bytes(spec: str | None = None) -> bytes:
    x = torch.randn(4, 16)
    if spec is None:
        _, treespec = torch.utils._pytree.tree_flatten(((x,), {}))
        spec = torch.utils._pytree.treespec_dumps(treespec)
    meta = json.dumps({"spec": spec, "leaves": [{"tensor": 0}]})
    return st_save({"leaf0": x}, metadata={"treespec": meta})


def _artifact(path: Path, samples: str = SAMPLE, **entries: bytes) -> Path:
    """A TinyMLP artifact with one eager graph and a stored sample; ``entries`` override
    (names with '/' written as '__')."""
    graph = _core.ManifestGraph()
    graph.profile = _core.GraphProfile.from_json(json.dumps(PROFILE))
    graph.backend = honed.backend.TorchEagerBackend().recipe()
    graph.samples = samples
    module = _core.ManifestModule()
    module.name, module.weights, module.graphs = "tiny", "weights/tiny.safetensors", [graph]
    manifest = _core.Manifest()
    manifest.environment = honed.environment.fingerprint(torch.device("cpu"))
    manifest.modules = [module]
    files = {"weights/tiny.safetensors": st_save(TinyMLP().state_dict()), SAMPLE: _sample_bytes()}
    files.update({k.replace("__", "/"): v for k, v in entries.items()})
    _core.write_artifact(str(path), manifest, files)
    return path


def _rewrite_manifest(src: Path, dst: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of ``src`` whose manifest ``change`` edits (entries and their hashes untouched)."""
    with zipfile.ZipFile(src) as zin:
        files = {n: zin.read(n) for n in zin.namelist()}
    manifest = json.loads(files["manifest.json"])
    change(manifest)
    files["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(dst, "w") as zout:
        for name, data in files.items():
            zout.writestr(name, data)
    return dst


def _load_error(path: Path) -> str:
    with pytest.raises(honed.ArtifactError) as e:
        honed.load(honed.Module(TinyMLP().eval(), "tiny"), path)
    text = str(e.value)
    assert "\n" not in text
    return text


def test_a_well_formed_artifact_loads(tmp_path: Path) -> None:
    model = honed.Module(TinyMLP().eval(), "tiny")
    honed.load(model, _artifact(tmp_path / "ok.honed"))
    assert model.is_tuned


MODELS = """
import sys
sys.path.insert(0, {tests!r})
import torch
from conftest import TinyMLP
def build():
    return TinyMLP().eval(), [torch.randn(4, 16)]
"""


def test_a_flipped_byte_in_the_manifest_is_refused_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _artifact(tmp_path / "m.honed")
    data = path.read_bytes()
    at = data.index(b'"honed_version": "') + len(b'"honed_version": "')
    flipped = tmp_path / "flipped.honed"
    flipped.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :])
    assert "'manifest.json'" in _load_error(flipped) and "CRC" in _load_error(flipped)

    assert main(["report", str(flipped)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'manifest.json'" in err

    (tmp_path / "models.py").write_text(MODELS.format(tests=str(Path(__file__).parent)))
    assert main(["bench", str(flipped), "--entry", f"{tmp_path / 'models.py'}:build"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'manifest.json'" in err and "CRC" in err


PEAK_RSS = """
import resource, sys
import honed
sys.path.insert(0, {tests!r})
from conftest import TinyMLP
try:
    honed.load(honed.Module(TinyMLP(), "tiny"), {path!r})
    print("LOADED")
except honed.ArtifactError as e:
    print("ERROR", e)
print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_an_entry_declaring_3_gib_is_refused_without_allocating_it(tmp_path: Path) -> None:
    payload = b"w" * 77_777
    path = _artifact(tmp_path / "m.honed", weights__extra=payload)
    # The entry's sizes (compressed, uncompressed) in its local header and the central directory.
    data = path.read_bytes()
    sizes = (77_777).to_bytes(4, "little") * 2
    assert data.count(sizes) == 2
    crafted = tmp_path / "crafted.honed"
    crafted.write_bytes(data.replace(sizes, (3 << 30).to_bytes(4, "little") * 2))
    assert crafted.stat().st_size < 200_000
    script = PEAK_RSS.format(tests=str(Path(__file__).parent), path=str(crafted))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert "ERROR" in done.stdout and "LOADED" not in done.stdout
    assert "'weights/extra'" in done.stdout and "3221225472" in done.stdout
    peak_kb = int(done.stdout.split("PEAK_KB")[1])
    assert peak_kb < 1_500_000, f"peak RSS {peak_kb} kB: the declared size was allocated"


def test_a_bad_treespec_names_the_sample_entry(tmp_path: Path) -> None:
    bad = _artifact(
        tmp_path / "spec.honed", **{"samples__tiny__0.safetensors": _sample_bytes("[1, garbage")}
    )
    text = _load_error(bad)
    assert f"entry {SAMPLE!r} has a bad treespec" in text


def test_a_bad_safetensors_header_names_the_entry(tmp_path: Path) -> None:
    bad = _artifact(tmp_path / "h.honed", **{"samples__tiny__0.safetensors": b"\xff" * 8 + b"{"})
    assert f"entry {SAMPLE!r} is not a valid safetensors file" in _load_error(bad)
    bad = _artifact(
        tmp_path / "w2.honed",
        **{"weights__tiny.safetensors": b"\x04\x00\x00\x00\x00\x00\x00\x00[1]x"},
    )
    assert "entry 'weights/tiny.safetensors' is not a valid safetensors file" in _load_error(bad)


def test_missing_entries_are_named(tmp_path: Path) -> None:
    bad = _artifact(tmp_path / "m.honed", samples="samples/tiny/9.safetensors")
    assert "'samples/tiny/9.safetensors', which the file does not hold" in _load_error(bad)
    src = _artifact(tmp_path / "ok.honed")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp_path / "short.honed", "w") as zout:
        for name in zin.namelist():
            if name != SAMPLE:
                zout.writestr(name, zin.read(name))
    assert f"missing entry {SAMPLE!r}" in _load_error(tmp_path / "short.honed")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda m: m["modules"][0]["graphs"][0].update(runnable_from_cpp="yes"),
            "modules[0].graphs[0].runnable_from_cpp must be true or false",
        ),
        (
            lambda m: m["modules"][0]["graphs"][0].update(samples=3),
            "modules[0].graphs[0].samples must be a string, not number",
        ),
        (
            lambda m: m["modules"][0].update(graphs={}),
            "modules[0].graphs must be a list, not object",
        ),
        (lambda m: m["modules"][0].pop("name"), "modules[0].name is missing"),
        (
            lambda m: m["modules"][0]["graphs"][0]["profile"].pop("axes"),
            "modules[0].graphs[0].profile is not a shape profile",
        ),
        (
            lambda m: m["modules"][0]["graphs"][0].update(backend=[1]),
            "modules[0].graphs[0].backend must be an object, not array",
        ),
    ],
)
def test_wrong_types_in_the_manifest_name_the_field(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    bad = _rewrite_manifest(_artifact(tmp_path / "m.honed"), tmp_path / "bad.honed", change)
    text = _load_error(bad)
    assert message in text and "malformed manifest" in text


def test_a_malformed_backend_recipe_is_named(tmp_path: Path) -> None:
    def change(m: dict[str, Any]) -> None:
        m["modules"][0]["graphs"][0]["backend"] = {"backend": "TorchInductorBackend", "config": "{"}

    bad = _rewrite_manifest(_artifact(tmp_path / "m.honed"), tmp_path / "bad.honed", change)
    assert "the recipe of backend 'TorchInductorBackend'" in _load_error(bad)


UNREADABLE = """
import sys
from honed import _core
try:
    _core.read_artifact({path!r})
except _core.ArtifactError as e:
    print(e)
"""


def test_an_unreadable_file_says_so(tmp_path: Path) -> None:
    path = _artifact(tmp_path / "m.honed")
    path.chmod(0)
    if os.geteuid() != 0:
        text = _load_error(path)
    else:  # root reads any file: read it as nobody
        tmp_path.chmod(0o755)
        try:
            done = subprocess.run(
                [sys.executable, "-c", UNREADABLE.format(path=str(path))],
                capture_output=True,
                text=True,
                timeout=600,
                user=65534,
            )
        except PermissionError:
            pytest.skip("root reads any file, and nobody cannot run this Python")
        if "Error" in done.stderr:
            pytest.skip("root reads any file, and nobody cannot import honed here")
        text = done.stdout.strip()
    assert "cannot be read (Permission denied)" in text and "does not exist" not in text


def test_an_artifact_written_by_earlier_honed_versions_loads(tmp_path: Path) -> None:
    """Format 1 as honed.save wrote it before the engine owned the writer: Python's zipfile,
    json.dumps(indent=2, sort_keys=True), null for absent entries."""
    src = _artifact(tmp_path / "new.honed")
    with zipfile.ZipFile(src) as zin:
        files = {n: zin.read(n) for n in zin.namelist()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest["modules"][0]["graphs"][0].update(outputs=None, payload=None)
    old = tmp_path / "old.honed"
    with zipfile.ZipFile(old, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("manifest.json", json.dumps(manifest, indent=2, sort_keys=True))
        for name, data in files.items():
            zf.writestr(name, data)
    model = honed.Module(TinyMLP().eval(), "tiny")
    honed.load(model, old)
    assert model.is_tuned


def test_a_directory_is_not_an_artifact(tmp_path: Path) -> None:
    assert "is not a file" in _load_error(tmp_path)


class Recorder(Backend):
    """Runs eager and remembers the batch size of every call."""

    batches: ClassVar[list[int]] = []

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        def run(x: torch.Tensor) -> Any:
            Recorder.batches.append(int(x.shape[0]))
            return module(x)

        return run


def test_a_loaded_artifact_is_warm_at_every_batch_size_of_its_profile(tmp_path: Path) -> None:
    model = honed.Module(TinyMLP().eval(), "tiny")
    timings = {"TorchEagerBackend": [2.0], "Recorder": [1.0]}
    with honed.config.patch(injected_latencies=timings):
        honed.tune(
            model, batches(1, 2, 4, 4, 8), strategy=honed.MaxThroughputStrategy([Recorder()])
        )
    path = honed.save(model, tmp_path / "m.honed")
    Recorder.batches = []
    fresh = honed.Module(TinyMLP().eval(), "tiny")
    honed.load(fresh, path)
    (variant,) = fresh.variants
    p = variant.profile
    assert (p.min_batch, p.opt_batch, p.max_batch) == (1, 4, 8)
    assert sorted(Recorder.batches) == [1, 4, 8]  # each once, before the first user call

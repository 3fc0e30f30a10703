"""tests/test_artifact.py: save/load round trips, a new process, and damaged or foreign files."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
import zipfile
from pathlib import Path

import pytest
import torch

import honed

from conftest import TinyMLP, batches


@pytest.fixture(scope="module")
def saved(inductor_tuned: honed.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("artifact") / "tiny.honed"
    honed.save(inductor_tuned, path)
    return path


def test_manifest_lists_every_entry_with_its_hash(saved: Path) -> None:
    with zipfile.ZipFile(saved) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        manifest = json.loads(zf.read("manifest.json"))
    assert all(i.compress_type == zipfile.ZIP_STORED for i in infos.values())
    assert manifest["format"] == "honed" and manifest["format_version"] == 1
    # Every entry but the manifest and its signature (honed.save signs with the user's key).
    assert set(manifest["entries"]) == set(infos) - {"manifest.json", "manifest.sig"}
    assert "manifest.sig" in infos
    assert manifest["environment"]["torch"] == torch.__version__
    (module,) = manifest["modules"]
    assert module["name"] == "tiny"
    (graph,) = module["graphs"]
    assert graph["backend"]["backend"] == "TorchInductorBackend"
    assert graph["profile"]["graph_key"] == graph["graph_key"]
    assert not any(name.endswith((".pkl", ".pt", ".pth")) for name in infos)


def test_round_trip_into_a_fresh_model_gives_equal_outputs(
    inductor_tuned: honed.Module, saved: Path
) -> None:
    torch.manual_seed(123)  # different weights: load must replace them
    fresh = honed.Module(TinyMLP().eval(), "tiny")
    x = batches(4, seed=21)[0]
    assert not torch.allclose(fresh(x), inductor_tuned(x))
    honed.load(fresh, saved)
    assert fresh.is_tuned
    assert [type(v.backend).__name__ for v in fresh.variants] == ["TorchInductorBackend"]
    torch.testing.assert_close(fresh(x), inductor_tuned(x))


def test_load_in_a_new_process(inductor_tuned: honed.Module, saved: Path, tmp_path: Path) -> None:
    x = batches(6, seed=33)[0]
    expected = inductor_tuned(x)
    torch.save(x, tmp_path / "x.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import honed
        from conftest import TinyMLP
        model = honed.Module(TinyMLP().eval(), "tiny")
        honed.load(model, {str(saved)!r})
        assert model.is_tuned
        torch.save(model(torch.load({str(tmp_path / "x.pt")!r})), {str(tmp_path / "y.pt")!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=600)
    torch.testing.assert_close(torch.load(tmp_path / "y.pt"), expected)


def test_tampered_entry_is_refused_naming_it(saved: Path, tmp_path: Path) -> None:
    bad = tmp_path / "tampered.honed"
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.startswith("weights/"):
                data = data[:-4] + b"\x00\x00\x80\x3f"
            dst.writestr(info, data)
    model = honed.Module(TinyMLP().eval(), "tiny")
    with pytest.raises(honed.ArtifactError, match=r"weights/tiny\.safetensors.*SHA-256"):
        honed.load(model, bad)


def test_truncated_and_foreign_files_are_refused(saved: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.honed"
    truncated.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    text = tmp_path / "notes.honed"
    text.write_text("hello")
    model = honed.Module(TinyMLP().eval(), "tiny")
    with pytest.raises(honed.ArtifactError, match="not a readable honed artifact"):
        honed.load(model, truncated)
    with pytest.raises(honed.ArtifactError, match="not a readable honed artifact"):
        honed.load(model, text)
    with pytest.raises(honed.ArtifactError, match="does not exist"):
        honed.load(model, tmp_path / "missing.honed")


def test_artifact_for_another_model_is_refused(saved: Path) -> None:
    other_name = honed.Module(TinyMLP().eval(), "other")
    with pytest.raises(honed.ArtifactError, match="holds module 'tiny'"):
        honed.load(other_name, saved)
    other_shape = honed.Module(TinyMLP(dim=8).eval(), "tiny")
    with pytest.raises(honed.ArtifactError, match="do not fit module 'tiny'"):
        honed.load(other_shape, saved)


def test_save_writes_nothing_partial(tmp_path: Path) -> None:
    with pytest.raises(honed.InputError, match=r"no honed\.Module"):
        honed.save(TinyMLP(), tmp_path / "x.honed")
    assert list(tmp_path.iterdir()) == []


def test_on_incompatible_must_be_known(saved: Path) -> None:
    model = honed.Module(TinyMLP().eval(), "tiny")
    with pytest.raises(honed.InputError, match="on_incompatible"):
        honed.load(model, saved, on_incompatible="ignore")


def _with_environment(src: Path, dst: Path, **changes: object) -> Path:
    """A copy of ``src`` whose manifest claims another environment (entries untouched)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename == "manifest.json":
                manifest = json.loads(data)
                manifest["environment"].update(changes)
                data = json.dumps(manifest).encode()
            zout.writestr(info, data)
    return dst


@pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a CUDA artifact on a CPU host")
def test_artifact_for_another_gpu_errors_or_falls_back(saved: Path, tmp_path: Path) -> None:
    foreign = _with_environment(
        saved,
        tmp_path / "gpu.honed",
        device="cuda:0",
        gpu="NVIDIA H100 80GB HBM3",
        compute_capability="9.0",
    )
    x = batches(4, seed=8)[0]
    model = honed.Module(TinyMLP().eval(), "tiny")
    with pytest.raises(honed.IncompatibleArtifactError, match=r"NVIDIA H100.*on_incompatible"):
        honed.load(model, foreign)
    honed.load(model, foreign, on_incompatible="eager")
    assert not model.is_tuned  # weights loaded, graphs left eager
    eager_out = model(x)
    honed.load(model, foreign, on_incompatible="rebuild")
    assert model.is_tuned
    torch.testing.assert_close(model(x), eager_out)


def test_save_to_a_directory_is_an_input_error(
    inductor_tuned: honed.Module, tmp_path: Path
) -> None:
    with pytest.raises(honed.InputError, match="is a directory"):
        honed.save(inductor_tuned, tmp_path)


def test_a_large_sample_of_static_shapes_keeps_its_leading_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No batch axis in the profile: the leading axis of the inputs as long as the first one's is
    cut to what fits, and the stored metadata says how a reader restores it."""
    from honed.artifact import _encode_sample, _stored_sample
    from honed.backend.base import Sample
    from honed.pipeline.sweep import resize_sample

    profile = types.SimpleNamespace(batch_axes=[-1, -1, -1])  # what _stored_sample reads
    x, mask, scale = torch.randn(6, 4), torch.ones(6, 3), torch.randn(5)
    sample = Sample((x, mask), {"scale": scale})
    per_item = (4 + 3) * 4
    monkeypatch.setattr(honed.artifact, "SAMPLE_MAX_BYTES", 2 * per_item + 5 * 4)
    stored, repeat = _stored_sample(sample, profile)  # type: ignore[arg-type]
    assert repeat == (6, [0, 0, -1])
    assert stored.args[0].shape == (2, 4) and stored.args[1].shape == (2, 3)
    assert torch.equal(stored.kwargs["scale"], scale)
    meta, _ = _encode_sample(stored, repeat)
    assert json.loads(meta)["batch"] == 6 and json.loads(meta)["batch_axes"] == [0, 0, -1]
    restored = resize_sample(stored, repeat[1], repeat[0])
    assert torch.equal(restored.args[0], x[[0, 1, 0, 1, 0, 1]])
    monkeypatch.setattr(honed.artifact, "SAMPLE_MAX_BYTES", 10**6)
    assert _stored_sample(sample, profile) == (sample, None)  # type: ignore[arg-type]

"""tests/test_trust.py: signed artifacts, trusted keys, native code refused before it runs."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
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

# A TinyMLP graph over batch sizes 1..8, as honed.tune records it.
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
CALLING = {
    "format": 1,
    "num_leaves": 1,
    "tensor_positions": [0],
    "guards": [
        {"dtype": "float32", "device": "cpu", "lo": [1, 16], "hi": [8, 16], "groups": ["", ""]}
    ],
    "constants": [],
    "in_spec": None,
}
EVIL_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void honed_test_marker(void) {
  const char* path = getenv("HONED_TEST_MARKER");
  if (path) { FILE* f = fopen(path, "w"); if (f) { fputs("ran\n", f); fclose(f); } }
}
"""


@pytest.fixture(scope="module")
def evil_package(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """An AOTInductor .pt2 whose .so has a constructor that writes $HONED_TEST_MARKER."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler to build the test library")
    tmp = tmp_path_factory.mktemp("evil")
    (tmp / "evil.c").write_text(EVIL_C)
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", tmp / "evil.so", tmp / "evil.c"], check=True
    )
    pt2 = tmp / "model.pt2"
    with zipfile.ZipFile(pt2, "w") as z:
        z.writestr("model/.data/version", "1")
        z.write(tmp / "evil.so", "model/data/aotinductor/model/evil.so")
        # Older AOTInductor loaders find the metadata beside the package's .cpp, not its .so.
        z.writestr("model/data/aotinductor/model/evil.cpp", "/* the source a package carries */\n")
        z.writestr("model/data/aotinductor/model/evil_metadata.json", '{"AOTI_DEVICE_KEY": "cpu"}')
    return pt2.read_bytes()


def _aot_artifact(path: Path, package: bytes, key: str = "") -> Path:
    """A TinyMLP artifact whose one graph is an AOTInductor payload holding ``package``."""
    graph = _core.ManifestGraph()
    graph.profile = _core.GraphProfile.from_json(json.dumps(PROFILE))
    graph.backend = honed.backend.TorchInductorAotBackend().recipe()
    graph.runnable_from_cpp = True
    graph.payload = {
        "model.pt2": "payloads/tiny/0/model.pt2",
        "calling.json": "payloads/tiny/0/calling.json",
    }
    module = _core.ManifestModule()
    module.name, module.weights, module.graphs = "tiny", "weights/tiny.safetensors", [graph]
    manifest = _core.Manifest()
    manifest.environment = honed.environment.fingerprint(torch.device("cpu"))
    manifest.modules = [module]
    entries = {
        "weights/tiny.safetensors": st_save(TinyMLP().state_dict()),
        "payloads/tiny/0/model.pt2": package,
        "payloads/tiny/0/calling.json": json.dumps(CALLING).encode(),
    }
    _core.write_artifact(str(path), manifest, entries, key)
    return path


LOAD_IN_CHILD = """
import honed, sys
sys.path.insert(0, {tests!r})
from conftest import TinyMLP
m = honed.Module(TinyMLP().eval(), 'tiny')
try:
    honed.load(m, {path!r}, trust_native_code={trust!r})
except honed.ArtifactError as e:
    print(type(e).__name__, e, file=sys.stderr)
    sys.exit(3)
"""

SAVE_IN_CHILD = """
import honed, sys
sys.path.insert(0, {tests!r})
from conftest import TinyMLP
print(honed.config.signing_key)
honed.save(honed.Module(TinyMLP(), 't'), {path!r})
"""


def _load_in_child(
    path: Path, marker: Path, trust_native_code: bool = False
) -> subprocess.CompletedProcess[str]:
    """honed.load in a fresh interpreter (the constructor would run there, not in pytest)."""
    script = LOAD_IN_CHILD.format(
        tests=str(Path(__file__).parent), path=str(path), trust=trust_native_code
    )
    env = {**os.environ, "HONED_TEST_MARKER": str(marker)}
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
    )


def _keygen(capsys: pytest.CaptureFixture[str] | None = None) -> str:
    assert main(["keygen"]) == 0
    return (honed.config.config_dir / "signing_key.pem").read_text()


def test_backends_declare_their_native_payloads() -> None:
    b = honed.backend
    assert b.TorchInductorAotBackend.native_payload and b.TorchInductorAotBackend.saves_payload
    assert b.TensorRTBackend.native_payload and b.TorchTensorRTAotBackend.native_payload
    assert b.ONNXRuntimeBackend.saves_payload and not b.ONNXRuntimeBackend.native_payload


@pytest.mark.integration  # new interpreters
def test_unsigned_native_code_is_refused_before_it_runs(
    evil_package: bytes, tmp_path: Path
) -> None:
    path = _aot_artifact(tmp_path / "evil.honed", evil_package)
    marker = tmp_path / "marker"
    done = _load_in_child(path, marker)
    assert done.returncode == 3, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith("UntrustedArtifactError honed.load:")
    assert "'payloads/tiny/0/model.pt2'" in line and "is unsigned" in line
    assert "honed trust PUBKEY" in line and "trust_native_code=True" in line
    assert not marker.exists()  # nothing of the package was written out or loaded
    # The explicit opt-in loads it: the constructor runs (the graph then fails and runs eager).
    done = _load_in_child(path, marker, trust_native_code=True)
    assert done.returncode == 0, done.stderr
    assert marker.exists(), done.stderr


@pytest.mark.integration  # new interpreters
def test_honed_run_refuses_unsigned_native_code_before_it_runs(
    evil_package: bytes, tmp_path: Path
) -> None:
    from test_runtime_cpp import HONED_RUN

    if not HONED_RUN.exists():
        pytest.skip("the C++ runtime is not built: run `make test-cpp` first")
    path = _aot_artifact(tmp_path / "evil.honed", evil_package)
    marker = tmp_path / "marker"
    env = {**os.environ, "HONED_TEST_MARKER": str(marker)}
    command = [str(HONED_RUN), str(path), "--iterations", "1"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2
    err = done.stderr.strip()
    assert "\n" not in err and "is unsigned" in err and "honed-run --trust-native-code" in err
    assert "'payloads/tiny/0/model.pt2'" in err
    assert not marker.exists()
    command.append("--trust-native-code")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2  # not a real package: it fails to load, after its code ran
    assert marker.exists(), done.stderr


@pytest.mark.integration  # new interpreters
def test_signed_by_an_unknown_key_then_trusted(
    evil_package: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stranger_private, stranger_public = _core.generate_signing_key()
    path = _aot_artifact(tmp_path / "signed.honed", evil_package, stranger_private)
    model = honed.Module(TinyMLP().eval(), "tiny")
    with pytest.raises(honed.UntrustedArtifactError) as e:
        honed.load(model, path)
    kid = _core.key_id(stranger_public)
    assert f"signed by key {kid}, which is not trusted here" in str(e.value)
    (tmp_path / "stranger.pub").write_text(stranger_public)
    assert main(["trust", str(tmp_path / "stranger.pub")]) == 0
    assert main(["trust", "--list"]) == 0
    assert kid in capsys.readouterr().out
    marker = tmp_path / "marker"
    done = _load_in_child(path, marker)
    assert done.returncode == 0, done.stderr
    assert marker.exists(), done.stderr  # trusted: loaded like before signing existed


@pytest.mark.integration  # new interpreters
def test_replaced_library_with_recomputed_hashes_fails_the_signature(
    evil_package: bytes, tmp_path: Path
) -> None:
    key = _keygen()
    honest = _aot_artifact(tmp_path / "honest.honed", b"an honest package", key)
    forged = tmp_path / "forged.honed"
    with zipfile.ZipFile(honest) as zin:
        files = {n: zin.read(n) for n in zin.namelist()}
    manifest = json.loads(files["manifest.json"])
    files["payloads/tiny/0/model.pt2"] = evil_package
    manifest["entries"]["payloads/tiny/0/model.pt2"] = hashlib.sha256(evil_package).hexdigest()
    files["manifest.json"] = json.dumps(manifest, indent=2).encode()
    with zipfile.ZipFile(forged, "w") as zout:
        for name, data in files.items():
            zout.writestr(name, data)
    marker = tmp_path / "marker"
    done = _load_in_child(forged, marker)
    assert done.returncode == 3, done.stderr
    assert "does not match its manifest: it was modified after signing" in done.stderr
    assert not marker.exists()


def test_first_save_makes_the_users_key_and_signs_with_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module = honed.Module(TinyMLP().eval(), "tiny")
    private = honed.config.config_dir / "signing_key.pem"
    assert not private.exists()
    with caplog.at_level(logging.INFO, logger="honed"):
        honed.save(module, tmp_path / "a.honed")
        honed.save(module, tmp_path / "b.honed")
    told = [r for r in caplog.records if "made your signing key" in r.getMessage()]
    assert len(told) == 1
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    public = (honed.config.config_dir / "signing_key.pub").read_text()
    for name in ("a.honed", "b.honed"):
        artifact = _core.read_artifact(str(tmp_path / name))
        assert artifact.signer == _core.key_id(public)
        assert artifact.trust(honed.trust.trusted_public_keys()) == ("trusted", artifact.signer)
    assert main(["keygen"]) == 2  # refuses to replace the key without --force


def test_save_where_no_key_can_be_made_saves_unsigned_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    locked = tmp_path / "not-a-folder"  # a file where the config folder's parent should be
    locked.write_text("")
    module = honed.Module(TinyMLP().eval(), "tiny")
    honed.artifact.trust._told_unsigned = False
    with honed.config.patch(config_dir=locked / "honed"), caplog.at_level(logging.WARNING):
        honed.save(module, tmp_path / "a.honed")
        honed.save(module, tmp_path / "b.honed")
    told = [r for r in caplog.records if "saved unsigned" in r.getMessage()]
    assert len(told) == 1 and "honed keygen" in told[0].getMessage()
    assert _core.read_artifact(str(tmp_path / "a.honed")).signer is None


@pytest.mark.integration  # new interpreters
def test_signing_key_comes_from_honed_signing_key(tmp_path: Path) -> None:
    private, public = _core.generate_signing_key()
    (tmp_path / "k.pem").write_text(private)
    env = {**os.environ, "HONED_SIGNING_KEY": str(tmp_path / "k.pem")}
    code = SAVE_IN_CHILD.format(tests=str(Path(__file__).parent), path=str(tmp_path / "t.honed"))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "k.pem")
    assert _core.read_artifact(str(tmp_path / "t.honed")).signer == _core.key_id(public)
    env["HONED_SIGNING_KEY"] = str(tmp_path / "missing.pem")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode != 0 and "HONED_SIGNING_KEY=" in done.stderr


def test_trust_refuses_what_is_not_a_public_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "junk.pub").write_text("not a key")
    assert main(["trust", str(tmp_path / "junk.pub")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is not an Ed25519 public key" in err
    private, _ = _core.generate_signing_key()
    (tmp_path / "private.pem").write_text(private)
    assert main(["trust", str(tmp_path / "private.pem")]) == 2  # a private key is not trusted


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_artifacts_honour_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        path = honed.save(honed.Module(TinyMLP().eval(), "tiny"), tmp_path / "m.honed")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["m.honed"]


# -- the tuning cache --------------------------------------------------------------------------
class Packed(Backend):
    """A payload backend (native, as far as honed knows) that counts builds and loads."""

    saves_payload = True
    builds: ClassVar[int] = 0
    loads: ClassVar[int] = 0

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        Packed.builds += 1
        return module

    def export_payload(self, fn: Callable[..., Any]) -> dict[str, bytes]:
        return {"blob.so": b"compiled code"}

    def load_payload(
        self, files: dict[str, bytes], module: torch.nn.Module, graph: Any
    ) -> Callable[..., Any]:
        assert files == {"blob.so": b"compiled code"}
        Packed.loads += 1
        return module


def _tune_packed() -> honed.TuneReport:
    torch.manual_seed(0)  # the same weights each time: the same cache keys
    model = honed.Module(TinyMLP().eval(), "m")
    timings = {"TorchEagerBackend": [3.0], "Packed": [1.0]}
    with honed.config.patch(injected_latencies=timings):
        return honed.tune(model, batches(2, 4), strategy=honed.MaxThroughputStrategy([Packed()]))


def test_cached_payloads_are_signed_and_a_tampered_one_is_evaluated_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    Packed.builds = Packed.loads = 0
    _tune_packed()
    assert (Packed.builds, Packed.loads) == (1, 0)
    (blob,) = Path(honed.config.cache_dir).rglob("blob.so")
    record = json.loads(blob.parent.with_suffix(".json").read_text())
    assert record["files_sha256"] == {"blob.so": hashlib.sha256(b"compiled code").hexdigest()}
    report = _tune_packed()
    assert (Packed.builds, Packed.loads) == (1, 1)  # from the cache: loaded, not built
    assert any(c.cached for g in report.graphs for c in g.candidates if c.name == "Packed")

    blob.write_bytes(b"replaced code")
    with caplog.at_level(logging.WARNING, logger="honed"):
        report = _tune_packed()
    assert any(
        "does not match its SHA-256; evaluating again" in r.getMessage() for r in caplog.records
    )
    assert Packed.builds == 2 and Packed.loads == 1
    assert not any(c.cached for g in report.graphs for c in g.candidates if c.name == "Packed")

    # Hashes recomputed by someone without the key: the signature fails.
    blob.write_bytes(b"replaced code")
    record = json.loads(blob.parent.with_suffix(".json").read_text())
    record["files_sha256"]["blob.so"] = hashlib.sha256(b"replaced code").hexdigest()
    blob.parent.with_suffix(".json").write_text(json.dumps(record))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="honed"):
        _tune_packed()
    assert any("signature does not verify" in r.getMessage() for r in caplog.records)
    assert Packed.builds == 3


def test_a_reused_payload_is_read_and_hashed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of MB beside a JIT program's calls: the check's verified bytes are the ones
    loaded, not read and hashed a second time."""
    from honed.pipeline.cache import TuneCache

    Packed.builds = Packed.loads = 0
    _tune_packed()
    reads: list[str] = []
    hashed: list[bytes] = []
    read, sha256 = TuneCache._read_files, honed.trust._sha256

    def counted_read(self: TuneCache, key: str, record: dict[str, Any]) -> Any:
        reads.append(key)
        return read(self, key, record)

    def counted_sha256(data: bytes) -> str:
        hashed.append(bytes(data))
        return sha256(data)

    monkeypatch.setattr(TuneCache, "_read_files", counted_read)
    monkeypatch.setattr(honed.trust, "_sha256", counted_sha256)
    _tune_packed()
    assert (Packed.builds, Packed.loads) == (1, 1)
    assert len(reads) == 1 and hashed == [b"compiled code"]


def test_a_payload_hashed_in_pieces_has_its_whole_sha256(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(honed.trust, "_HASH_PIECE_BYTES", 7)
    for data in (b"", b"abc", bytes(range(256)) * 3):
        assert honed.trust._sha256(data) == hashlib.sha256(data).hexdigest()


def test_payloads_cached_before_the_first_save_are_reused_after_it() -> None:
    """The first honed.save makes the user's signing key; entries the tune cached before it were
    signed with the per-user cache key and stay this user's own."""
    assert honed.trust.signing_key() is None  # a fresh user: the cache key signs
    Packed.builds = Packed.loads = 0
    _tune_packed()
    honed.trust.key_for_save()  # what the first honed.save does
    assert honed.trust.signing_key() is not None
    report = _tune_packed()
    assert (Packed.builds, Packed.loads) == (1, 1)  # loaded from the cache, not built again
    assert any(c.cached for g in report.graphs for c in g.candidates if c.name == "Packed")


def test_a_cache_folder_others_can_write_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    Packed.builds = 0
    with honed.config.patch(cache_dir=shared), caplog.at_level(logging.WARNING, logger="honed"):
        report = _tune_packed()
        _tune_packed()
    assert report.selected() == ["Packed"]  # the tune went on
    assert Packed.builds == 2  # nothing was cached
    assert list(shared.iterdir()) == []
    warnings = [r.getMessage() for r in caplog.records if "tuning cache is off" in r.getMessage()]
    assert len(warnings) == 2  # one per tune
    assert f"chmod go-w {shared}" in warnings[0]


def test_a_cache_folder_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)
    problem = honed.trust.folder_problem(tmp_path)
    assert "belongs to another user" in problem and "HONED_CACHE_DIR" in problem


BENCH_ENTRY = """
import sys
sys.path.insert(0, {tests!r})
from conftest import TinyMLP, batches

def build():
    return TinyMLP().eval(), batches(4)
"""


@pytest.mark.integration  # new interpreters
def test_honed_bench_refuses_unsigned_native_code_unless_told_to_trust_it(
    evil_package: bytes, tmp_path: Path
) -> None:
    path = _aot_artifact(tmp_path / "evil.honed", evil_package)
    (tmp_path / "entries.py").write_text(BENCH_ENTRY.format(tests=str(Path(__file__).parent)))
    marker = tmp_path / "marker"
    honed_cli = Path(sys.executable).with_name("honed")
    command = [str(honed_cli), "bench", str(path), "--entry", str(tmp_path / "entries.py:build")]
    env = {**os.environ, "HONED_TEST_MARKER": str(marker), "HONED_ISOLATION": "none"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "is unsigned" in err[0], done.stderr
    assert not marker.exists()
    done = subprocess.run(
        [*command, "--trust-native-code"], env=env, capture_output=True, text=True, timeout=600
    )
    assert marker.exists(), done.stderr  # told to trust it: the package's code ran


def test_the_keys_a_payload_is_checked_against_follow_their_files(tmp_path: Path) -> None:
    """The trusted key ids are kept between payload checks (deriving them costs OpenSSL tens of
    ms), yet a key trusted, untrusted or made since counts at the next check."""
    files = {"blob.so": b"compiled code"}
    hashes = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    other_private, other_public = _core.generate_signing_key()
    record = {
        "files_sha256": hashes,
        "files_signature": {
            "public_key": _core.public_key_of(other_private),
            "ed25519": _core.sign(other_private, honed.trust._payload_digest("k", hashes)).hex(),
        },
    }
    assert "which is not trusted here" in honed.trust.payload_problem("k", record, files)
    pub = tmp_path / "other.pub"
    pub.write_text(other_public)
    other_id = honed.trust.trust(pub)
    assert other_id in honed.trust.known_key_ids()
    assert honed.trust.payload_problem("k", record, files) == ""
    (trusted_file,) = [p for i, p in honed.trust.trusted() if i == other_id]
    trusted_file.unlink()
    assert "which is not trusted here" in honed.trust.payload_problem("k", record, files)
    # the per-user cache key, made after the set was first read, signs payloads trusted here
    own = honed.trust.sign_payload("k", files)
    assert honed.trust.payload_problem("k", own, files) == ""

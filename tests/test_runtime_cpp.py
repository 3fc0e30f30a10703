"""tests/test_runtime_cpp.py: the C++ runtime runs what Python tuned and saved, with its outputs.

One AOTInductor tune of a small MLP (batch axis 1..8) is shared by every test: saved once, then
run by ``honed-run --check``, by the GoogleTest suite of cpp/runtime and by the example program
of examples/cpp, whose outputs are compared value by value with Python's. The C++ build is
``make test-cpp``'s (build/cpp); HONED_TEST_CPP_BUILD names another build folder and
HONED_TEST_DEVICE=cuda runs everything on CUDA (scripts/gpu-test.sh runtime).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import honed

from conftest import TinyMLP, batches

ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("HONED_TEST_CPP_BUILD", ROOT / "build" / "cpp")).resolve()
RUNTIME = BUILD / "cpp" / "runtime"
HONED_RUN = RUNTIME / "honed-run"
DEVICE = os.environ.get("HONED_TEST_DEVICE", "cpu")

pytestmark = [
    pytest.mark.integration,  # builds and runs the C++ runtime on tuned artifacts
    pytest.mark.skipif(
        not HONED_RUN.exists(),
        reason=f"the C++ runtime is not built in {BUILD}: run `make test-cpp` first",
    ),
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs CUDA"),
]


def _tune(module: honed.Module) -> honed.TuneReport:
    module.to(DEVICE)
    data = [x.to(DEVICE) for x in batches(1, 4, 8, seed=3)]
    with honed.config.patch(cache_enabled=False):
        return honed.tune(
            module,
            data,
            backends=[honed.backend.TorchInductorAotBackend()],
            target="cpp",
            device=DEVICE,
        )


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config folder ($XDG_CONFIG_HOME) whose key signs the saved artifact and is trusted."""
    root = tmp_path_factory.mktemp("keys")
    with honed.config.patch(config_dir=root / "honed", signing_key=""):
        honed.trust.keygen()
    return root


@pytest.fixture(autouse=True)
def private_config(keys: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every process here trusts the key that signed the saved artifact (docs/trust.md)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(keys))
    monkeypatch.delenv("HONED_SIGNING_KEY", raising=False)
    with honed.config.patch(config_dir=keys / "honed", signing_key=""):
        yield keys / "honed"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, keys: Path) -> tuple[honed.TuneReport, Path]:
    torch.manual_seed(0)
    module = honed.Module(TinyMLP().eval(), "tiny")
    with honed.config.patch(
        isolation="none", warmup_ms=2.0, warmup_calls=2, window_ms=2.0, window_calls=3
    ):
        report = _tune(module)
    with honed.config.patch(config_dir=keys / "honed", signing_key=""):
        path = honed.save(module, tmp_path_factory.mktemp("runtime") / "tiny.honed")
    return report, path


def _run(
    *args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def _python_outputs(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored sample and what honed.load-ed Python returns for it."""
    module = honed.Module(TinyMLP().eval(), "tiny").to(DEVICE)
    honed.load(module, path)
    artifact = honed.artifact.open_artifact(path)
    graph = artifact.manifest.modules[0].graphs[0]
    sample = honed.artifact._decode_sample(artifact, graph.samples, torch.device(DEVICE))
    with torch.no_grad():
        return sample.args[0], module(*sample.args).cpu()


def test_target_cpp_is_in_the_report_and_the_manifest(
    tuned: tuple[honed.TuneReport, Path],
) -> None:
    report, path = tuned
    assert report.target == "cpp"
    assert report.selected() == ["TorchInductorAotBackend"]
    assert "target cpp" in report.graphs[0].decision
    assert "target cpp" in report.to_markdown()
    manifest, _ = honed.artifact.read_artifact(path)
    graph = manifest["modules"][0]["graphs"][0]
    assert graph["runnable_from_cpp"] is True
    assert graph["outputs"] and graph["samples"]


def test_target_cpp_refuses_backends_the_runtime_cannot_run() -> None:
    module = honed.Module(TinyMLP().eval(), "tiny")
    with pytest.raises(honed.InputError, match=r"target='cpp'.*TorchInductorAotBackend"):
        honed.tune(module, batches(2), backends=[honed.backend.TorchEagerBackend()], target="cpp")
    with pytest.raises(honed.InputError, match="target must be one of"):
        honed.tune(module, batches(2), target="rust")


def test_honed_run_checks_and_benchmarks(
    tuned: tuple[honed.TuneReport, Path], tmp_path: Path
) -> None:
    _, path = tuned
    out = tmp_path / "bench.json"
    done = _run(
        HONED_RUN, path, "--device", DEVICE, "--check", "--batch", "4", "--warmup-ms", "5",
        "--iterations", "50", "--percentiles", "50,99.9", "--json", out,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"check +graph 0: ok", done.stdout), done.stdout
    assert "throughput" in done.stdout and "p99" in done.stdout
    result = json.loads(out.read_text())
    assert result["check"]["ok"] is True
    assert result["check"]["graphs"][0]["max_abs_error"] < 1e-3
    assert result["calls"] == 50 and result["batch_size"] == 4
    assert result["device"] in (DEVICE, f"{DEVICE}:0")
    assert 0 < result["load_s"] < 30
    lat = result["latency"]
    assert 0 < lat["median_ms"] <= lat["p99_ms"] and lat["cv"] >= 0
    assert set(lat["percentiles_ms"]) == {"p50", "p99.9"}
    assert result["throughput"] > 0


def test_honed_run_checks_a_bf16_graph_with_the_tolerance_its_tune_used(
    keys: Path, tmp_path: Path
) -> None:
    """A graph with bf16 weights returns float32 outputs: the tune's check held them to honed's
    reduced-precision tolerance, the artifact records it, and honed-run --check applies it
    rather than fp32's (which such a graph fails). Its bf16 constants come from the stored fp32
    weights, cast at load."""
    from honed.pipeline.correctness import REDUCED

    torch.manual_seed(0)
    module = honed.Module(TinyMLP().eval(), "tiny").to(DEVICE)
    data = [x.to(DEVICE) for x in batches(4, 4, seed=3)]
    bf16 = honed.backend.TorchInductorAotBackend(
        honed.backend.TorchInductorAotBackendConfig(precision="bf16")
    )
    with honed.config.patch(
        isolation="none", cache_enabled=False, warmup_ms=2.0, warmup_calls=2, window_ms=2.0,
        window_calls=3,
    ):  # fmt: skip
        honed.tune(module, data, backends=[bf16], target="cpp", device=DEVICE)
    assert module.is_tuned
    with honed.config.patch(config_dir=keys / "honed", signing_key=""):
        path = honed.save(module, tmp_path / "bf16.honed")
    graph = honed.artifact.open_artifact(path).manifest.modules[0].graphs[0]
    # The bf16 constants are the module's weights cast: read from its weights, not stored twice.
    assert "constants.safetensors" not in graph.payload, graph.payload
    assert graph.figures["check_tolerance"] == {
        "atol": REDUCED.atol, "rtol": REDUCED.rtol, "min_cosine": REDUCED.min_cosine,
    }  # fmt: skip
    done = _run(HONED_RUN, path, "--device", DEVICE, "--check", "--iterations", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"check +graph 0: ok", done.stdout), done.stdout
    done = _run(HONED_RUN, path, "--device", DEVICE, "--check", "--iterations", "1",
                "--atol", "1e-4", "--rtol", "1e-3")  # fmt: skip
    assert done.returncode == 1 and "MISMATCH" in done.stdout, done.stdout + done.stderr


def test_honed_run_threads_and_adaptive_protocol(tuned: tuple[honed.TuneReport, Path]) -> None:
    _, path = tuned
    done = _run(HONED_RUN, path, "--device", DEVICE, "--threads", "3", "--duration-s", "0.2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on 3 thread(s)" in done.stdout
    done = _run(HONED_RUN, path, "--device", DEVICE, "--warmup-ms", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"calls on 1 thread\(s\), [^,]+, (stable|UNSTABLE)", done.stdout)


def test_honed_run_refuses_inputs_outside_every_profile(
    tuned: tuple[honed.TuneReport, Path],
) -> None:
    _, path = tuned
    done = _run(HONED_RUN, path, "--device", DEVICE, "--shapes", "64x16", "--iterations", "1")
    assert done.returncode == 2
    assert "no tuned graph takes inputs (float32[64, 16])" in done.stderr
    assert "Stored profiles: graph 0" in done.stderr and "1..8" in done.stderr


def _rewrite(
    src: Path, dst: Path, entry_suffix: str, change: Callable[[bytes], bytes], rehash: bool
) -> Path:
    """A copy of ``src`` whose entry ending in ``entry_suffix`` is changed by ``change``."""
    import hashlib

    with zipfile.ZipFile(src) as zin:
        files = {i.filename: zin.read(i.filename) for i in zin.infolist()}
    manifest = json.loads(files["manifest.json"])
    for name in files:
        if name.endswith(entry_suffix):
            files[name] = change(files[name])
            if rehash:
                manifest["entries"][name] = hashlib.sha256(files[name]).hexdigest()
    files["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for name, data in files.items():
            zout.writestr(name, data)
    return dst


def test_honed_run_refuses_a_tampered_artifact_and_fails_a_wrong_reference(
    tuned: tuple[honed.TuneReport, Path], tmp_path: Path
) -> None:
    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    _, path = tuned
    flipped = _rewrite(
        path, tmp_path / "t.honed", "model.pt2", lambda b: b[:-9] + b"x" + b[-8:], rehash=False
    )
    done = _run(HONED_RUN, flipped, "--device", DEVICE, "--check")
    assert done.returncode == 2
    assert "model.pt2' of" in done.stderr and "SHA-256" in done.stderr

    def wrong(data: bytes) -> bytes:
        return st_save({k: v + 1 for k, v in st_load(data).items()})

    # Rewritten with recomputed hashes, the manifest no longer matches its signature: this
    # (deliberately wrong) reference loads only when trusted explicitly.
    bad_ref = _rewrite(path, tmp_path / "r.honed", ".outputs.safetensors", wrong, rehash=True)
    done = _run(HONED_RUN, bad_ref, "--device", DEVICE, "--check", "--iterations", "1")
    assert done.returncode == 2 and "modified after signing" in done.stderr, done.stderr
    done = _run(
        HONED_RUN, bad_ref, "--device", DEVICE, "--check", "--iterations", "1",
        "--trust-native-code",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MISMATCH" in done.stdout


def test_honed_run_gives_the_packages_the_module_weights(
    tuned: tuple[honed.TuneReport, Path], tmp_path: Path
) -> None:
    """The weights are stored once: the packages take them from the module's weights entry."""
    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    _, path = tuned
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        weights = st_load(z.read("weights/tiny.safetensors"))
        packages = [z.read(n) for n in names if n.endswith("model.pt2")]
    assert any(n.endswith("/constants.json") for n in names), names
    assert packages and all(weights["fc1.weight"].numpy().tobytes() not in p for p in packages)
    done = _run(HONED_RUN, path, "--device", DEVICE, "--iterations", "1", "--json", tmp_path / "r")
    assert done.returncode == 0, done.stderr
    phases = [p["phase"] for p in json.loads((tmp_path / "r").read_text())["load_phases"]]
    assert "give the packages their constants from the weights" in phases

    def shifted(data: bytes) -> bytes:
        return st_save({k: v + 1 for k, v in st_load(data).items()})

    moved = _rewrite(path, tmp_path / "w.honed", "tiny.safetensors", shifted, rehash=True)
    done = _run(HONED_RUN, moved, "--device", DEVICE, "--check", "--iterations", "1",
                "--trust-native-code")  # fmt: skip
    assert done.returncode == 1 and "MISMATCH" in done.stdout, done.stdout + done.stderr

    def dropped(data: bytes) -> bytes:
        return st_save({k: v for k, v in st_load(data).items() if k != "fc1.weight"})

    short = _rewrite(path, tmp_path / "d.honed", "tiny.safetensors", dropped, rehash=True)
    done = _run(HONED_RUN, short, "--device", DEVICE, "--check", "--trust-native-code")
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        "package constant 'inner.fc1.weight' is stored as 'fc1.weight' in the weights, which "
        "holds no such tensor" in done.stderr
    ), done.stderr


def test_a_large_sample_is_stored_as_its_first_items_and_checked_at_its_batch(
    tuned: tuple[honed.TuneReport, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above honed.artifact.SAMPLE_MAX_BYTES only the first items of a sample are stored; both
    readers repeat them up to the batch eager's stored outputs were computed at."""
    from safetensors import safe_open

    _, path = tuned
    module = honed.Module(TinyMLP().eval(), "tiny").to(DEVICE)
    honed.load(module, path)
    whole, _ = _python_outputs(path)
    monkeypatch.setattr(honed.artifact, "SAMPLE_MAX_BYTES", 1)  # room for one item only
    small = honed.save(module, tmp_path / "small.honed")
    manifest, entries = honed.artifact.read_artifact(small)
    graph = manifest["modules"][0]["graphs"][0]
    stored = tmp_path / "sample.safetensors"
    stored.write_bytes(entries[graph["samples"]])
    with safe_open(str(stored), "pt") as f:
        assert f.get_tensor("leaf0").shape[0] == 1
        assert json.loads(f.metadata()["treespec"])["batch"] == whole.shape[0]
    inputs, outputs = _python_outputs(small)
    assert inputs.shape == whole.shape and bool((inputs == inputs[:1]).all())
    torch.testing.assert_close(outputs, outputs[:1].expand_as(outputs))  # one item, repeated
    done = _run(HONED_RUN, small, "--device", DEVICE, "--check", "--iterations", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"check +graph 0: ok", done.stdout), done.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch", "0"], "--batch 0: must be a positive integer"),
        (["--batch", "-3"], "--batch -3: must be a positive integer"),
        (["--shapes", "abc"], "--shapes 'abc': expected one shape per tensor input"),
        (["--shapes", "8x"], "sizes joined by 'x'"),
        (["--rtol", "-1"], "--rtol -1: must be a finite number >= 0"),
        (["--atol", "nan"], "--atol nan: must be a finite number >= 0"),
        (["--percentiles", "50,abc"], "--percentiles '50,abc': expected numbers in [0, 100]"),
        (["--device", "quantum"], "--device 'quantum': not a device; use cpu, cuda or cuda:N"),
        (
            ["--json", "/nonexistent-folder/r.json"],
            "--json /nonexistent-folder/r.json: cannot write",
        ),
        (["--no-such-flag"], "see honed-run --help"),
    ],
)
def test_honed_run_refuses_bad_flags_before_running(
    tuned: tuple[honed.TuneReport, Path], flags: list[str], message: str
) -> None:
    _, path = tuned
    done = _run(HONED_RUN, path, "--iterations", "1", *flags)
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.strip()
    assert "\n" not in err and err.startswith("honed-run: ") and message in err, err
    assert done.stdout == ""  # nothing was loaded or run


def test_honed_run_warms_every_batch_size_of_the_profile_at_load(
    tuned: tuple[honed.TuneReport, Path],
) -> None:
    _, path = tuned
    p = honed.artifact.open_artifact(path).manifest.modules[0].graphs[0].profile
    sizes = sorted({p.min_batch, p.opt_batch, p.max_batch})
    assert sizes[0] == 1 and sizes[-1] == 8
    done = _run(HONED_RUN, path, "--device", DEVICE, "--iterations", "1")
    assert done.returncode == 0, done.stderr
    warmed = ", ".join(f"0:{b}" for b in sizes)
    assert f"(warm-up, graph:batch: {warmed})" in done.stdout, done.stdout


def test_honed_run_says_where_the_load_time_went_and_how_calls_run(
    tuned: tuple[honed.TuneReport, Path], tmp_path: Path
) -> None:
    _, path = tuned
    out = tmp_path / "r.json"
    done = _run(HONED_RUN, path, "--device", DEVICE, "--iterations", "2", "--json", out)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    phases = [p["phase"] for p in report["load_phases"]]
    assert phases[0] == "read and verify the artifact" and phases[-1].startswith("warm up")
    assert "write the packages' library and kernel files" in phases
    assert sum(p["seconds"] for p in report["load_phases"]) <= report["load_s"]
    assert f"read and verify the artifact {report['load_phases'][0]['seconds']:.3f}" in done.stdout
    if DEVICE == "cpu":
        assert report["cuda_graphs"] == "off: the model runs on the CPU"
        assert "cuda graphs off: the model runs on the CPU" in done.stdout
        return
    # On CUDA: one graph per batch size warmed at load, e.g. "0:1x16 0:8x16".
    assert report["cuda_graphs"] == "on", report["cuda_graphs"]
    p = honed.artifact.open_artifact(path).manifest.modules[0].graphs[0].profile
    shapes = " ".join(f"0:{b}x16" for b in sorted({p.min_batch, p.opt_batch, p.max_batch}))
    assert f"cuda graphs on, captured (graph:shapes): {shapes}" in done.stdout, done.stdout
    plain = _run(HONED_RUN, path, "--device", DEVICE, "--iterations", "2", "--check",
                 "--no-cuda-graphs")  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert "cuda graphs off: ModelOptions::cuda_graphs is false" in plain.stdout


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="HONED_TEST_DEVICE=cuda runs it")
def test_cuda_graph_replays_match_eager_at_every_batch_size(
    tuned: tuple[honed.TuneReport, Path], tmp_path: Path
) -> None:
    """honed-run --check through CUDA graphs at batch sizes captured at load and on first call."""
    _, path = tuned
    for batch in (1, 3, 8):
        done = _run(HONED_RUN, path, "--device", DEVICE, "--batch", str(batch), "--check",
                    "--iterations", "5")  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"0:{batch}x16" in done.stdout, done.stdout
        assert "cannot be captured" not in done.stderr, done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_honed_run_without_cuda_says_so_in_one_line(tuned: tuple[honed.TuneReport, Path]) -> None:
    _, path = tuned
    done = _run(HONED_RUN, path, "--device", "cuda", "--iterations", "1")
    assert done.returncode == 2
    err = done.stderr.strip()
    assert "\n" not in err and "torch cannot use CUDA here" in err, err


def test_honed_run_refuses_a_flipped_byte_in_the_manifest(
    tuned: tuple[honed.TuneReport, Path], tmp_path: Path
) -> None:
    _, path = tuned
    data = path.read_bytes()
    at = data.index(b'"honed_version": "') + len(b'"honed_version": "')
    flipped = tmp_path / "flipped.honed"
    flipped.write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :])
    done = _run(HONED_RUN, flipped, "--device", DEVICE, "--iterations", "1")
    assert done.returncode == 2
    assert "'manifest.json'" in done.stderr and "CRC" in done.stderr, done.stderr


def test_honed_run_loads_native_code_only_when_trusted(
    tuned: tuple[honed.TuneReport, Path], tmp_path: Path
) -> None:
    _, path = tuned
    stranger = {"XDG_CONFIG_HOME": str(tmp_path)}  # trusts no key
    done = _run(HONED_RUN, path, "--device", DEVICE, "--iterations", "1", env=stranger)
    assert done.returncode == 2
    err = done.stderr.strip()
    assert "\n" not in err and "which is not trusted here" in err
    assert "honed trust PUBKEY" in err and "honed-run --trust-native-code" in err
    done = _run(
        HONED_RUN, path, "--device", DEVICE, "--iterations", "1", "--trust-native-code",
        env=stranger,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_runtime_gtest_suite(tuned: tuple[honed.TuneReport, Path]) -> None:
    """Every RuntimeModel test on the artifact; on CUDA also every CudaGraphsTest, none skipped."""
    _, path = tuned
    env = {"HONED_TEST_ARTIFACT": str(path), "HONED_TEST_DEVICE": DEVICE}
    suites, count = ("*", 15) if DEVICE == "cuda" else ("RuntimeModel.*", 10)
    done = _run(RUNTIME / "honed_runtime_tests", f"--gtest_filter={suites}", env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"[  PASSED  ] {count} tests" in done.stdout and "SKIPPED" not in done.stdout, (
        done.stdout[-4000:]
    )


def _doc_blocks() -> list[str]:
    """The command blocks of README.md and docs/cpp.md marked as run here, in order."""
    marker = r"<!--\s*run-by: tests/test_runtime_cpp.py\s*-->\s*\n```bash\n(.*?)```"
    found = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "cpp.md"):
        found += re.findall(marker, doc.read_text(), re.S)
    return found


@pytest.fixture(scope="module")
def example(
    tuned: tuple[honed.TuneReport, Path], tmp_path_factory: pytest.TempPathFactory, keys: Path
) -> Path:
    """Runs the docs' command blocks line by line in one folder holding the saved model as
    model.honed (so honed-run and the example's cmake commands are the documented ones), and
    returns the example program they built."""
    _, path = tuned
    work = tmp_path_factory.mktemp("docs")
    (work / "model.honed").write_bytes(path.read_bytes())
    env = {
        **os.environ,
        "PATH": f"{RUNTIME}:{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
        "XDG_CONFIG_HOME": str(keys),
    }
    blocks = _doc_blocks()
    assert len(blocks) >= 3
    for block in blocks:
        for line in block.splitlines():
            if not shlex.split(line, comments=True):
                continue
            run = (
                line.replace("--device cpu", f"--device {DEVICE}")
                .replace("model.honed cpu", f"model.honed {DEVICE}")
                .replace("$PWD/build/cpp", str(BUILD))
                .replace("examples/cpp", str(ROOT / "examples" / "cpp"))
            )
            done = subprocess.run(
                ["bash", "-c", run], cwd=work, env=env, capture_output=True, text=True
            )
            assert done.returncode == 0, f"docs: {line}\n{done.stdout}\n{done.stderr}"
    assert json.loads((work / "bench.json").read_text())["check"]["ok"] is True
    return work / "build" / "example" / "honed_example"


def test_example_program_matches_python(
    tuned: tuple[honed.TuneReport, Path], example: Path, tmp_path: Path
) -> None:
    _, path = tuned
    out = tmp_path / "outputs.json"
    done = _run(example, path, DEVICE, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded tiny in" in done.stdout
    cpp = json.loads(out.read_text())
    x, python = _python_outputs(path)
    assert len(cpp) == 1 and cpp[0]["shape"] == list(python.shape)
    values = torch.tensor(cpp[0]["values"], dtype=torch.float64).reshape(python.shape)
    # Same package, same inputs: the same kernels ran, so the values agree to float32 rounding.
    torch.testing.assert_close(values, python.double(), rtol=1e-6, atol=1e-6)
    assert x.shape[1] == 16


def test_the_docs_cpp_fragment_is_the_examples_and_runs(example: Path) -> None:
    """docs/cpp.md's C++ block is compiled as part of examples/cpp and run on the saved model."""
    text = (ROOT / "docs" / "cpp.md").read_text()
    blocks = re.findall(r"```cpp\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    source = (ROOT / "examples" / "cpp" / "main.cpp").read_text()
    for line in blocks[0].splitlines():
        assert line.strip() in source, f"docs/cpp.md line not in examples/cpp/main.cpp: {line}"
    if DEVICE != "cpu":
        pytest.skip("the fragment loads on CPU; this artifact was saved on CUDA")
    done = _run(example, "--docs-fragment", cwd=example.parent.parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "docs fragment: output 0: [8, 4]" in done.stdout

"""tests/test_bench_suite.py: the benchmark suite on CPU: models, runner, report (no timings)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import honed

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402  (bench/ is a folder of scripts, put on sys.path above)
import suite  # noqa: E402
from models import SPECS  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- models ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SPECS))
def test_model_builds_and_runs_tiny(name: str) -> None:
    spec = SPECS[name]
    model = spec.build(tiny=True)
    x = spec.inputs(model, 2, torch.device("cpu"))
    with torch.no_grad():
        y = model(x)
    assert y.shape[0] == 2 and torch.isfinite(y).all()
    assert not model.training
    if name == "gpt2":  # logits over the vocabulary at every position
        assert y.shape == (2, suite.SPECS["gpt2"].tiny["max_len"], spec.tiny["vocab"])


def test_models_real_sizes() -> None:
    """The full-size configs have the published parameter counts (built, never run here)."""
    millions = {
        name: sum(p.numel() for p in spec.build().parameters()) / 1e6
        for name, spec in SPECS.items()
        if name != "mlp"
    }
    assert millions["resnet50"] == pytest.approx(25.56, abs=0.01)
    assert millions["vit_b16"] == pytest.approx(86.57, abs=0.01)
    assert millions["bert"] == pytest.approx(109.48, abs=0.01)
    assert millions["gpt2"] == pytest.approx(124.44, abs=0.01)  # tied LM head


# -- the runner --------------------------------------------------------------------------------
@pytest.mark.slow
def test_suite_end_to_end_cpu(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    argv = ["--device", "cpu", "--tiny", "--models", "mlp", "--batches", "2", "--keep-caches"]
    argv += ["--max-autotune", "none", "--indep-rounds", "3", "--indep-block-ms", "1"]
    assert suite.main([*argv, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["schema"] == report.SCHEMA and data["finished"] is True
    env = data["env"]
    assert env["commit"] and env["torch"] == torch.__version__ and env["device"] == "cpu"
    assert data["args"]["candidates"] == "light" and data["args"]["isolation"] == "none"
    (row,) = data["rows"]
    assert row["model"] == "mlp" and row["batch"] == 2 and row["status"] == "ok"
    names = [c["name"] for c in row["candidates"]]
    assert names == ["TorchEagerBackend", "TorchInductorBackend"]
    assert row["candidates"][0]["is_baseline"]
    assert sum(c["selected"] for c in row["candidates"]) == 1
    for c in row["candidates"]:
        assert c["status"] == "ok" and c["precision"] == "fp32"
        assert c["median_ms"] > 0 and c["p99_ms"] >= c["median_ms"] and c["throughput"] > 0
        assert c["max_abs_error"] < 1e-4 and c["samples_ms"] and "p50" in c["percentiles_ms"]
    check = row["independent"]
    assert set(check["results"]) == set(names) and check["failures"] == {}
    assert check["selected"] == row["selected"] and check["best"] in names
    # every call is one sample: 3 rounds of calls_per_block calls each
    assert all(len(r["samples_ms"]) == 3 * r["calls_per_block"] for r in check["results"].values())
    assert check["selection_gap_pct"] >= 0.0
    assert row["tune_wall_s"] > 0 and row["row_wall_s"] >= row["tune_wall_s"]


def test_suite_budget_skips_rows_and_keeps_valid_json(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    argv = ["--device", "cpu", "--tiny", "--models", "mlp", "bert", "--batches", "1", "8"]
    assert suite.main([*argv, "--budget-s", "1e-9", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["finished"] is True
    assert [(r["model"], r["batch"], r["status"]) for r in data["rows"]] == [
        ("mlp", 1, "skipped"),
        ("mlp", 8, "skipped"),
        ("bert", 1, "skipped"),
        ("bert", 8, "skipped"),
    ]
    assert all("time budget" in r["reason"] for r in data["rows"])
    assert [m["status"] for m in data["max_autotune"]] == ["skipped", "skipped"]


def test_light_and_full_defaults() -> None:
    light = suite.parse_args(["--device", "cuda"])
    assert light.models == ["mlp", "bert", "resnet50"] and light.batches == [1, 64]
    assert light.candidates == "light" and light.isolation == "none" and light.budget_s > 0
    assert light.measure == {"max_windows": 6} or light.measure["max_windows"] <= 6
    full = suite.parse_args(["--device", "cuda", "--full"])
    assert full.models == list(SPECS) and full.batches == [1, 8, 64] and full.knee
    assert full.candidates == "default" and full.isolation == "process" and full.budget_s == 0
    names = [b.name for b in suite.light_candidates(torch.device("cuda"))]
    assert [suite.precision(n) for n in names] == ["fp32", "bf16", "fp32", "bf16"]
    assert not any("max-autotune" in n for n in names)


def test_commit_falls_back_to_env(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_git(*args: Any, **kwargs: Any) -> Any:
        raise OSError("git: not found")

    monkeypatch.setattr(suite.subprocess, "run", no_git)
    monkeypatch.setenv("HONED_COMMIT", "0123abcd")
    assert suite.commit() == "0123abcd"


def test_max_autotune_child_timeout_is_a_lower_bound() -> None:
    record = suite.max_autotune_time("mlp", 1, torch.device("cpu"), True, timeout_s=0.2)
    assert record["status"] == "timeout" and record["timeout_s"] == 0.2


def test_round_robin_rotates_and_counts() -> None:
    calls: list[str] = []

    def call(name: str) -> Callable[[], None]:
        return lambda: calls.append(name)

    fns: dict[str, Callable[[], Any]] = {n: call(n) for n in "abc"}
    with honed.config.patch(warmup_calls=1, warmup_ms=0.0):
        out = suite.round_robin(fns, torch.device("cpu"), 4, rounds=3, block_ms=1e-6)
    timed = calls[3:]  # after one warm-up call each, one call per block
    assert timed == list("abc") + list("bca") + list("cab")
    assert all(len(r["samples_ms"]) == 3 and r["calls_per_block"] == 1 for r in out.values())


# -- the report --------------------------------------------------------------------------------
def _cand(name: str, median: float, selected: bool = False, **kw: Any) -> dict[str, Any]:
    samples = [median * f for f in (0.9, 1.0, 1.0, 1.1, 1.5)]
    return {
        "name": name,
        "backend": name.split("(")[0],
        "precision": suite.precision(name),
        "status": kw.get("status", "ok"),
        "reason": kw.get("reason", ""),
        "is_baseline": name == "TorchEagerBackend",
        "selected": selected,
        "build_s": 1.0,
        "median_ms": median if kw.get("status", "ok") == "ok" else None,
        "p99_ms": median * 1.5,
        "throughput": 1000.0 / median,
        "cv": 0.1,
        "stable": True,
        "speedup": None,
        "max_abs_error": 1e-6,
        "max_rel_error": 1e-6,
        "cosine": 1.0,
        "percentiles_ms": {},
        "samples_ms": samples if kw.get("status", "ok") == "ok" else [],
    }


RO_BF16 = (
    "TorchInductorBackend(mode=reduce-overhead, autocast_enabled=True, autocast_dtype=bfloat16)"
)
CG = "CudaGraphsBackend"


def _row(model: str, batch: int, eager: float, sel: float, best: float, tune: float) -> Any:
    """A finished row: honed selected RO_BF16; the independent check found CG at ``best``."""
    results = {
        "TorchEagerBackend": {"median_ms": eager, "samples_ms": [eager]},
        RO_BF16: {"median_ms": sel, "samples_ms": [sel]},
        CG: {"median_ms": best, "samples_ms": [best]},
    }
    best_name = CG if best < sel else RO_BF16
    return {
        "model": model,
        "title": SPECS[model].title,
        "batch": batch,
        "params": 1_000_000,
        "status": "ok",
        "tune_wall_s": tune,
        "selected": RO_BF16,
        "decision": "fastest",
        "candidates": [
            _cand("TorchEagerBackend", eager),
            _cand(RO_BF16, sel, selected=True),
            _cand(CG, best),
            _cand("TorchInductorBackend(mode=max-autotune)", 1.0, status="rejected", reason="NaN"),
        ],
        "independent": {
            "results": results,
            "failures": {},
            "best": best_name,
            "selected": RO_BF16,
            "selection_gap_pct": (sel / min(sel, best) - 1) * 100,
            "eager": "TorchEagerBackend",
        },
    }


def _run(started: str, rows: list[Any], mat: list[Any], overhead: Any = None) -> dict[str, Any]:
    return {
        "schema": report.SCHEMA,
        "started": started,
        "finished": True,
        "elapsed_s": 100.0,
        "env": {
            "device": "cuda",
            "gpu": "NVIDIA H100 80GB HBM3",
            "driver": "580.0",
            "torch": "2.11.0+cu130",
            "torch_cuda": "13.0",
            "triton": "3.5.0",
            "honed": "0.1.0",
            "commit": "abc123",
        },
        "args": {"mode": "light", "candidates": "light", "isolation": "none"},
        "overhead": overhead,
        "knees": {},
        "rows": rows,
        "max_autotune": mat,
    }


@pytest.fixture
def fixture_runs(tmp_path: Path) -> list[Path]:
    """Two runs, merged: the second (--full) redoes mlp b1 (wins) and skips bert b64 (the first's
    stays).

    Speed-ups (independent eager / independent selection): mlp b1 8.0/2.0 = 4.0, bert b1
    2.0/2.0 = 1.0 -> geomean 2.0 (met); mlp b64 1.44, bert b64 1.0 -> 1.2 (not met).
    Selection gaps: bert b64 selects 10.0 ms where CUDA graphs take 9.5 -> +5.26 % (missed).
    """
    first = _run(
        "2026-01-01T00:00:00+00:00",
        [
            _row("mlp", 1, eager=9.0, sel=3.0, best=3.0, tune=10.0),
            _row("mlp", 64, eager=14.4, sel=10.0, best=10.0, tune=12.0),
            _row("bert", 1, eager=2.0, sel=2.0, best=2.0, tune=50.0),
            _row("bert", 64, eager=10.0, sel=10.0, best=9.5, tune=60.0),
        ],
        [
            {"model": "mlp", "batch": 1, "status": "ok", "compile_first_call_s": 20.0},
            {"model": "bert", "batch": 1, "status": "timeout", "timeout_s": 60.0},
        ],
        overhead={
            "device": "cuda",
            "eager variant": {
                "calls_each": 1000,
                "direct_median_us": 5.0,
                "honed_median_us": 6.5,
                "added_us": 1.5,
            },
        },
    )
    second = _run(
        "2026-01-02T00:00:00+00:00",
        [
            _row("mlp", 1, eager=8.0, sel=2.0, best=2.0, tune=8.0),
            {"model": "bert", "batch": 64, "status": "skipped", "reason": "time budget"},
        ],
        [{"model": "bert", "batch": 1, "status": "skipped", "reason": "time budget"}],
    )
    second["args"] = {"mode": "full", "candidates": "default", "isolation": "process"}
    cpu_run = _run("2026-01-03T00:00:00+00:00", [_row("mlp", 1, 1.0, 1.0, 1.0, 1.0)], [])
    cpu_run["env"]["device"] = "cpu"  # another device: never merged with the CUDA rows
    paths = []
    for i, run in enumerate((first, second, cpu_run)):
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps(run))
        paths.append(path)
    (tmp_path / "junk.json").write_text("{not json")
    return [*paths, tmp_path / "junk.json"]


def test_report_targets_from_fixture(fixture_runs: list[Path], tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    result = report.generate(fixture_runs, out_dir)
    merged, goals = result["merged"], result["targets"]
    assert [(r["model"], r["batch"]) for r in merged["rows"]] == [
        ("mlp", 1),
        ("mlp", 64),
        ("bert", 1),
        ("bert", 64),
    ]
    assert merged["rows"][0]["run"] == "run1.json"  # the later run's mlp b1
    assert merged["rows"][3]["status"] == "ok"  # a later skip does not hide a finished row
    assert len(merged["runs"]) == 2  # the CPU run and the junk file are left out

    assert goals["geomean_b1"]["value"] == pytest.approx(2.0)
    assert goals["geomean_b1"]["met"] is True
    assert goals["geomean_b1"]["missing"] == ["resnet50", "vit_b16", "gpt2"]
    assert goals["geomean_b64"]["value"] == pytest.approx(math.sqrt(1.44))
    assert goals["geomean_b64"]["met"] is False
    sel = goals["selection"]
    assert sel["checked"] == 4 and sel["within"] == 3 and sel["met"] is False
    assert sel["missed"] == [("bert", 64, pytest.approx(100 * (10.0 / 9.5 - 1)))]
    mat = goals["max_autotune"]
    assert mat["reported"] == 2 and mat["met"] is True
    by_model = {e["model"]: e for e in mat["per_model"]}
    assert by_model["mlp"]["ratio"] == pytest.approx(8.0 / 20.0)
    assert by_model["bert"]["ratio"] == pytest.approx(50.0 / 60.0)
    assert by_model["bert"]["lower_bound"] is True  # the timeout beats the later skip

    text = (out_dir / "RESULTS.md").read_text()
    assert "| geometric-mean speed-up over eager fp32 at batch 1 >= 2x | 2.00x over 2" in text
    assert "1.20x over 2 model(s): mlp, bert" in text
    assert "3 of 4 rows within 3 %; worst bert batch 64: +5.3 %" in text
    assert text.count("**met**") == 2 and text.count("**not met**") == 2
    assert "| mlp | 1 | 8.000 | TorchInductorBackend" in text and "| 4.00x |" in text
    assert "| bert | b1: 50.0, b64: 60.0 | > 60 (b1) | <= 0.83 |" in text
    # The full run's row says so wherever its tuning time shows; the light rows do not.
    assert "| 8.0 (full) |" in text and "| mlp | b1: 8.0 (full), b64: 12.0 |" in text
    assert report.FULL_NOTE in text and text.count("(full)") == 3
    assert "| eager variant | 1,000 | 5.00 | 6.50 | 1.50 |" in text
    assert "rejected: NaN" in text and "NVIDIA H100 80GB HBM3" in text
    if (
        importlib.util.find_spec("matplotlib") is None
    ):  # the Makefile installs it; a bare box may not
        assert "Plots not drawn: matplotlib is missing" in text
        return
    for name in ("speedup.png", "latency_mlp.png", "latency_bert.png"):
        assert (out_dir / name).read_bytes()[:8] == PNG_MAGIC
        assert f"]({name})" in text


def test_report_with_no_runs(tmp_path: Path) -> None:
    result = report.generate([], tmp_path)
    text = (tmp_path / "RESULTS.md").read_text()
    assert result["targets"]["selection"]["met"] is False
    assert "no finished row at this batch" in text

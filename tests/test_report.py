"""tests/test_report.py: the tuning report as markdown, JSON and HTML, stored in the artifact,
read back by `honed report`, and rendered by a real headless Chromium."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import honed
from honed.backend import Backend, Sample
from honed.cli import main
from honed.pipeline.tuner import _capped
from honed.report import CandidateReport, GraphReport, TuneReport, load_report

from conftest import TinyMLP, batches

SCRIPT_REASON = "<script>alert('pwned')</script> & friends"
LONG_NAME = (
    "TorchInductorBackend(mode=max-autotune-no-cudagraphs, options={epilogue_fusion: True, "
    "coordinate_descent_tuning: True, max_autotune_gemm_backends: ATEN,TRITON,CPP})"
)


class FastBackend(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


class SlowBackend(FastBackend):
    pass


class WrongBackend(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return lambda *a, **k: module(*a, **k) * 1.01


class ScriptBackend(Backend):
    """Fails with a reason that would run script in the page if it were not escaped."""

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        raise RuntimeError(SCRIPT_REASON)


CANDIDATES = ["TorchInductorBackend", "FastBackend", "SlowBackend", "WrongBackend", "ScriptBackend"]


@pytest.fixture(scope="module")
def tuned() -> Iterator[tuple[honed.Module, TuneReport]]:
    """A TinyMLP tuned once: real Inductor timings, injected ones for the rest (eager's too, so
    that the pick does not hang on how busy this machine is)."""
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "tiny")
    strategy = honed.MaxThroughputStrategy(
        [
            honed.backend.TorchInductorBackend(),
            FastBackend(),
            SlowBackend(),
            WrongBackend(),
            ScriptBackend(),
        ]
    )
    timings = {
        "TorchEagerBackend": [0.040, 0.041, 0.043, 0.040, 0.046, 0.041],
        "FastBackend": [0.010, 0.011, 0.012, 0.010, 0.018, 0.011],
        "SlowBackend": [0.050, 0.055, 0.049, 0.070, 0.052],
        "WrongBackend": [0.001],
    }
    with honed.config.patch(
        warmup_ms=2.0,
        warmup_calls=2,
        window_ms=2.0,
        window_calls=3,
        max_windows=4,
        cache_enabled=False,
        isolation="none",
        injected_latencies=timings,
    ):
        report = honed.tune(model, batches(4, 8), strategy=strategy)
    yield model, report


def _rows(report: TuneReport) -> dict[str, CandidateReport]:
    return {c.name: c for g in report.graphs for c in g.candidates}


@pytest.mark.integration
def test_the_tune_fills_every_column(tuned: tuple[honed.Module, TuneReport]) -> None:
    _, report = tuned
    rows = _rows(report)
    assert set(CANDIDATES) | {"TorchEagerBackend"} == set(rows)
    assert rows["ScriptBackend"].status == "failed"
    assert SCRIPT_REASON in rows["ScriptBackend"].reason
    assert rows["WrongBackend"].status == "rejected"
    fast = rows["FastBackend"]
    assert fast.samples_ms is not None and set(fast.samples_ms) <= {
        0.010,
        0.011,
        0.012,
        0.018,
    }
    assert rows["TorchEagerBackend"].samples_ms  # timings kept for the plots
    assert report.selected() == ["FastBackend"] * len(report.graphs)


def test_samples_are_capped_evenly() -> None:
    assert _capped([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    capped = _capped([float(i) for i in range(5000)], cap=2000)
    assert len(capped) <= 2000 and capped[:3] == [0.0, 3.0, 6.0] and capped[-1] >= 4990.0


def test_markdown_lists_every_candidate_and_decision(
    tuned: tuple[honed.Module, TuneReport],
) -> None:
    _, report = tuned
    md = report.to_markdown()
    assert md.startswith("# honed tuning report")
    assert "## Environment" in md and f"| torch | {torch.__version__} |" in md
    for g in report.graphs:
        assert f"## tiny / {g.batch_size}x16" in md  # named by the real input shape
        assert f"batch {g.batch_size} (batch axis inferred) · ranked by throughput" in md
        assert f"**decision:** {g.decision}" in md
    for name in CANDIDATES:
        assert re.search(rf"^\| {name} \|", md, re.M), name
    assert "| TorchEagerBackend (baseline) | ok |" in md
    header = md.index("| candidate | status |")
    head, align = md[header:].splitlines()[:2]
    assert head.count("|") == align.count("|") == 12  # 11 columns, aligned right from build s
    assert "| max err | cosine | selected |" in head
    fast = _rows(report)["FastBackend"]
    assert fast.cosine is not None
    assert f"| {fast.speedup:.2f}x | {fast.max_abs_error:.1e} | {fast.cosine:.6f} | ✔ |" in md
    assert f"{fast.cosine:.6f}" in report.render(width=240)  # the terminal table too
    row = next(line for line in md.splitlines() if line.startswith("| ScriptBackend |"))
    assert f"| failed: build raised RuntimeError: {SCRIPT_REASON} | - |" in row


def test_markdown_escapes_pipes_and_newlines() -> None:
    c = CandidateReport("A|B", "AB", "failed", reason="bad\nthing | here")
    g = GraphReport("m", "k", 1, 4, "in0(4)", [c], None, "kept eager")
    md = TuneReport([g], "cpu", "s", 0.1).to_markdown()
    row = next(line for line in md.splitlines() if line.startswith("| A"))
    assert row.startswith(r"| A\|B | failed: bad thing \| here |")


def test_the_console_table_fits_the_terminal_and_marks_cached_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [
        CandidateReport(
            "TorchEagerBackend",
            "TorchEagerBackend",
            "ok",
            is_baseline=True,
            median_ms=1.25,
            p99_ms=1.5,
            throughput=6400.0,
            cv=0.036,
            stable=True,
            speedup=1.0,
            build_s=0.01,
            max_abs_error=0.0,
            cosine=1.0,
        ),
        CandidateReport(
            LONG_NAME,
            "TorchInductorBackend",
            "ok",
            cached=True,
            selected=True,
            median_ms=0.5,
            p99_ms=0.61,
            throughput=16000.0,
            cv=3.83,
            stable=False,
            speedup=2.5,
            build_s=41.2,
            max_abs_error=1e-6,
            cosine=0.999999,
        ),
        CandidateReport(
            "ONNXRuntimeBackend",
            "ONNXRuntimeBackend",
            "failed",
            reason="build raised RuntimeError: " + "x" * 150,
        ),
    ]
    g = GraphReport(
        "encoder",
        "k",
        1,
        8,
        "in0(8, 128)",
        rows,
        LONG_NAME,
        "because " * 30,
        input_shapes="8x128",
        batch_axis="batch axis inferred",
        ranked_by="throughput",
    )
    report = TuneReport([g], "cpu", "MaxThroughputStrategy", 1.0)
    for width in (80, 100, 160):
        text = report.render(width=width)
        assert max(len(line) for line in text.splitlines()) <= width, text
        assert "(cached)" in text and "383.0% (unstable)" in text and "encoder / 8x128" in text
    monkeypatch.setenv("COLUMNS", "100")  # print(report) follows the terminal
    assert max(len(line) for line in str(report).splitlines()) <= 100
    assert "build s" not in report.render(width=100)  # narrow: the central columns only
    assert "cosine" in report.render(width=160)


def test_json_round_trips_through_from_dict(tuned: tuple[honed.Module, TuneReport]) -> None:
    _, report = tuned
    again = TuneReport.from_dict(json.loads(report.to_json()))
    assert again == report
    assert isinstance(again.graphs[0].candidates[0], CandidateReport)
    assert again.to_json() == report.to_json()


def test_from_dict_names_what_is_missing() -> None:
    with pytest.raises(honed.InputError, match=r"incomplete.*to_dict"):
        TuneReport.from_dict({"graphs": [{"module": "m"}], "device": "cpu"})
    with pytest.raises(honed.InputError, match="expected a JSON object"):
        TuneReport.from_dict({"graphs": ["nope"], "device": "cpu", "strategy": "", "wall_s": 0})


def test_html_is_escaped_and_self_contained(tuned: tuple[honed.Module, TuneReport]) -> None:
    _, report = tuned
    page = report.to_html()
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt; &amp; friends" in page
    assert "<script>alert" not in page
    assert page.count("<script>") == 1  # the page's own sorting script, nothing else
    for external in ("src=", "href=", "url(", "@import", "http://", "https://"):
        assert external not in page, external
    assert f"<td>{torch.__version__}</td>" in page.replace('<td class="text">', "<td>")


def test_html_has_the_plots_and_every_row(tuned: tuple[honed.Module, TuneReport]) -> None:
    _, report = tuned
    page = report.to_html()
    assert page.count('<figure class="chart"') == 2 * len(report.graphs)
    measured = [c for g in report.graphs for c in g.candidates if c.speedup is not None]
    assert page.count('<span class="bar"') == len(measured)
    assert page.count('<span class="box"') == len(measured)
    fast = _rows(report)["FastBackend"]
    assert f"FastBackend: {fast.speedup:.2f}x" in page
    # the box plot reads min/median/p90/p99/max from the stored samples through the engine
    assert "FastBackend: min 0.010 ms, median 0.011 ms" in page
    for g in report.graphs:
        assert g.decision.replace("'", "&#x27;") in page
        assert f"<b>selected: {g.selected}</b>" in page


def test_save_html_writes_the_page(tuned: tuple[honed.Module, TuneReport], tmp_path: Path) -> None:
    _, report = tuned
    path = report.save_html(tmp_path / "sub" / "r.html")
    assert path.read_text(encoding="utf-8") == report.to_html()


@pytest.fixture
def saved(tuned: tuple[honed.Module, TuneReport], tmp_path: Path) -> Path:
    model, _ = tuned
    return honed.save(model, tmp_path / "tiny.honed")


def test_save_stores_the_report_and_load_report_reads_it(
    tuned: tuple[honed.Module, TuneReport], saved: Path
) -> None:
    model, report = tuned
    back = load_report(saved)
    assert back == model.report
    assert back.graphs == report.graphs
    assert back.wall_s == pytest.approx(report.wall_s)


def test_cli_report_prints_markdown_json_and_writes_html(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = load_report(saved)
    assert main(["report", str(saved)]) == 0
    assert capsys.readouterr().out == stored.to_markdown()
    assert main(["report", str(saved), "--format", "json"]) == 0
    assert TuneReport.from_dict(json.loads(capsys.readouterr().out)) == stored
    out = tmp_path / "r.html"
    assert main(["report", str(saved), "--format", "html", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == stored.to_html()
    assert f"wrote {out} (html" in capsys.readouterr().err


def test_cli_report_explains_a_missing_or_reportless_artifact(
    tuned: tuple[honed.Module, TuneReport], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "none.honed")]) == 2
    assert "does not exist" in capsys.readouterr().err
    model, _ = tuned
    kept = model.report
    model.report = None
    try:
        path = honed.save(model, tmp_path / "bare.honed")
    finally:
        model.report = kept
    assert main(["report", str(path)]) == 2
    assert "holds no tuning report" in capsys.readouterr().err
    with pytest.raises(honed.ArtifactError, match=r"tune the model and honed\.save it again"):
        load_report(path)


def test_load_report_merges_every_module(tmp_path: Path) -> None:
    torch.manual_seed(0)
    pipeline = torch.nn.Sequential(
        honed.Module(TinyMLP(16, 16).eval(), "first"),
        torch.nn.Linear(4, 16),
        honed.Module(TinyMLP(16, 8).eval(), "second"),
    )
    strategy = honed.OneBackendStrategy(FastBackend())
    with honed.config.patch(injected_latencies={"TorchEagerBackend": [2.0], "FastBackend": [1.0]}):
        report = honed.tune(pipeline, batches(4), strategy=strategy)
    back = load_report(honed.save(pipeline, tmp_path / "p.honed"))
    assert [g.module for g in back.graphs] == ["first", "second"]
    assert back.graphs == report.graphs
    assert back.selected() == ["FastBackend", "FastBackend"]


@pytest.mark.integration
def test_help_shows_the_report_example() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "honed.cli", "report", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "honed report demo.honed --format html --out report.html" in out
    assert "--format {markdown,json,html}" in out


# -- a real browser ----------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
# Chromium logs every console message (an uncaught exception, console.error, a resource it could
# not load) as ":CONSOLE"; the page writes nothing to the console, so any such line is an error.
CONSOLE_ERROR = re.compile(r"Uncaught|:CONSOLE[:(]|net::ERR_")


def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        pytest.skip(
            "chromium is not installed: run `bash scripts/setup-system.sh chromium` (make test "
            "installs it)"
        )
    home = tmp_path / "chromium-home"  # a private profile: no state shared between runs
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={home}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.integration
@pytest.mark.parametrize("width", [700, 1400])
def test_html_renders_in_headless_chromium(
    tuned: tuple[honed.Module, TuneReport], tmp_path: Path, width: int
) -> None:
    _, tuned_report = tuned
    report = TuneReport.from_dict(tuned_report.to_dict())
    report.graphs[0].candidates[1].name = LONG_NAME  # a long name is shown whole, wrapped
    page = report.save_html(tmp_path / "report.html")
    size = f"--window-size={width},1000"
    dom = _chromium(["--dump-dom", size, page.as_uri()], tmp_path)
    assert dom.returncode == 0, dom.stderr
    assert not CONSOLE_ERROR.search(dom.stderr), dom.stderr
    # the script ran to its last line, and the page holds every candidate and its charts
    assert 'data-honed-ready="1"' in dom.stdout
    assert dom.stdout.count('<figure class="chart"') == 2 * len(report.graphs)
    for name in [*CANDIDATES[2:], "TorchEagerBackend", html.escape(LONG_NAME, quote=False)]:
        assert name in dom.stdout
    assert "…" not in dom.stdout  # no name is cut
    assert "<script>alert" not in dom.stdout
    # readable at this width: nothing scrolls sideways, every chart spans its section
    assert 'data-honed-scrolls-sideways="false"' in dom.stdout
    share = re.search(r'data-honed-chart-share="(\d+)"', dom.stdout)
    assert share is not None and int(share.group(1)) >= 95, dom.stdout[-400:]

    shot = tmp_path / f"report-{width}.png"
    run = _chromium([f"--screenshot={shot}", size, page.as_uri()], tmp_path)
    assert run.returncode == 0, run.stderr
    assert not CONSOLE_ERROR.search(run.stderr), run.stderr
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    shot_width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (shot_width, height) == (width, 1000)


@pytest.mark.integration
def test_chromium_reports_a_broken_script(tmp_path: Path) -> None:
    """The console check itself works: a page that throws is caught."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    run = _chromium(["--dump-dom", page.as_uri()], tmp_path)
    assert CONSOLE_ERROR.search(run.stderr), run.stderr

"""bench/jit_restart.py: JIT mode's cold vs warm start, and what the .pth hook costs at start-up.

restart: a plain script (no honed import; a small MLP with pointwise ops, a few batch sizes) is
run with HONED_JIT=1 in fresh processes, ``--runs`` times (default 2: cold, then warm) with one
honed cache and one Inductor cache (TORCHINDUCTOR_CACHE_DIR), both new, so the first run is
really cold. Each run's wall time, and from JIT's history (HONED_JIT_REPORT=1) its tuning time
split into deciding (or reusing the cached decision) and rebuilding the winner; the outputs are
compared with eager. Exits 1 when outputs differ or a warm run did not reuse the decision.

hook: ``python -c pass`` in a bare venv of this interpreter, with and without honed_jit.pth (and
with HONED_JIT=1, where the hook module is imported but torch is not), interleaved, ``--reps``
times each; medians and the engine's bootstrap interval of the ratio of medians.

    python bench/jit_restart.py [--device cpu|cuda] [--runs 2] [--backends TorchInductorBackend]
                                [--reps 200] [--skip-restart] [--skip-hook] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import torch
from provenance import commit  # bench/provenance.py

import honed
from honed import _core

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Linear(256, 1024), nn.GELU(), nn.LayerNorm(1024), nn.Linear(1024, 256)
            )

        def forward(self, x):  # pointwise-heavy: what a compiler fuses
            y = self.body(x)
            return (y * torch.sigmoid(y) + 0.5 * y.tanh()).softmax(-1)

    device = sys.argv[2]
    torch.manual_seed(0)
    model = Net().to(device).eval()
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(b, 256, generator=g).to(device) for b in (8, 16, 16, 8, 12, 16)]
    with torch.no_grad():
        outputs = [model(x).cpu() for x in inputs]
    torch.save({"outputs": outputs, "state": model.state_dict()}, sys.argv[1])
    """
)

TUNING = re.compile(r"Tuning Net \S+ took (\d+\.\d+)s")
REUSED = re.compile(
    r"Decision for Net \S+ reused from the cache in (\d+\.\d+)s .*rebuilding the winner took "
    r"(\d+\.\d+)s"
)
CHECK = re.compile(r"graph breaks in Net \S+\. (Checking|Reusing the cached check) took (\S+)s")
SELECTED = re.compile(r"Selected (.+?) for Net")


def _eager_outputs(state: dict[str, Any], device: str) -> list[torch.Tensor]:
    scope: dict[str, Any] = {}
    exec(compile(SCRIPT.split("device = sys.argv[2]")[0], "plain", "exec"), scope)
    model = scope["Net"]().to(device).eval()
    model.load_state_dict(state)
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(b, 256, generator=g).to(device) for b in (8, 16, 16, 8, 12, 16)]
    with torch.no_grad():
        return [model(x).cpu() for x in inputs]


def restart(device: str, runs: int, backends: str, work: Path) -> list[dict[str, Any]]:
    script = work / "plain_script.py"
    script.write_text(SCRIPT)
    env = dict(
        os.environ,
        HONED_JIT="1",
        HONED_JIT_REPORT="1",
        HONED_JIT_WAIT="1",  # this measures the tune itself: the script waits for it
        HONED_JIT_BACKENDS=backends,
        HONED_CACHE_DIR=str(work / "honed-cache"),
        TORCHINDUCTOR_CACHE_DIR=str(work / "inductor-cache"),
    )
    env.pop("HONED_JIT_CACHE_DIR", None)
    rows = []
    for i in range(runs):
        out = work / f"run{i}.pt"
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(script), str(out), device],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"run {i} failed:\n{proc.stderr[-4000:]}")
        report = proc.stderr
        print(report[report.find("JIT Tuning Hierarchy:") :], file=sys.stderr)
        saved = torch.load(out)
        want = _eager_outputs(saved["state"], device)
        equal = all(
            torch.allclose(a, b, rtol=1e-3, atol=1e-5)
            for a, b in zip(saved["outputs"], want, strict=True)
        )
        tuned, reused, check, selected = (
            TUNING.search(report),
            REUSED.search(report),
            CHECK.search(report),
            SELECTED.search(report),
        )
        rows.append(
            {
                "run": "cold" if i == 0 else "warm",
                "wall_s": round(wall, 3),
                "tuning_s": float(tuned.group(1)) if tuned else None,
                "decision_reused": reused is not None,
                "decision_s": float(reused.group(1)) if reused else None,
                "rebuild_s": float(reused.group(2)) if reused else None,
                "graph_break_check": check.group(1) if check else None,
                "graph_break_check_s": float(check.group(2)) if check else None,
                "selected": selected.group(1) if selected else None,
                "outputs_equal_eager": equal,
            }
        )
    return rows


def _bare_venv(root: Path, with_hook: bool) -> Path:
    """A venv of this interpreter's base Python with nothing installed but (maybe) the hook."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if with_hook:
        src = Path(__file__).resolve().parents[1] / "src"  # this checkout's hook, as installed
        for name in ("honed_jit.pth", "_honed_jit_hook.py"):
            shutil.copy(src / name, Path(site) / name)
    return python


def hook(reps: int, work: Path) -> dict[str, Any]:
    """python -c pass: bare venv vs bare venv + hook (HONED_JIT unset, and HONED_JIT=1)."""
    plain = _bare_venv(work / "venv-plain", with_hook=False)
    hooked = _bare_venv(work / "venv-hook", with_hook=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HONED_")}
    variants = {
        "no hook": (plain, env),
        "hook, HONED_JIT unset": (hooked, env),
        "hook, HONED_JIT=1": (hooked, dict(env, HONED_JIT="1")),
    }
    check = subprocess.run(
        [str(hooked), "-c", "import sys; print(sorted(m for m in sys.modules if 'honed' in m))"],
        env=dict(env, HONED_JIT="1"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(3):  # warm the page cache
        for python, e in variants.values():
            subprocess.run([str(python), "-c", "pass"], env=e, check=True)
    for _ in range(reps):  # interleaved: A B C A B C ...
        for name, (python, e) in variants.items():
            started = time.perf_counter()
            subprocess.run([str(python), "-c", "pass"], env=e, check=True)
            samples[name].append((time.perf_counter() - started) * 1e3)
    base = samples["no hook"]
    out: dict[str, Any] = {"reps": reps, "modules_imported_with_HONED_JIT_1": check}
    for name, ms in samples.items():
        st = _core.stats(ms)
        row: dict[str, Any] = {"median_ms": st.median_ms, "p90_ms": st.p90_ms, "cv": st.cv}
        if name != "no hook":
            ratio = _core.compare(ms, base)
            row.update(
                ratio=ratio.ratio,
                ratio_lo=ratio.lo,
                ratio_hi=ratio.hi,
                added_ms=st.median_ms - _core.stats(base).median_ms,
                verdict={-1: "faster", 0: "no difference within the noise", 1: "slower"}[
                    ratio.verdict
                ],
            )
        out[name] = row
    return out


def _print_restart(rows: list[dict[str, Any]], device: str) -> None:
    print(
        f"\n| run ({device}) | wall s | tuning s | decision reused | decision s | rebuild s "
        "| graph-break check | selected | equal eager |"
    )
    print("|---|---:|---:|---|---:|---:|---|---|---|")
    for r in rows:
        print(
            f"| {r['run']} | {r['wall_s']:.2f} | {r['tuning_s']} | {r['decision_reused']} | "
            f"{r['decision_s']} | {r['rebuild_s']} | {r['graph_break_check']} "
            f"({r['graph_break_check_s']}s) | {r['selected']} | {r['outputs_equal_eager']} |"
        )


def _print_hook(h: dict[str, Any]) -> None:
    print(
        f"\n| python -c pass ({h['reps']} reps each, interleaved) | median ms | p90 ms | "
        "ratio to no hook (95% CI) | verdict |"
    )
    print("|---|---:|---:|---|---|")
    for name in ("no hook", "hook, HONED_JIT unset", "hook, HONED_JIT=1"):
        r = h[name]
        ratio = (
            f"{r['ratio']:.3f} ({r['ratio_lo']:.3f}–{r['ratio_hi']:.3f})" if "ratio" in r else "1"
        )
        print(
            f"| {name} | {r['median_ms']:.2f} | {r['p90_ms']:.2f} | {ratio} | "
            f"{r.get('verdict', '')} |"
        )
    print(
        "modules named *honed* after start-up with HONED_JIT=1: "
        f"{h['modules_imported_with_HONED_JIT_1']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--backends", default="TorchInductorBackend", help="HONED_JIT_BACKENDS ('' = defaults)"
    )
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--skip-restart", action="store_true")
    parser.add_argument("--skip-hook", action="store_true")
    parser.add_argument("--keep", type=Path, default=None, help="work here and keep it")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch cannot use CUDA here (run `honed doctor`)")
    work = args.keep or Path(tempfile.mkdtemp(prefix="honed-jit-restart-"))
    work.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "bench": "jit_restart",
        "commit": commit(),
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "torch": torch.__version__,
        "honed": honed.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "backends": args.backends or "defaults",
    }
    try:
        if not args.skip_restart:
            record["restart"] = restart(args.device, args.runs, args.backends, work)
            _print_restart(record["restart"], args.device)
        if not args.skip_hook:
            record["hook"] = hook(args.reps, work)
            _print_hook(record["hook"])
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))
    problems = [
        f"{r['run']} run: outputs differ from eager"
        for r in record.get("restart", [])
        if not r["outputs_equal_eager"]
    ] + [
        f"{r['run']} run: the cached decision was not reused"
        for r in record.get("restart", [])[1:]
        if not r["decision_reused"]
    ]
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

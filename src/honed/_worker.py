"""src/honed/_worker.py: the worker process that builds, checks and measures one candidate.

Run as ``python -m honed._worker JOB_DIR``: reads ``JOB_DIR/job.pkl`` (written by
honed.isolation with cloudpickle, so modules and backends defined in the user's ``__main__``
script or inside functions travel by value), evaluates the candidate exactly as an in-process
tune would, and writes ``JOB_DIR/result.json`` (plus the payload files of a payload backend).
A watchdog thread ends the process with a "timed out" result when the build or the measure
phase runs past its limit; anything worse (a segfault, a hang holding the GIL, the memory
ceiling) is seen by the parent through the engine's run_isolated.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
from pathlib import Path
from typing import Any

EXIT_TIMEOUT = 86  # the watchdog's exit status: the result file says which phase


class _Watchdog:
    """Ends the process when a phase (build, measure) runs past its limit."""

    def __init__(self, result_path: Path) -> None:
        self.result_path = result_path
        self.timer: threading.Timer | None = None

    def phase(self, name: str, limit_s: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if limit_s <= 0:
            return
        self.timer = threading.Timer(limit_s, self._expire, args=(name, limit_s))
        self.timer.daemon = True
        self.timer.start()

    def _expire(self, name: str, limit_s: float) -> None:
        record = {"status": "failed", "reason": f"killed after the {limit_s:g} s {name} timeout"}
        self.result_path.write_text(json.dumps({"outcome": record}))
        sys.stderr.flush()
        os._exit(EXIT_TIMEOUT)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


def main(job_dir: str) -> int:
    work = Path(job_dir)
    spec: dict[str, Any] = json.loads((work / "spec.json").read_text())
    sys.path[:0] = [p for p in spec["sys_path"] if p not in sys.path]

    from honed import config
    from honed.candidate import Outcome, evaluate, watch_phases

    for name, value in spec["config"].items():
        setattr(config, name, value)
    job = pickle.loads((work / "job.pkl").read_bytes())
    if spec.get("kind") == "interleave":
        return _interleave(job, work)
    watchdog = _Watchdog(work / "result.json")
    timeouts = spec["timeouts"]  # "check" has none of its own: the build limit covers it

    def on_phase(phase: str) -> None:
        if phase in timeouts:
            watchdog.phase(phase, timeouts[phase])

    with watch_phases(on_phase):
        outcome: Outcome = evaluate(**job)
    watchdog.stop()
    files: dict[str, bytes] = {}
    if outcome.status == "ok" and outcome.fn is not None and outcome.backend.saves_payload:
        files = outcome.backend.export_payload(outcome.fn)
        for name, data in files.items():
            (work / f"payload-{name}").write_bytes(data)
    record = {"outcome": outcome.to_record(), "files": sorted(files)}
    (work / "result.json").write_text(json.dumps(record))
    return 0


def _interleave(job: dict[str, Any], work: Path) -> int:
    """Build the finalists here (their compile caches are warm) and measure them interleaved."""
    from honed.candidate import build_for_install, interleave, measurement_record

    fns = [
        build_for_install(
            backend, job["module"], job["samples"], job["graph"], job["measure_at"], files
        )
        for backend, files in zip(job["backends"], job["payloads"], strict=True)
    ]
    sample = job["samples"][job["measure_at"]]
    results = interleave(fns, job["medians"], sample, job["graph"].device, job["batch_size"])
    record = {"measurements": [measurement_record(m) for m in results]}
    (work / "result.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

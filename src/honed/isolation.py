"""src/honed/isolation.py: evaluates one candidate in a worker process (the parent's side).

The job (module, backend, samples, eager references) travels with cloudpickle, so modules and
backends defined in the user's ``__main__`` script or inside functions work; the engine's
``run_isolated`` runs ``python -m honed._worker`` with a timeout and a memory ceiling and reports
how it ended. A crash, hang, out-of-memory or exception fails that candidate with a one-line
reason; the tune goes on. What cannot be pickled is evaluated in this process instead (the
caller warns once).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from honed import _core, buildlog, config
from honed.backend.base import Backend
from honed.candidate import Outcome, measurement_from_record

log = logging.getLogger("honed")

_GRACE_S = 30.0  # on top of the worker's own phase limits: start-up, imports, writing results


class NotIsolatable(Exception):
    """The job cannot be sent to a worker (something in it does not pickle)."""


def memory_ceiling_bytes() -> int:
    if config.worker_memory_gb > 0:
        return int(config.worker_memory_gb * (1 << 30))
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return int(pages * page * 0.8)
    except (ValueError, OSError, AttributeError):
        return 0


def _config_for_worker() -> dict[str, Any]:
    out = {}
    for name, value in config.snapshot().items():
        try:
            json.dumps(value)
        except TypeError:
            continue  # paths and the like: the worker does not need them
        out[name] = value
    out["isolation"] = "none"
    return out


def _launch(kind: str, job: dict[str, Any], work: Path, timeout_s: float) -> Any:
    """Pickle ``job`` into ``work`` and run the worker on it; returns how the worker ended."""
    import cloudpickle

    try:
        blob = cloudpickle.dumps(job)
    except Exception as e:
        raise NotIsolatable(f"{type(e).__name__}: {e}") from e
    (work / "job.pkl").write_bytes(blob)
    spec = {
        "kind": kind,
        "sys_path": [p for p in sys.path if p],
        "config": _config_for_worker(),
        "timeouts": {"build": config.build_timeout_s, "measure": config.measure_timeout_s},
    }
    (work / "spec.json").write_text(json.dumps(spec))
    options = _core.IsolateOptions(
        argv=[sys.executable, "-m", "honed._worker", str(work)],
        env=[("PYTHONUNBUFFERED", "1"), ("HONED_JIT", "0")],  # workers never JIT-tune
        timeout_s=timeout_s,
        memory_limit_bytes=memory_ceiling_bytes(),
    )
    return _core.run_isolated(options)


def evaluate_isolated(job: dict[str, Any]) -> Outcome:
    """Run ``candidate.evaluate(**job)`` in a worker; raises NotIsolatable when it can't travel."""
    backend: Backend = job["backend"]
    with tempfile.TemporaryDirectory(prefix="honed-worker-") as tmp:
        work = Path(tmp)
        limit = config.build_timeout_s + config.measure_timeout_s + _GRACE_S
        ended = _launch("evaluate", job, work, limit)
        outcome = _outcome(backend, job.get("is_baseline", False), work, ended)
        outcome.output = buildlog.worker_text(ended.stdout_tail, ended.stderr_tail)
        return outcome


def interleave_isolated(finalists: list[Outcome], job: dict[str, Any]) -> None:
    """Re-measure ``finalists`` interleaved in one worker; replaces their figures on success.

    ``job`` holds module, samples, graph, measure_at and batch_size. A failure here only logs:
    each finalist keeps its own measurement.
    """
    if len(finalists) < 2:
        return
    job = dict(
        job,
        backends=[o.backend for o in finalists],
        payloads=[o.payload_files for o in finalists],
        medians=[o.measurement.median_ms for o in finalists],
    )
    with tempfile.TemporaryDirectory(prefix="honed-worker-") as tmp:
        work = Path(tmp)
        limit = len(finalists) * config.build_timeout_s + config.measure_timeout_s + _GRACE_S
        try:
            ended = _launch("interleave", job, work, limit)
        except NotIsolatable as e:
            log.info("honed: finalists not re-measured interleaved (%s)", e)
            return
        result = work / "result.json"
        if ended.exit_code != 0 or not result.is_file():
            log.warning(
                "honed: interleaved re-measurement of the finalists failed (%s: %s); keeping "
                "their separate figures",
                ended.summary(),
                _last_line(ended.stderr_tail) or "no error output",
            )
            return
        records = json.loads(result.read_text())["measurements"]
    for outcome, record in zip(finalists, records, strict=True):
        outcome.measurement = measurement_from_record(record)


def _outcome(backend: Backend, is_baseline: bool, work: Path, ended: Any) -> Outcome:
    """The worker's result file, or a failure that says how the worker ended."""
    result_path = work / "result.json"
    record = None
    if result_path.is_file():
        try:
            record = json.loads(result_path.read_text())
        except json.JSONDecodeError:
            record = None
    if record is not None and (ended.exit_code == 0 or record["outcome"]["status"] == "failed"):
        data = record["outcome"]
        if "build_s" not in data:  # the watchdog's short record
            return Outcome(
                backend, is_baseline, status="failed", reason=data["reason"], isolated=True
            )
        outcome = Outcome.from_record(backend, data, is_baseline, key="")
        outcome.cached, outcome.cache_key, outcome.isolated = False, None, True
        names = record.get("files") or []
        if names:
            outcome.payload_files = {n: (work / f"payload-{n}").read_bytes() for n in names}
        return outcome
    reason = ended.summary()
    tail = _last_line(ended.stderr_tail)
    if tail and not ended.timed_out and not ended.memory_exceeded:
        reason = f"{reason}: {tail}"
    log.debug("honed: worker for %s ended: %s\n%s", backend.name, reason, ended.stderr_tail)
    return Outcome(backend, is_baseline, status="failed", reason=reason, isolated=True)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= 200 else line[:197] + "..."

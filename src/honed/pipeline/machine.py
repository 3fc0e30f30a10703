"""src/honed/pipeline/machine.py: the machine a tune measures on: what, how busy, how many threads.

The probing and the busy verdict are the engine's (honed._core: probe_cpu, probe_gpu_details,
calibrate_cpu, assess_load); this file gathers what torch knows (the device, its uuid, the threads
it uses), logs the verdict once at the start of a tune and describes the machine for the report
and the artifact's "machine" section.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import torch

from honed import _core, config
from honed.pipeline import courtesy

log = logging.getLogger("honed")


@functools.cache
def cpu() -> Any:
    """The engine's CpuInfo: model, logical CPUs (this process's affinity), physical cores."""
    return _core.probe_cpu()


def cpu_threads() -> int:
    """The threads CPU candidates are measured with: HONED_CPU_THREADS, else the physical cores."""
    wanted = int(config.cpu_threads)
    return wanted if wanted > 0 else max(1, int(cpu().physical_cores))


@contextlib.contextmanager
def measuring_threads(device: torch.device) -> Iterator[int]:
    """Run the block with torch on ``cpu_threads()`` threads when measuring on the CPU."""
    before = torch.get_num_threads()
    if device.type != "cpu":
        yield before
        return
    threads = cpu_threads()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def _gpu_id(device: torch.device) -> str:
    """The GPU as NVML names it: its uuid (stable under CUDA_VISIBLE_DEVICES), else the index."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"GPU-{uuid}" if uuid else str(index)


def _own_pids() -> list[int]:
    """This process and its children (the worker pool), which may hold GPU contexts of ours.

    A child is listed under the thread that started it, so every thread's list is read: a
    torch process has dozens, and beside a JIT program the reading gives way to its calls."""
    pids = [os.getpid()]
    tasks = f"/proc/{os.getpid()}/task"
    with contextlib.suppress(OSError):
        for tid in os.listdir(tasks):
            courtesy.give_way()
            with contextlib.suppress(OSError, ValueError), open(f"{tasks}/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
    return pids


# GPU details as first probed, per GPU: what a tune beside a JIT program reuses.
_PROBED: dict[str, Any] = {}


def _gpu(device: torch.device | None, fresh: bool = True) -> Any:
    """The engine's GpuDetails of the GPU measured on; None off CUDA. ``fresh``: probe now, else
    reuse the details this process probed first (probing if none)."""
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    gpu_id = _gpu_id(device)
    if fresh or gpu_id not in _PROBED:
        details = _core.probe_gpu_details(gpu_id)
        _PROBED.setdefault(gpu_id, details)
        return details
    return _PROBED[gpu_id]


def prepare(device: torch.device) -> None:
    """In JIT's start-up (a top module's first call): the GPU's details through NVML, which a
    tune beside the program then reuses (``start_of_tune``) instead of probing beside a call."""
    _gpu(device, fresh=False)


def _other_gpu_processes(gpu: _core.GpuDetails | None) -> int:
    if gpu is None or not gpu.processes_known:
        return -1
    own_context = torch.cuda.is_initialized()
    return int(_core.other_processes(list(gpu.process_pids), _own_pids(), own_context))


def check_load(
    device: torch.device | None,
    gpu: _core.GpuDetails | None = None,
    calibrate: bool = True,
    others: int | None = None,
) -> _core.LoadVerdict:
    """The engine's LoadVerdict for this machine now: a short CPU calibration on the threads the
    measurement will use (one, the launching thread, for a GPU; none unless ``calibrate``), the
    load average, and other processes on the GPU (``others``: counted already)."""
    gpu = gpu if gpu is not None else _gpu(device)
    threads = cpu_threads() if device is None or device.type == "cpu" else 1
    signals = _core.LoadSignals(
        calibration_ms=_core.calibrate_cpu(threads) if calibrate else [],
        load_avg_1m=_core.load_average_1m(),
        logical_cpus=int(cpu().logical_cpus),
        gpu_other_processes=_other_gpu_processes(gpu) if others is None else others,
    )
    return _core.assess_load(signals, config.busy_slowdown, config.busy_load_per_cpu)


def wait_for_quiet(device: torch.device | None, timeout_s: float) -> Any:
    """Check the load until the machine is quiet or ``timeout_s`` passed; the last verdict."""
    deadline = time.monotonic() + timeout_s
    verdict = check_load(device)
    if verdict.busy:
        log.info("honed: waiting up to %g s for a quiet machine (%s)", timeout_s, verdict.summary)
    while verdict.busy and time.monotonic() < deadline:
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        verdict = check_load(device)
    return verdict


def start_of_tune(device: torch.device) -> dict[str, Any]:
    """The busy-machine check at the start of a tune: one log line, and the machine section.

    HONED_WAIT_FOR_QUIET_S > 0 waits up to that long for the machine to become quiet first.

    Beside a JIT program the machine is busy with the program by design, and the check runs on
    JIT's thread, which measures nothing: it spins no CPU calibration and probes no GPU through
    NVML (both slowed the program's calls beside them) but reuses the GPU details of JIT's start.
    """
    if courtesy.beside_program():
        gpu = _gpu(device, fresh=False)
        # Counting the GPU's other processes reads every thread's children: once, for both.
        others = _other_gpu_processes(gpu)
        verdict = check_load(device, gpu, calibrate=False, others=others)
        section = describe(device, verdict, gpu, others)
        section["load_checked"] = "beside the program: no CPU calibration, GPU as at JIT's start"
        return section
    gpu = _gpu(device)
    counted = None  # after a wait for quiet the section counts them anew
    if config.wait_for_quiet_s > 0:
        verdict = wait_for_quiet(device, config.wait_for_quiet_s)
    else:
        counted = _other_gpu_processes(gpu)
        verdict = check_load(device, gpu, others=counted)
    if verdict.busy:
        log.warning(
            "honed: this machine is %s; figures may be noisy, and a candidate wins only with "
            "evidence (set HONED_WAIT_FOR_QUIET_S to wait for a quiet machine)",
            verdict.summary,
        )
    else:
        log.info("honed: machine %s", verdict.summary)
    return describe(device, verdict, gpu, counted)


def describe(
    device: torch.device | None, verdict: Any = None, gpu: Any = None, others: int | None = None
) -> dict[str, Any]:
    """The machine section of a report and an artifact (the compatibility fingerprint is
    environment.fingerprint; nothing here decides whether an artifact loads); ``gpu``: details
    already probed (else probed now); ``others``: the GPU's other processes, counted already."""
    info = cpu()
    on_cpu = device is None or device.type == "cpu"
    section: dict[str, Any] = {
        "cpu_model": info.model or None,
        "physical_cores": int(info.physical_cores),
        "logical_cpus": int(info.logical_cpus),
        "torch_threads": cpu_threads() if on_cpu else torch.get_num_threads(),
        "torch_threads_source": (
            ("HONED_CPU_THREADS" if config.cpu_threads > 0 else "physical cores")
            if on_cpu
            else "torch default (GPU measurement)"
        ),
    }
    gpu = gpu if gpu is not None else _gpu(device)
    if gpu is not None:
        others = _other_gpu_processes(gpu) if others is None else others
        section.update(
            gpu=gpu.name or torch.cuda.get_device_name(device),
            gpu_driver=gpu.driver_version or None,
            gpu_sm_clock_mhz=_known(gpu.sm_clock_mhz),
            gpu_max_sm_clock_mhz=_known(gpu.max_sm_clock_mhz),
            gpu_mem_clock_mhz=_known(gpu.mem_clock_mhz),
            gpu_power_limit_w=_known(gpu.power_limit_w),
            gpu_shared=None if others < 0 else others > 0,
            gpu_other_processes=None if others < 0 else others,
        )
        if not gpu.nvml:
            section["gpu_details"] = f"unreadable: {gpu.error}"
    if verdict is not None:
        section.update(
            busy=bool(verdict.busy),
            load=str(verdict.summary),
            calibration_slowdown=_known(round(float(verdict.slowdown), 3)),
            load_per_cpu=_known(round(float(verdict.load_per_cpu), 3)),
        )
    return section


def _known(value: float) -> float | None:
    return None if value < 0 else value


__all__ = [
    "check_load",
    "cpu_threads",
    "describe",
    "measuring_threads",
    "prepare",
    "start_of_tune",
]

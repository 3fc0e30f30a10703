"""scripts/wheel_smoke.py: an installed honed (pip install . or a repaired wheel) works on its own:
import, a tiny in-process Inductor tune, save, and load in a new process with equal outputs.

    python scripts/wheel_smoke.py WORKDIR [--bundled]

Run from outside the source tree, with the venv's python. --bundled: the wheel was repaired by
auditwheel, so libzip must be loaded from the wheel's honed.libs, never from the system.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
from pathlib import Path

LOAD = """
import sys, torch, honed
inner = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
inner.load_state_dict(torch.load(sys.argv[2]))
model = honed.Module(inner.eval(), "mlp")
honed.load(model, sys.argv[1])
assert model.is_tuned, "honed.load installed no variant"
x = torch.load(sys.argv[3])
with torch.no_grad():
    torch.testing.assert_close(model(x), model.module(x))
print("LOADED", type(model.variants[0].backend).__name__)
"""


def fail(message: str) -> None:
    raise SystemExit(f"wheel smoke: {message}")


def check_install(bundled: bool) -> None:
    import honed
    import honed._core

    site = Path(sysconfig.get_paths()["platlib"])
    if Path(honed.__file__).resolve().parent != (site / "honed").resolve():
        fail(f"honed was imported from {honed.__file__}, not from {site}")
    for name in ("honed_jit.pth", "_honed_jit_hook.py"):
        if not (site / name).is_file():
            fail(f"{name} (the HONED_JIT start-up hook) is not installed in {site}")
    maps = Path("/proc/self/maps").read_text().split()
    libzip = sorted({p for p in maps if "/libzip" in p})
    if not libzip:
        fail("honed._core is loaded but no libzip is mapped")
    if bundled and not all(str(site / "honed.libs") in p for p in libzip):
        fail(f"libzip comes from {libzip}, not from the wheel's honed.libs")
    print("installed", honed.__version__, "at", site, "libzip", " ".join(libzip))


def tune_save_load(work: Path) -> None:
    import torch

    import honed

    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = honed.Module(inner.eval(), "mlp")
    data = [torch.randn(b, 16) for b in (2, 4)]
    with honed.config.patch(isolation="none", cache_enabled=False, max_windows=4):
        report = honed.tune(
            model, data, strategy=honed.OneBackendStrategy(honed.backend.TorchInductorBackend())
        )
    if not model.is_tuned:
        fail(f"the tune selected nothing:\n{report}")
    artifact = honed.save(model, work / "mlp.honed")
    torch.save(inner.state_dict(), work / "state.pt")
    torch.save(data[1], work / "x.pt")
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(artifact), str(work / "state.pt"), str(work / "x.pt")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 or "LOADED TorchInductorBackend" not in proc.stdout:
        fail(f"loading in a new process failed:\n{proc.stdout}{proc.stderr[-3000:]}")
    print("tuned, saved and loaded in a new process:", proc.stdout.strip())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work", type=Path)
    p.add_argument("--bundled", action="store_true")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    check_install(args.bundled)
    tune_save_load(args.work)


if __name__ == "__main__":
    main()

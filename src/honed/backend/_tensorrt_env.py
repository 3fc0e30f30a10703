"""src/honed/backend/_tensorrt_env.py: what TensorRT needs from this machine.

Shared by TensorRTBackend and the Torch-TensorRT backends: an optional library probed without
raising, and whether TensorRT builds for a GPU of a given compute capability.
"""

from __future__ import annotations

from honed.backend.base import Availability

# Oldest GPU TensorRT 10 builds for.
MIN_CC = (7, 5)


def probe(name: str) -> tuple[str | None, str | None]:
    """(version, import error) of an optional library, without raising."""
    import importlib
    import importlib.util
    from importlib import metadata

    if importlib.util.find_spec(name) is None:
        return None, None
    try:
        module = importlib.import_module(name)
    except Exception as e:  # any import crash makes only this backend unavailable
        first = (str(e).strip().splitlines() or [""])[0]
        version = None
        for dist in (name.replace("_", "-"), name):
            try:
                version = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        return version, f"{type(e).__name__}: {first}"
    return str(getattr(module, "__version__", "0")), None


def cc_verdict(cc: tuple[int, int], hardware_compatibility_level: str) -> Availability:
    """Whether TensorRT builds for a GPU of compute capability ``cc`` with this setting."""
    if tuple(cc) < MIN_CC:
        return Availability(
            False,
            f"TensorRT 10 builds for compute capability >= 7.5; this GPU has {cc[0]}.{cc[1]}",
            "use TorchInductorBackend on this GPU",
        )
    if hardware_compatibility_level == "ampere_plus" and tuple(cc) < (8, 0):
        return Availability(
            False,
            f"hardware_compatibility_level=ampere_plus needs an Ampere or newer GPU (8.0+); this "
            f"one has {cc[0]}.{cc[1]}",
            "use hardware_compatibility_level='none'",
        )
    return Availability(True)

"""src/honed/errors.py: the one exception hierarchy, rooted at HonedError.

Every message says what happened and what to do about it.
"""

from __future__ import annotations


class HonedError(Exception):
    """Base class of every error honed raises on purpose."""


class ConfigError(HonedError, ValueError):
    """A backend, strategy or tune option was set to something that cannot work."""


class InputError(HonedError, ValueError):
    """The model, dataset or inputs handed to honed cannot be used as given."""


class EngineError(HonedError, RuntimeError):
    """The C++ engine (honed._core) failed at something other than a bad value or artifact, e.g. a
    CUDA timer or a worker process it could not start."""


class BackendUnavailableError(HonedError):
    """A backend was asked for explicitly but cannot run on this machine."""


class TuneError(HonedError):
    """A tune could not produce a usable result (e.g. every candidate failed)."""


class TuneCancelled(TuneError):
    """A tune was abandoned (``Tuner.cancel(abandon=True)``, e.g. JIT at program exit) or cancelled
    before eager, the reference every candidate is compared with, was measured."""


class CachedPassDeclined(TuneError):
    """A cached-only tune (``Tuner(cached_only=True)``, JIT's first pass on a restart) has
    nothing to decide with: eager's cached outcome, or every candidate's, is missing."""


class ArtifactError(HonedError):
    """A .honed artifact is missing, damaged, tampered with, or made for something else."""


class IncompatibleArtifactError(ArtifactError):
    """An artifact was made for another GPU, torch or honed version."""


class UntrustedArtifactError(ArtifactError):
    """An artifact with native code (a compiled payload) that no trusted key signed; see
    docs/trust.md for `honed trust` and ``trust_native_code=True``."""


class EntryPointError(InputError):
    """A command-line entry point (``pkg.module:function``) cannot be loaded or returns the wrong
    thing."""

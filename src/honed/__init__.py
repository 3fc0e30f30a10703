"""honed: an inference tuner for PyTorch models with a C++ core.

import honed
model = honed.Module(model, "resnet", strategy=honed.MaxThroughputStrategy())
honed.tune(model, dataset)
honed.save(model, "resnet.honed")
honed.load(model, "resnet.honed")
"""

from __future__ import annotations

from honed import backend, config, tune_strategy
from honed._version import __version__
from honed.artifact import load, save
from honed.errors import (
    ArtifactError,
    BackendUnavailableError,
    ConfigError,
    EngineError,
    HonedError,
    IncompatibleArtifactError,
    InputError,
    TuneError,
    UntrustedArtifactError,
)
from honed.inspecting import InspectReport, inspect
from honed.module import Module
from honed.pipeline.tuner import tune
from honed.report import TuneReport
from honed.shapes import BatchDim, DynamicDim
from honed.tune_strategy import (
    FirstWinsStrategy,
    LatencyBudgetStrategy,
    MaxThroughputStrategy,
    MinLatencyStrategy,
    OneBackendStrategy,
    TuneStrategy,
)

__all__ = [
    "ArtifactError",
    "BackendUnavailableError",
    "BatchDim",
    "ConfigError",
    "DynamicDim",
    "EngineError",
    "FirstWinsStrategy",
    "HonedError",
    "IncompatibleArtifactError",
    "InputError",
    "InspectReport",
    "LatencyBudgetStrategy",
    "MaxThroughputStrategy",
    "MinLatencyStrategy",
    "Module",
    "OneBackendStrategy",
    "TuneError",
    "TuneReport",
    "TuneStrategy",
    "UntrustedArtifactError",
    "__version__",
    "backend",
    "config",
    "inspect",
    "load",
    "save",
    "tune",
    "tune_strategy",
]

# JIT mode (imported last: it reads honed.config and wraps honed.tune).
from honed import jit
from honed.jit import patch_for_jit_tuning

jit_config = jit.config

__all__ += ["jit", "jit_config", "patch_for_jit_tuning"]

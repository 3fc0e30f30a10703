"""src/honed/_version.py: the package version (the engine reports its own in _core.__version__)."""

__version__ = "0.1.0"

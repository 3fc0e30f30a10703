"""honed: an inference tuner for PyTorch models with a C++ core."""

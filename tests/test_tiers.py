"""tests/test_tiers.py: a test lands in its tier by its markers and fixtures (tests/conftest.py),
so `make test-fast` runs the unit tier and gpu tests skip without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest_plugins = ["pytester"]

FAST = "not integration and not gpu"  # make test-fast

SAMPLE = """
import pytest

def test_plain():
    pass

@pytest.mark.integration
def test_marked():
    pass

@pytest.mark.slow
def test_slow():
    pass

def test_shared_compile(inductor_tuned):
    pass

@pytest.mark.gpu
def test_gpu():
    assert False, "ran without CUDA"
"""

MODULE_MARKED = """
import pytest

pytestmark = pytest.mark.integration

def test_in_a_marked_module():
    pass
"""


@pytest.fixture
def sample(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_sample=SAMPLE, test_module_marked=MODULE_MARKED)
    return pytester


def collected(pytester: pytest.Pytester, *args: str) -> set[str]:
    result = pytester.runpytest("--collect-only", "-q", *args)
    return {line.split("::")[1] for line in result.outlines if "::" in line}


def test_the_fast_tier_is_the_unmarked_tests(sample: pytest.Pytester) -> None:
    assert collected(sample, "-m", FAST) == {"test_plain"}


def test_marks_and_shared_compiled_fixtures_make_integration_tests(sample: pytest.Pytester) -> None:
    assert collected(sample, "-m", "integration") == {
        "test_marked",
        "test_slow",
        "test_shared_compile",
        "test_in_a_marked_module",
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip without CUDA")
def test_gpu_tests_skip_without_cuda(sample: pytest.Pytester) -> None:
    result = sample.runpytest("-m", "gpu", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA device*"])

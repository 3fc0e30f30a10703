"""tests/test_docs.py: every ```python and ```bash block of README.md and docs/*.md runs.

Python blocks run in a fresh interpreter with a temporary working directory; bash blocks run
their `honed ...` lines in order (a later line may use what an earlier one wrote) and check
that each `make X` line names a target of the Makefile (running `make test` here would recurse).
A block right after ``<!-- not-run: reason -->`` is skipped (for fragments; use sparingly); one
after ``<!-- run-by: tests/test_runtime_cpp.py -->`` (honed-run and the C++ example need the C++
build and a saved artifact) is run by that test instead.
Measurement windows are short and isolation is off: the docs are checked for running, not timed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import fast_measurement_env

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(<!--\s*(?:not-run:|run-by: tests/test_runtime_cpp.py)[^>]*-->\s*\n)?"
    r"```(python|bash)\n(.*?)```",
    re.S,
)

pytestmark = pytest.mark.integration  # every block runs in a new interpreter; most tune

HONED = Path(sys.executable).with_name("honed")


def blocks() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            if m.group(1):
                continue
            line = text[: m.start(2)].count("\n") + 1
            found.append((f"{doc.relative_to(ROOT)}:{line}", m.group(2), m.group(3)))
    return found


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HONED_ISOLATION="none",
        **fast_measurement_env(),
        HONED_CACHE_DIR=str(tmp_path / "cache"),
        HONED_PROGRESS="off",
    )
    return env


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def test_the_docs_have_blocks_of_both_kinds() -> None:
    kinds = {(where.split(":")[0], kind) for where, kind, _ in blocks()}
    assert ("README.md", "python") in kinds and ("README.md", "bash") in kinds
    assert ("docs/cli.md", "python") in kinds and ("docs/cli.md", "bash") in kinds


class TunedOnce:
    """The artifacts of ``honed tune ... --out FILE`` lines already run: several documents show
    the very same tune, and a block repeating one gets a copy of its artifact instead of a second
    identical tune (the later lines of each block still run on it)."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.saved: dict[str, Path] = {}

    def restore(self, line: str, words: list[str], cwd: Path) -> bool:
        if line not in self.saved:
            return False
        shutil.copy(self.saved[line], cwd / words[words.index("--out") + 1])
        return True

    def remember(self, line: str, words: list[str], cwd: Path) -> None:
        if words[1] == "tune" and "--out" in words:
            kept = self.store / f"{len(self.saved)}.honed"
            shutil.copy(cwd / words[words.index("--out") + 1], kept)
            self.saved[line] = kept


@pytest.fixture(scope="module")
def tuned_once(tmp_path_factory: pytest.TempPathFactory) -> TunedOnce:
    return TunedOnce(tmp_path_factory.mktemp("tuned-once"))


@pytest.mark.parametrize(("where", "kind", "code"), blocks(), ids=[b[0] for b in blocks()])
def test_block_runs(
    where: str, kind: str, code: str, tmp_path: Path, tuned_once: TunedOnce
) -> None:
    env = _env(tmp_path)
    if kind == "python":
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{where}:\n{done.stdout}\n{done.stderr}"
        return
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "make":
            assert set(words[1:]) <= _makefile_targets(), f"{where}: {line}"
            continue
        assert words[0] == "honed", f"{where}: only honed and make commands are run: {line}"
        if tuned_once.restore(line, words, tmp_path):
            continue
        done = subprocess.run(
            [str(HONED), *words[1:]], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{where}: {line}\n{done.stdout}\n{done.stderr}"
        tuned_once.remember(line, words, tmp_path)

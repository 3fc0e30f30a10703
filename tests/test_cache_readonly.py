"""tests/test_cache_readonly.py: a cache folder that cannot be written turns the cache off."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import honed

from conftest import TinyMLP, batches


def _writable(folder: Path) -> bool:
    try:
        (folder / "probe").write_text("x")
    except OSError:
        return False
    (folder / "probe").unlink()
    return True


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder this process cannot write to (chmod, or chattr +i where it runs as root)."""
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    immutable = False
    if _writable(folder) and shutil.which("chattr"):
        immutable = (
            subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        )
    try:
        if _writable(folder):
            pytest.skip("cannot make a read-only folder here (root without chattr)")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(stat.S_IRWXU)


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary build-log folders land in this test's own folder."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))


def _tune_into(folder: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    model = honed.Module(TinyMLP().eval(), "mlp")
    with honed.config.patch(cache_dir=folder), caplog.at_level(logging.WARNING, logger="honed"):
        report = honed.tune(model, batches(2, 4), backends=[honed.backend.TorchEagerBackend()])
    assert model.is_tuned and report.graphs
    with torch.no_grad():
        assert model(batches(2)[0]).shape == (2, 4)
    return [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]


def test_a_read_only_cache_folder_turns_the_cache_off_and_the_tune_goes_on(
    read_only: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (message,) = _tune_into(read_only, caplog)
    assert "the tuning cache is off" in message and "HONED_CACHE_DIR" in message
    assert "build logs go to" in message
    assert os.listdir(read_only) == []


def test_a_cache_path_under_a_file_turns_the_cache_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("not a folder")
    (message,) = _tune_into(tmp_path / "file" / "cache", caplog)
    assert "the tuning cache is off" in message


def test_cache_off_and_read_only_still_tunes_with_one_warning(
    read_only: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with honed.config.patch(cache_enabled=False):
        (message,) = _tune_into(read_only, caplog)
    assert "the tuning cache is off" not in message and "build logs go to" in message

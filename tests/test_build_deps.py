"""tests/test_build_deps.py: a missing build dependency stops CMake's configure with one line naming
its Debian package (cmake/HonedDeps.cmake), never a compiler error later.

A dependency is hidden by configuring against a copy of /usr made of links to everything else
(CMAKE_FIND_ROOT_PATH with the ONLY modes), so the checks run as they would on a machine without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CMAKE = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")
ARCH = "x86_64-linux-gnu"
PY_INCLUDE = sysconfig.get_paths()["include"]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(CMAKE is None, reason="needs cmake"),
    pytest.mark.skipif(not Path(f"/usr/lib/{ARCH}").is_dir(), reason="needs a Debian-style /usr"),
]


def mirrored() -> list[Path]:
    """The folders CMake searches here: the system's, this Python's headers, nanobind's config."""
    import nanobind

    folders = ["include", f"include/{ARCH}", f"lib/{ARCH}", f"lib/{ARCH}/cmake", "share"]
    found = [Path("/usr") / f for f in folders]
    found.append(Path(sysconfig.get_paths()["include"]).parent)
    found.append(Path(nanobind.cmake_dir()).parent)
    return [f for f in found if f.is_dir()]


def usr_without(tmp_path: Path, hidden: set[str]) -> Path:
    """A root where each mirrored folder holds links to the real one's entries, except the
    ``hidden`` paths (absolute) and, for a library named ``lib<x>`` there, every file of it."""
    root = tmp_path / "root"
    for folder in mirrored():
        (root / folder.relative_to("/")).mkdir(parents=True, exist_ok=True)
    for folder in mirrored():
        for entry in folder.iterdir():
            target = root / entry.relative_to("/")
            if target.exists() or str(entry) in hidden:
                continue
            if any(entry.name.startswith(f"{lib}.") for lib in hidden if "/" not in lib):
                continue
            target.symlink_to(entry)
    return root


def configure(
    tmp_path: Path, *defines: str, root: Path | None = None
) -> subprocess.CompletedProcess:
    args = [str(CMAKE), "-S", str(ROOT), "-B", str(tmp_path / "build"), "-G", "Unix Makefiles"]
    args += [f"-D{d}" for d in defines]
    if root is not None:
        args += [f"-DCMAKE_FIND_ROOT_PATH={root}"]
        args += [f"-DCMAKE_FIND_ROOT_PATH_MODE_{kind}=ONLY" for kind in ("INCLUDE", "LIBRARY")]
        args += ["-DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=ONLY"]
    env = {k: v for k, v in os.environ.items() if k != "CMAKE_PREFIX_PATH"}
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)


def messages(proc: subprocess.CompletedProcess) -> str:
    """The configure's error output on one line per message (CMake wraps and indents them)."""
    return " ".join(proc.stderr.split())


ENGINE = ["HONED_BUILD_RUNTIME=OFF", f"Python_EXECUTABLE={sys.executable}"]


def test_with_everything_present_the_configure_passes(tmp_path: Path) -> None:
    root = usr_without(tmp_path, set())
    proc = configure(tmp_path, *ENGINE, "HONED_BUILD_TESTS=ON", root=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not found" not in proc.stderr


def test_each_missing_dependency_is_named_with_its_package(tmp_path: Path) -> None:
    hidden = {
        "/usr/include/nlohmann",
        "/usr/include/openssl",
        f"/usr/include/{ARCH}/openssl",
        "libcrypto",
        "/usr/include/zip.h",
        f"/usr/include/{ARCH}/zipconf.h",
        "libzip",
        "/usr/include/gtest",
        f"/usr/lib/{ARCH}/cmake/GTest",
        "libgtest",
        "libgtest_main",
        PY_INCLUDE,
        f"/usr/include/{ARCH}/{Path(PY_INCLUDE).name}",
    }
    proc = configure(tmp_path, *ENGINE, "HONED_BUILD_TESTS=ON", root=usr_without(tmp_path, hidden))
    assert proc.returncode != 0
    text = messages(proc)
    for line in (
        "nlohmann/json.hpp not found: install the Debian package nlohmann-json3-dev",
        "OpenSSL not found: install the Debian package libssl-dev",
        "libzip (zip.h, zipconf.h, libzip.so) not found: install the Debian package libzip-dev",
        "GTest not found: install the Debian package libgtest-dev",
        f"Python.h for {sys.executable} not found: install the Debian package python3-dev",
        "apt-get install nlohmann-json3-dev libssl-dev libzip-dev python3-dev libgtest-dev",
    ):
        assert line in text, proc.stderr[-3000:]
    assert "error: " not in proc.stdout  # stopped at configure, before any compile


def test_one_missing_header_is_the_only_line(tmp_path: Path) -> None:
    proc = configure(tmp_path, *ENGINE, root=usr_without(tmp_path, {"/usr/include/nlohmann"}))
    assert proc.returncode != 0
    text = messages(proc)
    assert text.count("not found:") == 1, proc.stderr[-2000:]
    assert "nlohmann/json.hpp not found: install the Debian package nlohmann-json3-dev" in text


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="the runtime needs torch",
)
def test_the_runtime_names_cli11(tmp_path: Path) -> None:
    proc = configure(
        tmp_path,
        "HONED_BUILD_PYTHON=OFF",
        "HONED_BUILD_RUNTIME=ON",
        f"Python_EXECUTABLE={sys.executable}",
        root=usr_without(tmp_path, {"/usr/include/CLI"}),
    )
    assert proc.returncode != 0
    assert "CLI/CLI.hpp not found: install the Debian package libcli11-dev" in messages(proc)


def test_a_python_without_nanobind_is_named(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    proc = configure(tmp_path, "HONED_BUILD_RUNTIME=OFF", f"Python_EXECUTABLE={bare}/bin/python")
    assert proc.returncode != 0
    assert f"nanobind for {bare}/bin/python not found: pip install nanobind" in messages(proc)

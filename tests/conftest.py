"""Shared helpers: run the CLI as a real subprocess, write source trees to disk."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def run_bnfix(*args: str, cwd: Path | None = None, stdin: str | None = None,
              env: dict[str, str] | None = None, timeout: float = 120) -> Run:
    """`python -m bnfix ARGS` in a subprocess, as a user runs it."""
    full_env = {**os.environ, "PYTHONIOENCODING": "utf-8", **(env or {})}
    full_env.pop("PRE_COMMIT", None)
    proc = subprocess.run([sys.executable, "-m", "bnfix", *args], cwd=cwd, input=stdin,
                          capture_output=True, text=True, env=full_env, timeout=timeout,
                          check=False)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def write_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content).lstrip("\n"), encoding="utf-8")
    return root


@pytest.fixture
def tree(tmp_path: Path):
    """write_tree bound to a fresh temporary folder."""
    def make(files: dict[str, str | bytes]) -> Path:
        return write_tree(tmp_path, files)
    return make


def has_tf1_layers() -> bool:
    """TensorFlow with tf-keras installed (TF1 layers available under TF_USE_LEGACY_KERAS)."""
    import importlib.util

    return importlib.util.find_spec("tensorflow") is not None and \
        importlib.util.find_spec("tf_keras") is not None


def assert_golden_check(folder: Path, programs) -> None:
    """`bnfix check` on a fixture's programs prints exactly its expected_check.txt."""
    rel = folder.relative_to(REPO).as_posix()
    run = run_bnfix("check", "--extend-select", "BN104", "--output-format", "concise",
                    *[f"{rel}/{p}" for p in programs], cwd=REPO)
    assert run.returncode == 1
    assert run.stdout == (folder / "expected_check.txt").read_text(encoding="utf-8")


def fix_into(folder: Path, programs, target: Path) -> Run:
    """Copy a fixture's programs to `target`, run `bnfix fix --unsafe-fixes` there, and check
    the result equals the fixture's fixed/ folder."""
    for name in programs:
        (target / name).write_bytes((folder / name).read_bytes())
    run = run_bnfix("fix", "--unsafe-fixes", "--extend-select", "BN104", "--output-format",
                    "concise", ".", cwd=target)
    for name in programs:
        assert (target / name).read_text() == (folder / "fixed" / name).read_text(), name
    return run


# Not part of a fixture project's own tree: its golden outputs and what running it leaves.
_NOT_PROJECT = {"fixed", "expected_check.txt", ".bnfix_cache", "__pycache__"}


def project_files(folder: Path) -> list[str]:
    """The files of a fixture project (a multi-file repository), relative to it, sorted."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and not _NOT_PROJECT & set(p.relative_to(folder).parts))


def fix_tree(folder: Path, target: Path, *extra: str) -> Run:
    """Copy a fixture project to `target`, run `bnfix fix --unsafe-fixes` on the whole tree
    there, and check that the tree then equals the fixture's fixed/ tree, file by file."""
    for name in project_files(folder):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / name, target / name)
    run = run_bnfix("fix", "--unsafe-fixes", "--no-cache", "--output-format", "concise",
                    *extra, ".", cwd=target)
    assert project_files(target) == project_files(folder / "fixed")
    for name in project_files(target):
        assert (target / name).read_text() == (folder / "fixed" / name).read_text(), name
    return run

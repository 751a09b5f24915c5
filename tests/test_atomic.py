"""bnfix.atomic: temporary files as tempfile.mkstemp makes them, files replaced at once."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bnfix import atomic
from bnfix.fixes import _TEMP_NAME, temp_prefix


def test_a_temporary_file_is_private_and_named_as_the_fix_writer_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "train.py"
    fd, name = atomic.temporary_file(tmp_path, temp_prefix(target), ".bnfix")
    os.close(fd)
    assert stat.S_IMODE(os.stat(name).st_mode) == 0o600
    assert _TEMP_NAME.fullmatch(os.path.basename(name))  # what a later run removes when stale


def test_a_taken_name_is_never_opened_again(tmp_path: Path, monkeypatch) -> None:
    """O_EXCL: when every name drawn is taken, FileExistsError rather than a shared file."""
    monkeypatch.setattr(atomic.os, "urandom", lambda n: b"\0" * n)
    fd, name = atomic.temporary_file(tmp_path, ".x.", "")
    os.close(fd)
    with pytest.raises(FileExistsError):
        atomic.temporary_file(tmp_path, ".x.", "")
    assert os.listdir(tmp_path) == [os.path.basename(name)]


def test_a_failed_replace_leaves_the_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "report"
    target.mkdir()  # a folder: the rename over it fails
    with pytest.raises(OSError):
        atomic.replace_text(target, "findings\n", ".report.", ".bnfix")
    assert target.is_dir() and sorted(os.listdir(tmp_path)) == ["report"]
    out = tmp_path / "out.json"
    out.write_text("old", encoding="utf-8")
    atomic.replace_text(out, "new", ".out.json.", ".bnfix")
    assert out.read_text(encoding="utf-8") == "new" and sorted(os.listdir(tmp_path)) == [
        "out.json", "report"]

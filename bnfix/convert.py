"""`bnfix convert`: picks the model front-end by file type; each front-end checks its rewrite
before anything is written.

The output is checked before the (slow) conversion starts — a folder, a missing folder or a place
that cannot be written is a one-line usage error (exit 2) — and written atomically: a temporary
file next to it, renamed over it only after the check passed. The new file gets the mode a plain
`open(OUTPUT, "w")` would give it (0666 minus the umask); a file it replaces keeps its mode.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TARGETS = {".keras": ("sync", "plain", "groupnorm"), ".onnx": ("inference", "folded")}


class ConversionError(Exception):
    """A conversion refused or failed its check: one line for the user, nothing written."""


class OutputError(Exception):
    """OUTPUT cannot be written (a folder, a missing folder, no permission): a usage error."""


def convert_file(model: str, to: str, output: str, groups: int = 32,
                 max_bytes: int | None = None) -> int:
    """Convert MODEL to OUTPUT; print what was converted. Exit code as the CLI's. `groups`:
    GroupNorm's groups for `--to groupnorm`; `max_bytes`: the budget of
    `bnfix.artifacts.limits` (what one member of the model may declare)."""
    from bnfix.artifacts.limits import DEFAULT_MAX_BYTES, limited
    from bnfix.artifacts.quiet import silenced_stderr

    suffix = Path(model).suffix.lower()
    if suffix not in TARGETS:
        sys.stderr.write(f"bnfix: {model}: unsupported model type `{suffix or '(none)'}`: "
                         "convert reads .keras and .onnx files\n")
        return 2
    if to not in TARGETS[suffix]:
        sys.stderr.write(f"bnfix: {model}: --to {to} does not apply to {suffix} files "
                         f"(use {' or '.join(TARGETS[suffix])})\n")
        return 2
    if not Path(model).is_file():
        sys.stderr.write(f"bnfix: {model}: no such file\n")
        return 2
    try:
        check_output(output)
        with limited(max_bytes or DEFAULT_MAX_BYTES), \
                silenced_stderr(expected=(OutputError, ConversionError, ModuleNotFoundError)):
            if suffix == ".keras":
                _check_keras_archive(model)  # before Keras (seconds to import) reads it
                summary = _convert_keras(model, to, output, groups)
            else:
                from bnfix.onnx.rewrite import convert_onnx_file

                summary = convert_onnx_file(model, to, output)
    except OutputError as exc:
        sys.stderr.write(f"bnfix: -o {output}: {exc}\n")
        return 2
    except ConversionError as exc:
        sys.stderr.write(f"bnfix: {model}: {exc}\n")
        return 1
    sys.stdout.write(summary if summary.endswith("\n") else summary + "\n")
    return 0


def _convert_keras(model: str, to: str, output: str, groups: int) -> str:
    if to == "groupnorm":
        from bnfix.keras.groupnorm import convert_keras_file as to_groupnorm

        return to_groupnorm(model, output, groups)
    from bnfix.keras.files import convert_keras_file

    return convert_keras_file(model, to, output)


def _check_keras_archive(model: str) -> None:
    import zipfile

    from bnfix.artifacts.limits import check_keras_archive as check_archive
    from bnfix.artifacts.model import ArtifactError

    if not zipfile.is_zipfile(model):
        return  # Keras' loader says what it is
    try:
        check_archive(model)
    except ArtifactError as exc:
        raise ConversionError(str(exc)) from None


def check_output(output: str) -> None:
    """OutputError unless OUTPUT names a file that can be created or replaced."""
    path = Path(output)
    if output.endswith(os.sep) or path.is_dir():
        raise OutputError("is a folder: give the file to write, e.g. -o folder/model.onnx")
    folder = path.parent
    if not folder.is_dir():
        raise OutputError(f"the folder {folder} does not exist")
    if path.exists() and not path.is_file():
        raise OutputError("exists and is not a regular file")
    try:  # a real probe: permissions, read-only file systems, /proc
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe",
                                     dir=folder.resolve())
    except OSError as exc:
        raise OutputError(f"cannot write into {folder}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)


def _new_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def atomic_output(output: str, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path next to OUTPUT to write the result to; on a normal exit it replaces
    OUTPUT (mode kept, or the umask's for a new file), on an exception it is removed."""
    target = Path(output)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix,
                                    dir=target.resolve().parent)
    except OSError as exc:
        raise OutputError(f"cannot create a file there: {exc.strerror or exc}") from None
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode) if target.is_file() else \
                _new_file_mode()
            os.chmod(temporary, mode)
            os.replace(temporary, target)
        except OSError as exc:
            raise OutputError(f"cannot write it: {exc.strerror or exc}") from None
    finally:
        temporary.unlink(missing_ok=True)

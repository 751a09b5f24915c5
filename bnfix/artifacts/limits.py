"""How much an artifact may make bnfix allocate: one budget, checked against what the file
*declares* before anything is read.

A hostile or corrupt artifact can declare far more than it holds: a zip member that inflates to
gigabytes, an HDF5 dataset of 3e9 elements stored as a fill value, a tensor whose shape says more
than its bytes. Every reader asks `check` with the declared size before it reads or allocates,
reads only the BN tensors (vectors of a few thousand values in any real model), and never
converts a whole tensor to float64 unless its size was checked. What exceeds the budget is
refused with one BN902 line; nothing is allocated for it.

The budget is `--max-tensor-bytes` (default 256 MiB, far above any BN vector or model config,
far below the memory of the machines bnfix runs on) and applies to each single thing read: a
tensor, a config, a pickle.
"""

from __future__ import annotations

import contextvars
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager

from bnfix.artifacts.model import ArtifactError

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
_BUDGET: contextvars.ContextVar[int] = contextvars.ContextVar("bnfix_max_tensor_bytes",
                                                              default=DEFAULT_MAX_BYTES)


def budget() -> int:
    """The bytes one read may allocate (see the module docstring)."""
    return _BUDGET.get()


@contextmanager
def limited(max_bytes: int) -> Iterator[None]:
    """Run the readers inside with another budget."""
    token = _BUDGET.set(max_bytes)
    try:
        yield
    finally:
        _BUDGET.reset(token)


def human(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # unreachable; keeps type checkers content


def check(what: str, declared: int, file_size: int | None = None) -> None:
    """ArtifactError when `what` declares more bytes than the budget, or (for data that must be
    stored as is: `file_size` given) more than the file holds."""
    if declared < 0:
        raise ArtifactError(f"{what}: declares a negative size ({declared})")
    if file_size is not None and declared > file_size:
        raise ArtifactError(f"{what}: declares {human(declared)}, more than the whole file "
                            f"({human(file_size)}): truncated or forged")
    limit = budget()
    if declared > limit:
        raise ArtifactError(f"{what}: declares {human(declared)}, over the "
                            f"{human(limit)} limit for one tensor (--max-tensor-bytes): "
                            "refused before reading it")


def check_elements(what: str, count: int, itemsize: int) -> None:
    """`check` for `count` values that will be read as `itemsize`-byte values and then as
    float64 (the copy the rules compute on)."""
    check(what, count * max(itemsize, 8))


def check_keras_archive(path: str) -> None:
    """ArtifactError when a member of a `.keras` archive that Keras reads whole declares more
    than the budget: any compressed member, and config.json however stored (a forged 3 GB
    config deflates into 3 MB). Stored members are bounded by the file itself. (Here, not with
    the Keras reader: `convert` calls it before numpy or Keras is imported.)"""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError) as exc:
        raise ArtifactError(f"not a Keras v3 file: {exc}") from exc
    for info in members:
        if info.compress_type != zipfile.ZIP_STORED or info.filename.endswith(".json"):
            check(f"`{info.filename}` in the archive", info.file_size)

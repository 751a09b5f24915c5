"""What the conversions the diagnoses recommend share across frameworks (imports no framework)."""

from __future__ import annotations


def group_count(channels: int, groups: int) -> int | None:
    """The GroupNorm group count for a layer: `groups` when it divides `channels`, else the
    largest divisor of `channels` below it; None when only 1 is (one group is LayerNorm, not
    what was asked for)."""
    for candidate in range(min(groups, channels), 1, -1):
        if channels % candidate == 0:
            return candidate
    return None

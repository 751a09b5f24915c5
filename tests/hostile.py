"""Hostile artifacts, generated on the fly and small on disk: zip archives whose members inflate
to gigabytes, written without ever holding the inflated bytes."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20


@dataclass(frozen=True)
class Inflating:
    """A deflated member of `size` bytes of `fill` (built from one deflated chunk, repeated)."""

    size: int
    fill: bytes = b"\0"


def _deflated(member: Inflating) -> tuple[bytes, int]:
    """(raw deflate stream, crc32) of `member`; ~1 KB on disk per MiB inflated."""
    chunk = member.fill * CHUNK
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    count, rest = divmod(member.size, CHUNK)
    tail_compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    tail = tail_compressor.compress(member.fill * rest) + tail_compressor.flush()
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(chunk, crc)
    crc = zlib.crc32(member.fill * rest, crc)
    return block * count + tail, crc


def write_zip(path: Path, members: dict[str, bytes | Inflating]) -> Path:
    """A zip archive (no zip64: members under 4 GiB) with stored or inflating members."""
    out = bytearray()
    central = bytearray()
    for name, content in members.items():
        raw_name = name.encode()
        if isinstance(content, Inflating):
            data, crc = _deflated(content)
            method, size = 8, content.size
        else:
            data, crc, method, size = content, zlib.crc32(content), 0, len(content)
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(data),
                           size, len(raw_name), 0) + raw_name + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc,
                               len(data), size, len(raw_name), 0, 0, 0, 0, 0,
                               offset) + raw_name
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central),
                      len(out), 0)
    path.write_bytes(bytes(out + central + end))
    return path

"""CRC-32, the one of ``zlib.crc32`` (ISO-HDLC polynomial): the envelope's checksum and the
checks of chunked transfers.

zlib-ng computes the same function with carry-less multiplication (SIMD): here ~100x faster than
the system zlib 1.2.13, which goes a few bytes at a time (0.4-1 GB/s on this machine, where a
4 MB envelope's checksum cost several ms on each side of an exchange: benchmarks/overhead).
zlib-ng is used where its wheel installs (x86-64 and 64-bit ARM: pyproject.toml), zlib's
elsewhere (32-bit ARM). The values are the same, so a fleet may mix both.
"""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # no wheel for this platform: the same values, computed slower
    from zlib import crc32

__all__ = ["crc32"]

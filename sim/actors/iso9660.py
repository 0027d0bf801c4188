"""A minimal, real ISO 9660 image with an El Torito boot record, made deterministically.

What the simulated image service serves, and what tests feed the operator's ISO
check: a valid ISO 9660 volume (ECMA-119) that independent readers (pycdlib,
libmagic's `file`) take for a bootable CD image:

    sector  0-15   system area (zeros)
    sector  16     primary volume descriptor (volume space = the image, 2 KiB blocks)
    sector  17     El Torito boot record volume descriptor -> boot catalog (omitted,
                   with `bootable=False`: then a supplementary-less plain volume)
    sector  18     volume descriptor set terminator
    sector  19     boot catalog: validation entry + default entry (no emulation)
    sector  20/21  type L / type M path tables (the root directory only)
    sector  22     root directory: ".", "..", BOOT.CAT;1, BOOT.IMG;1, DISCOVERY.IMG;1
    sector  23     boot image (one sector, four virtual 512-byte sectors)
    sector  24-    DISCOVERY.IMG: `payload`, then pseudo-random filler to the end

The volume is `size // 2048` blocks; the bytes after the last whole block (when
`size` is not a multiple of 2048) are padding after the volume, as `isohybrid`
leaves. Dates are fixed, so the same arguments always give the same bytes.
"""

from __future__ import annotations

import random
import struct
from typing import Final

__all__ = ["MIN_SIZE", "SECTOR", "build_iso"]

SECTOR: Final = 2048
_ROOT: Final = 22
_CATALOG: Final = 19
_BOOT_IMAGE: Final = 23
_DATA: Final = 24
MIN_SIZE: Final = (_DATA + 1) * SECTOR
"""The smallest image this builder makes (one sector of data)."""

_DIR_DATE: Final = bytes([124, 1, 1, 0, 0, 0, 0])  # 2024-01-01 00:00:00 UTC (years since 1900)
_VOL_DATE: Final = b"2024010100000000\x00"
_NO_DATE: Final = b"0000000000000000\x00"


def _both32(value: int) -> bytes:
    return struct.pack("<I", value) + struct.pack(">I", value)


def _both16(value: int) -> bytes:
    return struct.pack("<H", value) + struct.pack(">H", value)


def _record(name: bytes, *, extent: int, length: int, directory: bool = False) -> bytes:
    """A directory record (ECMA-119 9.1)."""
    pad = b"\x00" if len(name) % 2 == 0 else b""
    body = (
        bytes([0])  # extended attribute record length
        + _both32(extent)
        + _both32(length)
        + _DIR_DATE
        + bytes([2 if directory else 0, 0, 0])  # flags, file unit size, interleave gap
        + _both16(1)  # volume sequence number
        + bytes([len(name)])
        + name
        + pad
    )
    return bytes([len(body) + 1]) + body


def _text(value: str, width: int) -> bytes:
    return value.encode("ascii").ljust(width, b" ")


def _pvd(*, volume_id: str, blocks: int, root: bytes) -> bytes:
    """The primary volume descriptor (ECMA-119 8.4)."""
    pvd = bytearray(SECTOR)
    pvd[0:7] = b"\x01CD001\x01"
    pvd[8:40] = _text("LINUX", 32)
    pvd[40:72] = _text(volume_id, 32)
    pvd[80:88] = _both32(blocks)
    pvd[120:124] = _both16(1)  # volume set size
    pvd[124:128] = _both16(1)  # volume sequence number
    pvd[128:132] = _both16(SECTOR)
    pvd[132:140] = _both32(10)  # path table size: the root's record
    pvd[140:144] = struct.pack("<I", _ROOT - 2)  # type L path table
    pvd[148:152] = struct.pack(">I", _ROOT - 1)  # type M path table
    pvd[156:190] = root
    pvd[190:318] = _text("", 128)  # volume set
    pvd[318:446] = _text("", 128)  # publisher
    pvd[446:574] = _text("", 128)  # data preparer
    pvd[574:702] = _text("AGENT-FORGE SIMULATOR", 128)
    pvd[702:813] = _text("", 111)  # copyright, abstract, bibliographic file ids
    pvd[813:830] = _VOL_DATE
    pvd[830:847] = _VOL_DATE
    pvd[847:864] = _NO_DATE
    pvd[864:881] = _NO_DATE
    pvd[881] = 1  # file structure version
    return bytes(pvd)


def _boot_record() -> bytes:
    """The El Torito boot record volume descriptor (El Torito 1.0, 2.0)."""
    record = bytearray(SECTOR)
    record[0:7] = b"\x00CD001\x01"
    record[7:39] = b"EL TORITO SPECIFICATION".ljust(32, b"\x00")
    record[71:75] = struct.pack("<I", _CATALOG)
    return bytes(record)


def _catalog() -> bytes:
    """Validation entry (its words sum to zero) and a bootable no-emulation entry."""
    validation = bytearray(32)
    validation[0] = 1  # header id
    validation[1] = 0  # platform: 80x86
    validation[4:28] = b"AGENT-FORGE".ljust(24, b"\x00")
    validation[30:32] = b"\x55\xaa"
    words = sum(struct.unpack("<16H", bytes(validation)))
    validation[28:30] = struct.pack("<H", (-words) & 0xFFFF)
    default = bytearray(32)
    default[0] = 0x88  # bootable
    default[1] = 0  # no emulation
    default[6:8] = struct.pack("<H", 4)  # four virtual sectors
    default[8:12] = struct.pack("<I", _BOOT_IMAGE)
    return bytes(validation + default).ljust(SECTOR, b"\x00")


def _path_table(big_endian: bool) -> bytes:
    order = ">" if big_endian else "<"
    entry = bytes([1, 0]) + struct.pack(f"{order}IH", _ROOT, 1) + b"\x00\x00"
    return entry.ljust(SECTOR, b"\x00")


def build_iso(
    *, volume_id: str, size: int, payload: bytes = b"", seed: str = "", bootable: bool = True
) -> bytes:
    """An ISO 9660 image of exactly `size` bytes (see the module doc for the layout)."""
    if size < MIN_SIZE:
        raise ValueError(f"an image needs at least {MIN_SIZE} bytes")
    blocks = size // SECTOR
    data_length = (blocks - _DATA) * SECTOR
    if len(payload) > data_length:
        raise ValueError("the payload does not fit")
    root_length = SECTOR
    root = [
        _record(b"\x00", extent=_ROOT, length=root_length, directory=True),
        _record(b"\x01", extent=_ROOT, length=root_length, directory=True),
        _record(b"BOOT.CAT;1", extent=_CATALOG, length=SECTOR),
        _record(b"BOOT.IMG;1", extent=_BOOT_IMAGE, length=SECTOR),
        _record(b"DISCOVERY.IMG;1", extent=_DATA, length=data_length),
    ]
    terminator = b"\xffCD001\x01".ljust(SECTOR, b"\x00")
    sectors = [
        bytes(16 * SECTOR),
        _pvd(volume_id=volume_id, blocks=blocks, root=root[0]),
        _boot_record() if bootable else terminator,
        terminator if bootable else bytes(SECTOR),
        _catalog(),
        _path_table(big_endian=False),
        _path_table(big_endian=True),
        b"".join(root).ljust(SECTOR, b"\x00"),
        b"\xfa\xf4\xeb\xfd".ljust(SECTOR, b"\x00"),  # cli; hlt; jmp $-1
    ]
    header = b"".join(sectors)
    filler = random.Random(seed).randbytes(size - len(header) - len(payload))
    return header + payload + filler

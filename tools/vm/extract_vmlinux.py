#!/usr/bin/env python3
"""Write the uncompressed ELF kernel held in a Debian bzImage (XZ-compressed) to a file.

QEMU boots an ELF vmlinux through its PVH entry point, which skips the kernel's own
decompression: seconds under TCG. Usage: extract_vmlinux.py BZIMAGE VMLINUX
"""

import lzma
import sys
from pathlib import Path

XZ_MAGIC = b"\xfd7zXZ\x00"


def main(bzimage: str, vmlinux: str) -> None:
    data = Path(bzimage).read_bytes()
    start = data.find(XZ_MAGIC)
    if start < 0:
        sys.exit(f"{bzimage}: no XZ payload (not a Debian bzImage?)")
    kernel = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
    if kernel[:4] != b"\x7fELF":
        sys.exit(f"{bzimage}: the XZ payload is not an ELF kernel")
    Path(vmlinux).write_bytes(kernel)


if __name__ == "__main__":
    main(*sys.argv[1:])

#!/usr/bin/env python3
"""Did a refactor change the machine code? Compare the kernels of two cubins.

A change that only moves device code around (a repeated block made into a lambda, a loop
hoisted into a helper) should leave every kernel's instructions as they were, and then the
numbers measured before it still describe the code after it. This checks that without a GPU
and without cuobjdump: it reads the two ELF files itself and compares, kernel by kernel, the
bytes of each `.text.<kernel>` section (the SASS), and of the sections that go with it
(relocations, constant banks, kernel info). Kernels are matched by name with the
anonymous-namespace tag removed, since that tag depends on the source file's path.

    # the same compile command twice, before and after the change (no -lineinfo needed)
    nvcc -arch=sm_90a -cubin -O3 -std=c++17 --expt-relaxed-constexpr -I. -Ichapters/06_variants \\
         chapters/06_variants/gqa_mla/mla_decode_sm90.cu -o /tmp/before.cubin
    ... edit ...
    nvcc ... -o /tmp/after.cubin
    python3 scripts/same_machine_code.py /tmp/before.cubin /tmp/after.cubin

Exit status 0 when every kernel's sections are byte-identical, 1 otherwise (each kernel that
differs is listed with its code size before and after), 2 on bad input.
"""
import hashlib
import re
import struct
import sys

ANON = re.compile(r"\d+_GLOBAL__N__\w+?_[0-9a-f]{8}(?=\d)")  # its length prefix too
# the sections that belong to one kernel, by prefix (its name follows)
KERNEL_SECTIONS = (".text.", ".rela.text.", ".rel.text.", ".nv.constant0.", ".nv.info.", ".nv.shared.")


def sections(path):
    """{name: bytes} of an ELF64 little-endian file (a cubin)."""
    with open(path, "rb") as f:
        d = f.read()
    if d[:4] != b"\x7fELF" or d[4] != 2 or d[5] != 1:
        raise ValueError(path + ": not a 64-bit little-endian ELF file (a cubin)")
    shoff = struct.unpack_from("<Q", d, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    hdr = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    names = hdr[shstrndx][4]
    out = {}
    for h in hdr:
        name = d[names + h[0]:d.index(b"\0", names + h[0])].decode()
        out[name] = b"" if h[1] == 8 else d[h[4]:h[4] + h[5]]  # SHT_NOBITS has no bytes in the file
    return out


def kernels(path):
    """{kernel: {section kind: sha1}} and {kernel: code size}."""
    per, size = {}, {}
    for name, data in sections(path).items():
        for kind in KERNEL_SECTIONS:
            if name.startswith(kind):
                k = ANON.sub("", name[len(kind):])
                per.setdefault(k, {})[kind] = hashlib.sha1(data).hexdigest()
                if kind == ".text.":
                    size[k] = len(data)
    return per, size


def main(argv):
    if len(argv) != 3:
        print("usage: same_machine_code.py BEFORE.cubin AFTER.cubin", file=sys.stderr)
        return 2
    try:
        (a, sa), (b, sb) = kernels(argv[1]), kernels(argv[2])
    except (OSError, ValueError, struct.error) as e:
        print("same_machine_code.py: " + str(e), file=sys.stderr)
        return 2
    names = sorted(set(sa) | set(sb))
    if not names:
        print("same_machine_code.py: no kernels in either file", file=sys.stderr)
        return 2
    differ = [k for k in names if a.get(k) != b.get(k)]
    for k in differ:
        print("differs: %s (code %s -> %s bytes)" % (k, sa.get(k, "absent"), sb.get(k, "absent")))
    print("%d of %d kernels byte-identical" % (len(names) - len(differ), len(names)))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

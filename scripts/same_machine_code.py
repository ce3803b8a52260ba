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

Two kernels of different names (a final kernel's instantiation against the lab step whose
configuration it takes, say) are compared with --pair: the one kernel of A whose name matches
the regular expression RA against the one of B matching RB, by their SASS (.text) alone,
since their names, and so their relocations and symbol tables, differ by construction:

    python3 scripts/same_machine_code.py --pair 'v23.*kernelIN.*Li128ELb0E' 'final_fwd.*Li128ELb0E' A.cubin B.cubin
"""
import hashlib
import re
import struct
import sys

_TAG = re.compile(r"_GLOBAL__N__\w+?_[0-9a-f]{8}(?=\d)")


class _Anon:
    """Removes the anonymous-namespace tag with its length prefix, and only its own digits:
    in `9final_fp848_GLOBAL__N__...` the prefix is 48 (the tag's length), not 848."""

    @staticmethod
    def sub(repl, name):
        out, at = [], 0
        for m in _TAG.finditer(name):
            start = m.start()
            for k in (1, 2, 3):
                digits = name[start - k:start]
                if len(digits) == k and digits.isdigit() and int(digits) == m.end() - start:
                    start -= k
                    break
            out.append(name[at:start] + repl)
            at = m.end()
        return "".join(out) + name[at:]


ANON = _Anon()  # the tag depends on the source file's path
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


def pair(ra, rb, path_a, path_b):
    """0 when the one kernel of path_a matching ra has the SASS of the one of path_b matching rb."""
    found = []
    for rx, path in ((ra, path_a), (rb, path_b)):
        texts = {ANON.sub("", n[len(".text."):]): d for n, d in sections(path).items() if n.startswith(".text.")}
        hits = sorted(k for k in texts if re.search(rx, k))
        if len(hits) != 1:
            print("same_machine_code.py: %r matches %d kernels of %s%s" % (rx, len(hits), path,
                  "".join("\n  " + h for h in hits) if hits else ""), file=sys.stderr)
            return 2
        found.append((hits[0], texts[hits[0]]))
    (ka, ta), (kb, tb) = found
    same = ta == tb
    print("%s: %s (%d bytes) vs %s (%d bytes)" % ("same SASS" if same else "SASS differs", ka, len(ta), kb, len(tb)))
    return 0 if same else 1


def main(argv):
    if len(argv) == 6 and argv[1] == "--pair":
        try:
            return pair(argv[2], argv[3], argv[4], argv[5])
        except (OSError, ValueError, struct.error, re.error) as e:
            print("same_machine_code.py: " + str(e), file=sys.stderr)
            return 2
    if len(argv) != 3:
        print("usage: same_machine_code.py BEFORE.cubin AFTER.cubin | --pair RA RB A.cubin B.cubin", file=sys.stderr)
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

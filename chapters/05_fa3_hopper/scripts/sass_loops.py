#!/usr/bin/env python3
"""Local memory inside the main loops of chapter 05's kernels, from their SASS (no GPU).

    cuobjdump -sass build/.../v11_two_pipe_exp.cu.o | python3 chapters/05_fa3_hopper/scripts/sass_loops.py [--mix]

For every kernel it prints the HGMMA / QGMMA count, the LDL / STL count in the whole
kernel, and the LDL / STL inside its tensor-core loops: the address ranges closed by a
backward branch (`BRA` to a lower address) that contain a wgmma (HGMMA or QGMMA) and
no other such range (the key-block loops, not the persistent walk around them). The
project's SASS check asks for wgmma in every main loop and no local memory there; local
memory in a tile's set-up (outside those ranges) costs a few loads per tile, not per
key block. --mix adds the instructions of the key-block loop by opcode: what one key block
costs a consumer thread in issue slots (a warp issues one instruction a clock).
"""
import re
import sys

FUNC = re.compile(r"Function : (\S+)")
INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRA = re.compile(r"\bBRA\b(?:\.\w+)*\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")


def short(name):
    m = re.search(r"4ch05(\d?v\d+|b\d+)\d*_GLOBAL__N__\w+?_\d+_(\w+?)_cu_[0-9a-f]+(6kernel\w*)", name)
    if not m:
        return name[:100]
    args = re.sub(r"EEEv14CUtensorMap.*|EEEv.*", "", m.group(3)[len("6kernelI"):])
    args = args.replace("13__nv_bfloat16", "bf16").replace("6__half", "fp16").replace("Li", " d=").replace("ELb", " causal=")
    return f"{m.group(2)}<{args}>"


MIX = False


def analyse(name, ins):
    loops = []
    for k, (addr, text) in enumerate(ins):
        m = BRA.search(text)
        if m and m.group(1):
            target = int(m.group(1), 16)
            # An mbarrier wait's out-of-line retry (TRYWAIT; @!P BRA itself; BRA back into
            # the code it came from) jumps back too, but it is no loop around that code.
            retry = not text.lstrip().startswith("@") and k >= 2 and "TRYWAIT" in ins[k - 2][1]
            if target < addr and not retry:
                loops.append((target, addr))
    mma = [a for a, t in ins if "HGMMA" in t or "QGMMA" in t]
    lmem = [a for a, t in ins if re.search(r"\b(LDL|STL)\b", t)]
    mma_loops = [(lo, hi) for lo, hi in loops if any(lo <= a <= hi for a in mma)]
    # The key-block loops: wgmma loops with no other wgmma loop inside (the persistent
    # walk over tiles is a wgmma loop too, around them, with the tile's set-up).
    mma_loops = [(lo, hi) for lo, hi in mma_loops
                 if not any((lo2, hi2) != (lo, hi) and lo <= lo2 and hi2 <= hi for lo2, hi2 in mma_loops)]
    in_loop = sorted({a for a in lmem for lo, hi in mma_loops if lo <= a <= hi})
    h = sum("HGMMA" in t for _, t in ins)
    q = sum("QGMMA" in t for _, t in ins)
    print(f"HGMMA {h:4d}  QGMMA {q:4d}  LDL/STL {len(lmem):3d}  in wgmma loops {len(in_loop):3d}  "
          f"({len(mma_loops)} key-block loops)  {short(name)}")
    if MIX:
        for lo, hi in mma_loops:
            ops = {}
            for a, t in ins:
                if lo <= a <= hi:
                    op = re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                    ops[op] = ops.get(op, 0) + 1
            top = sorted(ops.items(), key=lambda kv: -kv[1])
            print(f"    loop 0x{lo:x}-0x{hi:x}: {sum(ops.values())} instructions: " +
                  ", ".join(f"{k} {v}" for k, v in top[:14]))
    return len(in_loop)


def main():
    global MIX
    MIX = "--mix" in sys.argv[1:]
    name, ins, bad = None, [], 0
    for line in sys.stdin:
        m = FUNC.search(line)
        if m:
            if name:
                bad += analyse(name, ins) > 0
            name, ins = m.group(1), []
            continue
        m = INS.search(line)
        if m and name:
            ins.append((int(m.group(1), 16), m.group(2)))
    if name:
        bad += analyse(name, ins) > 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

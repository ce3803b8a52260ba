#!/usr/bin/env python3
"""The study site's generated pictures: plain SVG, written by hand from the loop structure.

    python3 docs/figures.py OUT_DIR

writes loop_order.svg (FA1 against FA2), warp_ownership.svg (split-K against split-Q),
producer_consumer.svg (chapter 05's warp specialisation) and pingpong.svg (its two
consumer warpgroups taking turns). Nothing here is measured: the timelines show the
order of events, not their durations.
"""
import os
import sys
from xml.sax.saxutils import escape

FONT = 'font-family="Helvetica, Arial, sans-serif"'
BLUE, ORANGE, GREEN, GREY, RED = '#4a6fa5', '#c0762c', '#4b8b4b', '#888888', '#b04040'
WARP = ['#4a6fa5', '#c0762c', '#4b8b4b', '#8a5aa8']


class Svg:
    def __init__(self, w, h):
        self.w, self.h, self.items = w, h, []

    def rect(self, x, y, w, h, fill, stroke='#555555', sw=1, rx=0, opacity=1.0):
        self.items.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rx}" '
                          f'fill="{fill}" fill-opacity="{opacity}" stroke="{stroke}" stroke-width="{sw}"/>')

    def text(self, x, y, s, size=12, anchor='start', color='#222222', weight='normal'):
        self.items.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
                          f'fill="{color}" font-weight="{weight}" {FONT}>{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, color='#555555', sw=1.5, arrow=False, dash=None):
        extra = ' marker-end="url(#arrow)"' if arrow else ''
        extra += f' stroke-dasharray="{dash}"' if dash else ''
        self.items.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                          f'stroke="{color}" stroke-width="{sw}"{extra}/>')

    def save(self, path, title):
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
                f'viewBox="0 0 {self.w} {self.h}" role="img">\n<title>{escape(title)}</title>\n'
                '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
                'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555555"/>'
                '</marker></defs>\n<rect width="100%" height="100%" fill="#ffffff"/>\n')
        with open(path, 'w', encoding='utf-8') as fh:
            fh.write(head + '\n'.join(self.items) + '\n</svg>\n')


def loop_order(path):
    """FA1: K/V blocks outside, every Q block inside (O_i goes back to HBM each time).
    FA2: one thread block per Q block, K/V blocks inside (O_i stays in registers)."""
    tr, tc, cell = 4, 5, 34
    s = Svg(820, 350)
    for panel, (x0, title, sub) in enumerate([
            (40, 'FlashAttention-1 (chapter 03)', 'outer loop: K/V block j; inner loop: every Q block i'),
            (450, 'FlashAttention-2 (chapter 04)', 'outer: one thread block per Q block i; inner: K/V block j')]):
        y0 = 78
        s.text(x0, 24, title, 15, weight='bold')
        s.text(x0, 44, sub, 11, color='#444444')
        s.text(x0 + tc * cell / 2, y0 - 10, 'K/V blocks j = 0 .. Tc-1  →', 11, 'middle')
        for i in range(tr):
            s.text(x0 - 8, y0 + i * cell + cell / 2 + 4, f'Q{i}', 11, 'end')
            for j in range(tc):
                order = (j * tr + i) if panel == 0 else (i * tc + j)
                fill = BLUE if panel == 0 else WARP[i]
                shade = 0.18 + 0.62 * (order / (tr * tc - 1)) if panel == 0 else 0.25 + 0.55 * j / (tc - 1)
                s.rect(x0 + j * cell, y0 + i * cell, cell - 2, cell - 2, fill, opacity=shade)
                s.text(x0 + j * cell + cell / 2 - 1, y0 + i * cell + cell / 2 + 4, str(order + 1), 10, 'middle')
        yb = y0 + tr * cell + 16
        if panel == 0:
            for j in range(tc):
                s.line(x0 + j * cell + cell / 2 - 1, y0 + 2, x0 + j * cell + cell / 2 - 1, y0 + tr * cell - 6,
                       GREY, 1, arrow=True, dash='3,2')
            lines = ['numbers: the order of the block products;',
                     'one thread block per (batch, head) walks them all.',
                     'K_j, V_j are loaded once; Q_i, O_i, l_i, m_i are read and written',
                     'back to HBM for every j: Tc round trips of the running output',
                     'traffic Θ(N² d² / M) with M the on-chip memory']
        else:
            for i in range(tr):
                s.line(x0 + 4, y0 + i * cell + cell / 2 - 1, x0 + tc * cell - 8, y0 + i * cell + cell / 2 - 1,
                       GREY, 1, arrow=True, dash='3,2')
            lines = ['colours: one thread block per row of blocks (the grid is Tr × B·H)',
                     'Q_i is loaded once; (m_i, l_i, O_i) live in registers for the whole row',
                     'K_j, V_j are streamed once per Q block; O_i is divided by l_i',
                     'and written once at the end, with LSE_i = m_i + log l_i']
        for k, t in enumerate(lines):
            s.text(x0, yb + 16 * k + 8, t, 11, color='#333333')
    s.save(path, 'Loop orders of FlashAttention-1 and FlashAttention-2')


def warp_ownership(path):
    """FA1 splits K/V across the warps of a block (split-K: partial O reduced through shared
    memory); FA2 splits Q across warps, every warp sees all of K_j, V_j (no reduction)."""
    s = Svg(820, 330)
    for panel, x0 in enumerate((40, 450)):
        title = ['split-K: FlashAttention-1', 'split-Q: FlashAttention-2'][panel]
        s.text(x0, 24, title, 15, weight='bold')
        qx, qy, qw, qh = x0, 70, 70, 160        # Q_i tile: Br rows × d
        kx, ky, kw, kh = x0 + 110, 70, 160, 70  # K_j^T tile: d × Bc
        s.text(qx + qw / 2, qy - 8, 'Q_i (Br × d)', 11, 'middle')
        s.text(kx + kw / 2, ky - 8, 'K_jᵀ, V_j (Bc keys)', 11, 'middle')
        for w in range(4):
            if panel == 0:
                s.rect(qx, qy, qw, qh, '#dddddd') if w == 0 else None
                s.rect(kx + w * kw / 4, ky, kw / 4, kh, WARP[w], opacity=0.55)
                s.rect(kx + w * kw / 4, ky + 90, kw / 4, qh - 90, WARP[w], opacity=0.35)
            else:
                s.rect(qx, qy + w * qh / 4, qw, qh / 4, WARP[w], opacity=0.55)
                s.rect(kx, ky + 90 + w * (qh - 90) / 4, kw, (qh - 90) / 4, WARP[w], opacity=0.35)
                s.rect(kx, ky, kw, kh, '#dddddd', opacity=0.6) if w == 0 else None
        s.text(kx + kw / 2, ky + 84, 'S_ij = Q_i K_jᵀ (Br × Bc)', 11, 'middle')
        if panel == 0:
            notes = ['warp w owns the columns of K_j, V_j it loaded: S_ij[:, w],',
                     'and a *partial* O_i = P_ij[:, w] V_j[w] over its keys only.',
                     'The four partial outputs (and their row max and sum) must be',
                     'combined through shared memory: a reduction every step.']
        else:
            notes = ['warp w owns 16 rows of Q_i and sees all of K_j, V_j:',
                     'its rows of S_ij, P_ij and O_i are complete in its registers,',
                     'so the softmax and P V need no exchange between warps',
                     '(FA2 paper, Dao 2023, §3.3).']
        for k, t in enumerate(notes):
            s.text(x0, 262 + 16 * k, t, 11, color='#333333')
        for w in range(4):
            s.rect(x0 + 300, 70 + 22 * w, 14, 14, WARP[w], opacity=0.7)
            s.text(x0 + 320, 82 + 22 * w, f'warp {w}', 11)
    s.save(path, 'Which warp owns which part of the tile in FlashAttention-1 and -2')


def timeline(path, title, lanes, events, width=860, note=None):
    """lanes: [(name, colour)]; events: [(lane, start, length, label, kind)] in abstract units."""
    unit, x0, lane_h = 50, 170, 38
    end = max(e[1] + e[2] for e in events)
    h = 60 + lane_h * len(lanes) + 50 + 16 * len(note or [])
    s = Svg(max(width, int(x0 + unit * end + 30)), h)
    s.text(20, 26, title, 15, weight='bold')
    fills = {'tma': '#9bb7d9', 'gemm': BLUE, 'softmax': ORANGE, 'wait': '#eeeeee', 'store': GREEN}
    for k, (name, _c) in enumerate(lanes):
        y = 50 + lane_h * k
        s.text(x0 - 10, y + lane_h / 2 + 4, name, 11, 'end')
        s.line(x0, y + lane_h - 4, x0 + unit * end, y + lane_h - 4, '#dddddd', 1)
    for lane, start, length, label, kind in events:
        y = 50 + lane_h * lane + 4
        s.rect(x0 + unit * start, y, unit * length - 3, lane_h - 12, fills[kind], rx=3,
               opacity=0.35 if kind == 'wait' else 0.85)
        s.text(x0 + unit * (start + length / 2) - 1, y + (lane_h - 12) / 2 + 4, label, 10, 'middle',
               '#222222' if kind in ('wait', 'tma') else '#ffffff')
    ly = 50 + lane_h * len(lanes) + 14
    legend = [('tma', 'TMA copy'), ('gemm', 'WGMMA'), ('softmax', 'softmax (exp2, max, sum)'),
              ('store', 'mbarrier completes'), ('wait', 'waiting on a barrier')]
    for k, (kind, name) in enumerate(l for l in legend if any(e[4] == l[0] for e in events)):
        s.rect(x0 + 175 * k, ly, 14, 14, fills[kind], opacity=0.85 if kind != 'wait' else 0.35)
        s.text(x0 + 175 * k + 20, ly + 12, name, 11)
    if note:
        for k, t in enumerate(note):
            s.text(20, ly + 38 + 16 * k, t, 11, color='#333333')
    s.save(path, title)


def producer_consumer(path):
    """A 2-stage ring: the producer may refill stage s only after the consumers release
    empty[s], so load j waits for block j - 2 to finish its P V."""
    lanes = [('producer warpgroup', None), ('mbarriers', None), ('consumer warpgroups', None)]
    ev = [(0, 0.1, 1.0, 'TMA Q', 'tma')]
    load_end, cons_end, release = {}, 0.0, {}
    t_issue = 1.2
    for j in range(5):
        start = t_issue
        if j >= 2:
            if release[j - 2] > start:
                ev.append((0, start, release[j - 2] - start, f'wait empty[{j % 2}]', 'wait'))
            start = max(start, release[j - 2])
        ev.append((0, start, 2.0, f'TMA K{j},V{j}', 'tma'))
        load_end[j] = start + 2.0
        ev.append((1, load_end[j] - 0.55, 1.1, f'full[{j % 2}]', 'store'))
        t_issue = start + 2.1
        if j < 4:
            c0 = max(cons_end, load_end[j])
            if j == 0:
                ev.append((2, 0.1, c0 - 0.1, 'wait full[0]', 'wait'))
            ev.append((2, c0, 1.2, f'S=QK{j}ᵀ', 'gemm'))
            ev.append((2, c0 + 1.2, 1.2, 'softmax', 'softmax'))
            ev.append((2, c0 + 2.4, 1.2, f'O+=PV{j}', 'gemm'))
            cons_end = c0 + 3.6
            release[j] = cons_end
            ev.append((1, cons_end - 0.55, 1.1, f'empty[{j % 2}]', 'store'))
    timeline(path, 'Warp specialisation (chapter 05, v3): a producer warpgroup feeds the consumers', lanes, ev,
             note=['The producer (24 registers per thread, setmaxnreg.dec) only issues TMA copies into a ring of stages;',
                   'each copy completes a full[s] mbarrier, and the consumer arrives on empty[s] when it has read the stage.',
                   'The consumer (240 registers, setmaxnreg.inc) never computes an address: it waits on full[s] and multiplies.',
                   'Order of events only, not measured durations.'])


def pingpong(path):
    lanes = [('consumer warpgroup 1', None), ('consumer warpgroup 2', None), ('tensor cores', None)]
    ev = []
    t = 0.0
    for j in range(4):
        ev.append((0, t, 1.4, f'GEMMs {j}', 'gemm'))
        ev.append((0, t + 1.4, 1.4, f'exp {j}', 'softmax'))
        ev.append((1, t + 1.4, 1.4, f'GEMMs {j}', 'gemm'))
        ev.append((1, t + 2.8, 1.4, f'exp {j}', 'softmax'))
        ev.append((2, t, 1.4, 'WG1', 'gemm'))
        ev.append((2, t + 1.4, 1.4, 'WG2', 'gemm'))
        t += 2.8
    ev.append((1, 0.0, 1.4, 'wait', 'wait'))
    timeline(path, 'Pingpong (chapter 05, v4): two consumer warpgroups take turns on the tensor cores', lanes, ev,
             note=['Named barriers (bar.sync with an ID, 16 per CTA) order the two warpgroups: while one exponentiates,',
                   'the other runs its GEMMs, so the tensor cores stay busy through the softmax (FA3 paper, §3.1).',
                   'Order of events only, not measured durations.'])


def main(out):
    os.makedirs(out, exist_ok=True)
    loop_order(os.path.join(out, 'loop_order.svg'))
    warp_ownership(os.path.join(out, 'warp_ownership.svg'))
    producer_consumer(os.path.join(out, 'producer_consumer.svg'))
    pingpong(os.path.join(out, 'pingpong.svg'))


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else '.')

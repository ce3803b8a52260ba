#!/usr/bin/env python3
"""./tutorial docs --check: the study site, rendered in headless Chromium.

    python3 docs/check_site.py BUILD/docs [CHROMIUM]

Serves BUILD/docs/html on 127.0.0.1 and renders four pages in Debian's headless Chromium:
the main page, a chapter page with formulas, a diff page and the page with the measured
plots. For each it loads the page in a same-origin harness (an iframe), waits for MathJax's
queue to drain within a virtual-time budget, and dumps the harness's DOM, which holds what
the harness found: the math containers MathJax rendered, whether "Loading [MathJax]" or a
MathJax error is left, and every image with whether it loaded. It also takes a screenshot
of each page (BUILD/docs/screenshots/) and checks that every page site.json lists (each
chapter, each diff page, the index pages) exists and is not empty. Exit 0 when all hold.
"""
import functools
import http.server
import json
import os
import re
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading

HARNESS = r"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>site check</title></head>
<body><pre id="report">pending</pre>
<iframe id="page" src="%(page)s" style="width:1280px;height:900px"></iframe>
<script>
function report(obj) { document.getElementById('report').textContent = 'REPORT ' + JSON.stringify(obj); }
function inspect() {
  var doc = document.getElementById('page').contentDocument;
  var win = document.getElementById('page').contentWindow;
  var r = { title: doc.title, images: [], math: 0, math_errors: 0, loading_left: false, mathjax: !!win.MathJax };
  var imgs = doc.querySelectorAll('img');
  for (var i = 0; i < imgs.length; i++) {
    var im = imgs[i];
    if (/^javascript:/.test(im.getAttribute('src') || '')) continue;   // the search box's placeholder
    r.images.push({ src: im.getAttribute('src'), ok: im.complete && im.naturalWidth > 0,
                    w: im.naturalWidth, h: im.naturalHeight });
  }
  var objs = doc.querySelectorAll('object[type="image/svg+xml"], iframe');
  for (var k = 0; k < objs.length; k++) {
    var o = objs[k], d = null;
    if (/^javascript:/.test(o.getAttribute('src') || '')) continue;   // the search results' placeholder
    try { d = o.contentDocument; } catch (e) {}
    r.images.push({ src: o.getAttribute('data') || o.getAttribute('src'),
                    ok: !!(d && d.documentElement && d.documentElement.nodeName.toLowerCase() === 'svg') });
  }
  r.math = doc.querySelectorAll('.MathJax, .MathJax_Display, .MathJax_SVG, mjx-container').length;
  r.math_errors = doc.querySelectorAll('.MathJax_Error, merror, mjx-merror').length;
  var text = doc.body ? doc.body.innerText : '';
  r.loading_left = /Loading \[MathJax\]/.test(text) || /Processing math/.test(text);
  var msg = doc.getElementById('MathJax_Message');
  r.message = msg ? (msg.style.display === 'none' ? '' : msg.innerText) : '';
  r.raw_tex_left = (text.match(/\\f\$|\\f\[/g) || []).length;
  report(r);
}
var tries = 0;
function frameDoc() { return document.getElementById('page').contentDocument; }
function whenReady() {
  var win = document.getElementById('page').contentWindow, doc = frameDoc();
  var wants = doc.querySelectorAll('script[src*="MathJax.js"]').length > 0;
  tries++;
  if (wants && !(win.MathJax && win.MathJax.isReady) && tries < 80) { setTimeout(whenReady, 250); return; }
  if (win.MathJax && win.MathJax.Hub && win.MathJax.isReady) {
    win.MathJax.Hub.Queue(function () { waitMessage(0); });
  } else {
    inspect();
  }
}
function waitMessage(n) {   // MathJax hides its status line a moment after the queue drains
  var msg = frameDoc().getElementById('MathJax_Message');
  if (msg && msg.style.display !== 'none' && msg.innerText && n < 40) { setTimeout(function () { waitMessage(n + 1); }, 250); }
  else { inspect(); }
}
document.getElementById('page').addEventListener('load', function () { setTimeout(whenReady, 300); });
</script></body></html>
"""


def find_chromium(given=''):
    for c in [given, 'chromium', 'chromium-browser', 'google-chrome']:
        if c and shutil.which(c):
            return shutil.which(c)
    return None


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


def serve(root):
    handler = functools.partial(Quiet, directory=root)
    httpd = socketserver.ThreadingTCPServer(('127.0.0.1', 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def chromium_args(chromium, profile):
    return [chromium, '--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
            '--no-first-run', '--no-default-browser-check', '--hide-scrollbars',
            f'--user-data-dir={profile}', '--virtual-time-budget=20000']


def check(out, chromium=''):
    html_dir = os.path.join(out, 'html')
    site = json.load(open(os.path.join(out, 'site.json')))
    chromium = find_chromium(chromium)
    if not chromium:
        print('docs --check: no chromium found (apt-get install chromium)', file=sys.stderr)
        return 2
    shots = os.path.join(out, 'screenshots')
    shutil.rmtree(shots, ignore_errors=True)
    os.makedirs(shots)
    failures = []

    def need(cond, what):
        if not cond:
            failures.append(what)
        return cond

    # 1. Every page the site promises exists.
    expected = [site['main'], site['diff_index'], site['plots'], site['cheatsheet'], site['api']]
    expected += [c['html'] for c in site['chapters']] + [d['html'] for d in site['diffs']]
    for page in expected:
        p = os.path.join(html_dir, page)
        need(os.path.isfile(p) and os.path.getsize(p) > 1000, f'page missing or empty: {page}')
    need(len(site['chapters']) > 0, 'no chapter pages')
    need(len(site['diffs']) > 0, 'no diff pages')
    for c in site['chapters']:
        p = os.path.join(html_dir, c['html'])
        if os.path.isfile(p):
            text = open(p, encoding='utf-8').read()
            for src in re.findall(r'<(?:img[^>]*\bsrc|object[^>]*\bdata)="([^"]+)"', text):
                if not re.match(r'^[a-z]+:', src):
                    need(os.path.isfile(os.path.join(html_dir, src)), f'{c["html"]}: picture {src} is missing')
            need('Step diffs' in text or not any(d['chapter'] == c['nn'] for d in site['diffs']),
                 f'{c["html"]}: no links to its step diffs')

    # 2. Four pages in the browser.
    with_math = [c for c in site['chapters'] if c['formulas']]
    chapter = next((c for c in with_math if c['nn'] == '02'), with_math[0] if with_math else None)
    diff = next((d for d in site['diffs'] if d['cross']), site['diffs'][0] if site['diffs'] else None)
    pages = [('main', site['main'], False, False), ('chapter', chapter['html'] if chapter else None, True, False),
             ('diff', diff['html'] if diff else None, False, False), ('plots', site['plots'], False, True)]
    harness = os.path.join(html_dir, '_check_harness.html')
    httpd = serve(html_dir)
    base = f'http://127.0.0.1:{httpd.server_address[1]}/'
    profile = tempfile.mkdtemp(prefix='docs-check-')
    try:
        for name, page, want_math, want_image in pages:
            if not need(page is not None, f'no {name} page to render'):
                continue
            with open(harness, 'w') as fh:
                fh.write(HARNESS % {'page': page})
            dom = subprocess.run(chromium_args(chromium, profile) + ['--dump-dom', base + '_check_harness.html'],
                                 capture_output=True, text=True, timeout=180).stdout
            shot = os.path.join(shots, f'{name}.png')
            subprocess.run(chromium_args(chromium, profile) + ['--window-size=1280,1600', f'--screenshot={shot}',
                                                                base + page],
                           capture_output=True, text=True, timeout=180)
            m = re.search(r'REPORT (\{.*?\})</pre>', dom, re.S)
            if not need(m, f'{name} ({page}): the harness reported nothing (page did not load?)'):
                continue
            r = json.loads(m.group(1).replace('&amp;', '&').replace('&lt;', '<').replace('&gt;', '>')
                           .replace('&quot;', '"'))
            bad = [i['src'] for i in r['images'] if not i['ok']]
            print(f'docs --check: {name:<8} {page}: "{r["title"]}", {r["math"]} math containers, '
                  f'{len(r["images"]) - len(bad)}/{len(r["images"])} images loaded; screenshot {os.path.relpath(shot, os.getcwd())}')
            need(not r['loading_left'], f'{page}: "Loading [MathJax]" is still on the page')
            need(not r['message'], f'{page}: MathJax message left: {r["message"]!r}')
            need(r['math_errors'] == 0, f'{page}: {r["math_errors"]} MathJax errors')
            need(r['raw_tex_left'] == 0, f'{page}: {r["raw_tex_left"]} unrendered \\f$ / \\f[ left')
            need(not bad, f'{page}: images that did not load: {bad}')
            need(os.path.isfile(shot) and os.path.getsize(shot) > 10000, f'{page}: no screenshot')
            if want_math:
                need(r['mathjax'] and r['math'] >= 5, f'{page}: MathJax rendered {r["math"]} formulas')
            if want_image:
                plots = [i for i in r['images'] if os.path.basename(i['src'] or '') in site['plot_files']]
                need(plots and all(i['ok'] for i in plots),
                     f'{page}: no measured plot loaded on the page' + ('' if site['plot_files'] else
                     ' (none recorded: bench commits recorded copies under bench/, or run ./tutorial bench '
                     'on a GPU so that BUILD_DIR/bench/*.png exist)'))
    finally:
        httpd.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
        if os.path.exists(harness):
            os.remove(harness)
    for f in failures:
        print(f'docs --check: FAIL {f}', file=sys.stderr)
    if failures:
        return 1
    print(f'docs --check: {len(expected)} pages exist; main, chapter {chapter["nn"]}, {diff["html"]} and the '
          f'plots rendered in {os.path.basename(chromium)} with MathJax and every image; screenshots in '
          f'{os.path.relpath(shots, os.getcwd())}/')
    return 0


if __name__ == '__main__':
    sys.exit(check(os.path.abspath(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ''))

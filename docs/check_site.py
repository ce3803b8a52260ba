#!/usr/bin/env python3
"""./tutorial docs --check: the study site, rendered in headless Chromium.

    python3 docs/check_site.py BUILD/docs [CHROMIUM]
    python3 docs/check_site.py BUILD/docs --no-browser     the checks of the pages' files only

Serves BUILD/docs/html on 127.0.0.1 and renders four pages in Debian's headless Chromium:
the main page, a chapter page with formulas, a diff page and the page with the measured
plots (and each chapter's lab page, where a chapter has a LAB.md). For each it loads the page in a same-origin harness (an iframe), waits for MathJax's
queue to drain within a virtual-time budget, and dumps the harness's DOM, which holds what
the harness found: the math containers MathJax rendered, whether "Loading [MathJax]" or a
MathJax error is left, and every image with whether it loaded. It also takes a screenshot
of each page (BUILD/docs/screenshots/) and checks that every page site.json lists (each
chapter, each diff page, the index pages, each lab page) exists and is not empty, and that
the reading path holds: the main page lists every chapter with its reading time and the
total, and no lab step; a chapter's page links its main-path diffs and its lab page, not the
lab's diffs; a lab page links its chapter, each of its lab diffs, and says its reading time.
Exit 0 when all hold (2: no Chromium, after the file checks).
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


def links_of(path):
    """The hrefs of a page (without their #anchor)."""
    if not os.path.isfile(path):
        return set()
    with open(path, encoding='utf-8', errors='replace') as fh:
        return {h.split('#', 1)[0] for h in re.findall(r'href="([^"]+)"', fh.read())}


def check_files(out, site, need):
    """The checks that need no browser: the pages site.json lists, their pictures, the links of
    the reading path (chapters, main-path diffs, lab pages). Returns the pages expected."""
    html_dir = os.path.join(out, 'html')
    expected = [site['main'], site['diff_index'], site['plots'], site['cheatsheet'], site['api']]
    expected += [c['html'] for c in site['chapters']] + [d['html'] for d in site['diffs']]
    expected += [lab['html'] for lab in site.get('labs', [])]
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
            need('Step diffs' in text or not any(d['chapter'] == c['nn'] and not d.get('lab') for d in site['diffs']),
                 f'{c["html"]}: no links to its step diffs')
    # the reading path: the main page lists each chapter and its reading time, and the total
    main = os.path.join(html_dir, site['main'])
    main_text = open(main, encoding='utf-8', errors='replace').read() if os.path.isfile(main) else ''
    main_links = links_of(main)
    for c in site['chapters']:
        need(c['html'] in main_links, f'{site["main"]}: chapter {c["nn"]} is not on the reading path')
        if 'minutes' in c:
            need(re.search(r'\|\s*%d min\b|>\s*%d min\s*<' % (c['minutes'], c['minutes']), main_text) is not None,
                 f'{site["main"]}: no reading time ({c["minutes"]} min) for chapter {c["nn"]}')
    if 'reading_minutes' in site:
        need(f'{site["reading_minutes"]} minutes in all' in main_text,
             f'{site["main"]}: no total reading time ({site["reading_minutes"]} minutes in all)')
    lab_diffs = {d['html'] for d in site['diffs'] if d.get('lab')}
    need(not (main_links & lab_diffs), f'{site["main"]}: lab steps on the reading path: '
                                       f'{sorted(main_links & lab_diffs)[:3]}')
    # each lab: its own page, linked from its chapter (not from the reading path's table), with its
    # reading time, its chapter and every lab diff
    chapters = {c['nn']: c for c in site['chapters']}
    for lab in site.get('labs', []):
        page = os.path.join(html_dir, lab['html'])
        text = open(page, encoding='utf-8', errors='replace').read() if os.path.isfile(page) else ''
        links = links_of(page)
        ch = chapters.get(lab['nn'], {})
        chapter_links = links_of(os.path.join(html_dir, lab.get('chapter_html', ch.get('html', ''))))
        need(lab['html'] in chapter_links, f'{lab.get("chapter_html")}: no link to its lab page {lab["html"]}')
        need(not (chapter_links & lab_diffs), f'{lab.get("chapter_html")}: links lab diffs, which belong to '
                                              f'{lab["html"]}: {sorted(chapter_links & lab_diffs)[:3]}')
        need(lab.get('chapter_html', '') in links, f'{lab["html"]}: no link back to its chapter')
        need(f'reading time {lab["minutes"]} min' in text, f'{lab["html"]}: no reading time ({lab["minutes"]} min)')
        missing = [d for d in lab.get('diffs', []) if d not in links]
        need(not missing, f'{lab["html"]}: no link to its diffs {missing[:3]}')
        for d in lab.get('diffs', []):
            need(os.path.isfile(os.path.join(html_dir, d)), f'{lab["html"]}: diff page {d} is missing')
    return expected


def check(out, chromium='', browser=True):
    html_dir = os.path.join(out, 'html')
    site = json.load(open(os.path.join(out, 'site.json')))
    failures = []

    def need(cond, what):
        if not cond:
            failures.append(what)
        return cond

    # 1. Every page the site promises exists, and the reading path's links hold.
    expected = check_files(out, site, need)
    chromium = find_chromium(chromium) if browser else None
    if not chromium:
        for f in failures:
            print(f'docs --check: FAIL {f}', file=sys.stderr)
        if browser:
            print('docs --check: no chromium found (apt-get install chromium)', file=sys.stderr)
            return 2
        print(f'docs --check: {len(expected)} pages exist, the reading path and the lab pages hold '
              '(no browser: nothing rendered)' if not failures else
              f'docs --check: {len(failures)} failure(s) in the pages\' files')
        return 1 if failures else 0
    shots = os.path.join(out, 'screenshots')
    shutil.rmtree(shots, ignore_errors=True)
    os.makedirs(shots)

    # 2. Four pages in the browser.
    with_math = [c for c in site['chapters'] if c['formulas']]
    chapter = next((c for c in with_math if c['nn'] == '02'), with_math[0] if with_math else None)
    diff = next((d for d in site['diffs'] if d['cross']), site['diffs'][0] if site['diffs'] else None)
    pages = [('main', site['main'], False, False), ('chapter', chapter['html'] if chapter else None, True, False),
             ('diff', diff['html'] if diff else None, False, False), ('plots', site['plots'], False, True)]
    pages += [('lab%s' % lab['nn'], lab['html'], False, False) for lab in site.get('labs', [])]
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
    labs = ''.join(f', {lab["html"]}' for lab in site.get('labs', []))
    print(f'docs --check: {len(expected)} pages exist; main, chapter {chapter["nn"]}, {diff["html"]}{labs} and the '
          f'plots rendered in {os.path.basename(chromium)} with MathJax and every image; screenshots in '
          f'{os.path.relpath(shots, os.getcwd())}/')
    return 0


if __name__ == '__main__':
    args = [a for a in sys.argv[1:] if a != '--no-browser']
    if not args:
        sys.exit('usage: check_site.py BUILD/docs [CHROMIUM] [--no-browser]')
    sys.exit(check(os.path.abspath(args[0]), args[1] if len(args) > 1 else '', browser='--no-browser' not in sys.argv))

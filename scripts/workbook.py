#!/usr/bin/env python3
"""The learner's workbook: a copy of the tree in which every exercise is its stub.

    workbook.py create ROOT WORKBOOK [--force]
    workbook.py reset ROOT WORKBOOK ID...
    workbook.py status ROOT WORKBOOK [--expect-fresh] [ID...]
    workbook.py list ROOT

An exercise is a marked region of the solution code (DEVELOPERS.md, "Exercises"):

    // EXERCISE ch02.1: merge two (m, l) states
    //| return a;  // TODO: your code here        <- the stub, as comments
    const MergeWeights<T> w = ...;                 <- the solution
    // END EXERCISE

In the workbook the region holds a TODO line with the task and the stub, uncommented:

    // EXERCISE ch02.1: merge two (m, l) states
    // TODO(ch02.1): merge two (m, l) states (hints: chapters/02_online_softmax/README.md, Exercises)
    return a;  // TODO: your code here
    // END EXERCISE

An exercise is *not started* while its region still equals that stub, *failing* once
it differs and a test fails (or it does not compile), *solved* when every test named
`exercise ID:` passes. `status` builds only the test binaries that hold exercise tests
(found through CMake's file API), runs those tests with ctest and prints one line per
exercise, in chapter order; it exits 1 while any exercise is unsolved.

`status --expect-fresh` is the honesty check CI runs on a fresh workbook: it exits 0
only when every exercise is not started and every test of it that can run here fails.
The environment gives the build: TUTORIAL_CUDA (ON|OFF), JOBS, CMAKE_CUDA_ARCHITECTURES.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

BEGIN = re.compile(r'^([ \t]*)// EXERCISE (ch\d+\.\d+): *(.*)$')
END = re.compile(r'^[ \t]*// END EXERCISE')
STUB = re.compile(r'^([ \t]*)//\| ?(.*)$')
SOURCE_EXT = ('.cpp', '.hpp', '.cu', '.cuh', '.h', '.cc')
# What a learner's copy holds: everything the build and the tests need, and the texts.
TREE = ['CMakeLists.txt', 'cmake', 'common', 'chapters', 'tests', 'docs', 'scripts', 'python',
        'README.md', 'DEVELOPERS.md']
STATE = '.workbook'          # inside the workbook: the build folder and the last results


def id_key(ex_id):
    ch, k = ex_id[2:].split('.')
    return (int(ch), int(k))


def say(*a):
    print(*a, flush=True)


def die(msg, code=2):
    print('tutorial: ' + msg, file=sys.stderr, flush=True)
    sys.exit(code)


# ----------------------------------------------------------------------------- regions

def source_files(root):
    for top in ('chapters', 'common'):
        base = os.path.join(root, top)
        for d, dirs, files in os.walk(base):
            dirs[:] = sorted(x for x in dirs if not x.startswith('build'))
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    yield os.path.join(d, f)


def regions(path):
    """[(id, task, begin_line, end_line)] with 0-based indices of the marker lines."""
    out, cur = [], None
    with open(path, encoding='utf-8') as fh:
        lines = fh.read().split('\n')
    for i, line in enumerate(lines):
        m = BEGIN.match(line)
        if m:
            if cur:
                die(f'{path}:{i + 1}: EXERCISE {m.group(2)} opens inside {cur[0]}')
            cur = (m.group(2), m.group(3).strip(), i)
        elif cur and END.match(line):
            out.append((cur[0], cur[1], cur[2], i))
            cur = None
    if cur:
        die(f'{path}: EXERCISE {cur[0]} has no // END EXERCISE')
    return out, lines


_warned = set()


def exercises(root):
    """{id: (relative path, task, line)} of the repository's solution code."""
    found = {}
    for path in source_files(root):
        regs, _ = regions(path)
        for ex_id, task, b, _e in regs:
            rel = os.path.relpath(path, root)
            if ex_id in found:
                # The same marker in two files (a later chapter copied the region): the exercise
                # lives in its own chapter's folder; the copy is left as it is.
                own = f'chapters/{ex_id[2:4]}_'
                keep, other = (found[ex_id][0], rel) if not rel.startswith(own) else (rel, found[ex_id][0])
                if (ex_id, other) not in _warned:
                    _warned.add((ex_id, other))
                    print(f'tutorial: warning: exercise {ex_id} is marked twice; it is the one in {keep}, '
                          f'the marker in {other} should go', file=sys.stderr)
                if keep == found[ex_id][0]:
                    continue
            found[ex_id] = (rel, task, b + 1)
    return dict(sorted(found.items(), key=lambda kv: id_key(kv[0])))


def chapter_readme(root, ex_id):
    nn = ex_id[2:4]
    chapters = os.path.join(root, 'chapters')
    for d in sorted(os.listdir(chapters)):
        if d.startswith(nn + '_') and os.path.exists(os.path.join(chapters, d, 'README.md')):
            return f'chapters/{d}/README.md'
    return 'DEVELOPERS.md'


def stub_body(root, ex_id, task, solution_body):
    """The lines a learner starts from: the TODO line, then the uncommented stub."""
    body, indent = [], None
    for line in solution_body:
        m = STUB.match(line)
        if m:
            indent = m.group(1) if indent is None else indent
            body.append((m.group(1) + m.group(2)).rstrip())
    return body, indent


def stub_region_lines(root, ex_id, task, marker_line, solution_body):
    indent = BEGIN.match(marker_line).group(1)
    body, _ = stub_body(root, ex_id, task, solution_body)
    todo = f'{indent}// TODO({ex_id}): {task} (hints: {chapter_readme(root, ex_id)}, Exercises)'
    return [todo] + body


def repo_stub(root, ex_id):
    """The stub lines of exercise ex_id, computed from the repository's solution."""
    exs = _exercises_cached(root)
    if ex_id not in exs:
        die(f'no exercise {ex_id} (see ./tutorial exercise list)')
    rel = exs[ex_id][0]
    regs, lines = regions(os.path.join(root, rel))
    for rid, task, b, e in regs:
        if rid == ex_id:
            return rel, stub_region_lines(root, rid, task, lines[b], lines[b + 1:e])
    die(f'no exercise {ex_id} in {rel}')


_cache = {}


def _exercises_cached(root):
    if root not in _cache:
        _cache[root] = exercises(root)
    return _cache[root]


def norm(lines):
    out = [l.rstrip() for l in lines]
    while out and not out[-1]:
        out.pop()
    while out and not out[0]:
        out.pop(0)
    return out


def workbook_region(wb, rel, ex_id):
    path = os.path.join(wb, rel)
    if not os.path.exists(path):
        return None
    regs, lines = regions(path)
    for rid, _t, b, e in regs:
        if rid == ex_id:
            return lines[b + 1:e]
    return None


def replace_region(path, ex_id, new_body):
    regs, lines = regions(path)
    for rid, _t, b, e in regs:
        if rid == ex_id:
            lines[b + 1:e] = new_body
            with open(path, 'w', encoding='utf-8') as fh:
                fh.write('\n'.join(lines))
            return True
    return False


# ----------------------------------------------------------------------------- create / reset

def tree_files(root):
    try:
        out = subprocess.run(['git', '-C', root, 'ls-files', '-co', '--exclude-standard', '-z', '--'] + TREE,
                             check=True, capture_output=True).stdout.decode()
        files = [f for f in out.split('\0') if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for top in TREE:
            p = os.path.join(root, top)
            if os.path.isfile(p):
                files.append(top)
            for d, dirs, fs in os.walk(p):
                dirs[:] = [x for x in dirs if not x.startswith('build') and x != '__pycache__']
                files += [os.path.relpath(os.path.join(d, f), root) for f in fs]
    return sorted(f for f in set(files) if os.path.isfile(os.path.join(root, f)))


def cmd_create(root, wb, force):
    if os.path.exists(os.path.join(wb, STATE, 'created')):
        if not force:
            say(f'workbook: {wb} exists; your work in it is kept.')
            say('  progress: ./tutorial test --workbook    one stub back: ./tutorial workbook --reset chNN.k')
            say('  start over (deletes your work): ./tutorial workbook --force')
            return 0
        shutil.rmtree(wb)
    elif os.path.exists(wb) and os.listdir(wb):
        die(f'{wb} exists and is not a workbook: move it away first')
    os.makedirs(wb, exist_ok=True)
    for rel in tree_files(root):
        dst = os.path.join(wb, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(os.path.join(root, rel), dst)
    # The workbook ignores itself, so it never shows up in the repository's git status.
    with open(os.path.join(wb, '.gitignore'), 'w') as fh:
        fh.write('# the learner\'s workbook (./tutorial workbook): not part of the repository\n*\n')
    exs = exercises(root)
    for ex_id, (rel, _task, _line) in exs.items():
        _, stub = repo_stub(root, ex_id)
        if not replace_region(os.path.join(wb, rel), ex_id, stub):
            die(f'exercise {ex_id}: region not found in the copy of {rel}')
    os.makedirs(os.path.join(wb, STATE), exist_ok=True)
    with open(os.path.join(wb, STATE, 'created'), 'w') as fh:
        fh.write(''.join(f'{i}\n' for i in exs))
    shown = os.path.relpath(wb, os.getcwd()) if wb.startswith(os.getcwd()) else wb
    say(f'workbook: {shown}/ holds the tree with {len(exs)} exercises as stubs '
        '(the repository keeps its solutions).')
    by_ch = {}
    for i in exs:
        by_ch.setdefault(i[:4], []).append(i)
    for ch, ids in by_ch.items():
        say(f'  {ch}: ' + ' '.join(ids))
    say('  edit the regions marked "// TODO(chNN.k)", then: ./tutorial test --workbook [chNN.k ...]')
    return 0


def cmd_reset(root, wb, ids):
    if not os.path.exists(os.path.join(wb, STATE, 'created')):
        die('no workbook yet: ./tutorial workbook makes one')
    for ex_id in ids:
        rel, stub = repo_stub(root, ex_id)
        path = os.path.join(wb, rel)
        if os.path.exists(path) and replace_region(path, ex_id, stub):
            say(f'workbook: {ex_id} is a stub again in {rel}')
            continue
        # The exercise is newer than the workbook: take the repository's file, every region
        # a stub, and put back the learner's code of the regions the old copy had.
        kept = {}
        if os.path.exists(path):
            regs, lines = regions(path)
            kept = {rid: lines[b + 1:e] for rid, _t, b, e in regs}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copy2(os.path.join(root, rel), path)
        regs, _ = regions(path)
        for rid, _t, _b, _e in regs:
            replace_region(path, rid, kept[rid] if rid in kept else repo_stub(root, rid)[1])
        say(f'workbook: {ex_id} added to {rel} as a stub' + (f' (your code of {", ".join(sorted(kept))} kept)' if kept else ''))
    return 0


# ----------------------------------------------------------------------------- build and test

def exercise_test_files(wb):
    """{relative test source: set of exercise ids whose TEST_CASEs it holds}"""
    pat = re.compile(r'TEST_CASE\s*\(\s*"exercise (ch\d+\.\d+):')
    out = {}
    for d, dirs, files in os.walk(os.path.join(wb, 'tests')):
        for f in files:
            if f.endswith(SOURCE_EXT):
                p = os.path.join(d, f)
                with open(p, encoding='utf-8', errors='replace') as fh:
                    ids = set(pat.findall(fh.read()))
                if ids:
                    out[os.path.relpath(p, wb)] = ids
    return out


def codemodel_targets(build):
    """{target name: [source paths relative to the source tree]} from CMake's file API."""
    reply = os.path.join(build, '.cmake', 'api', 'v1', 'reply')
    index = sorted(f for f in os.listdir(reply) if f.startswith('index-'))[-1]
    with open(os.path.join(reply, index)) as fh:
        idx = json.load(fh)
    cm = next(o for o in idx['objects'] if o['kind'] == 'codemodel')
    with open(os.path.join(reply, cm['jsonFile'])) as fh:
        codemodel = json.load(fh)
    out = {}
    for t in codemodel['configurations'][0]['targets']:
        with open(os.path.join(reply, t['jsonFile'])) as fh:
            tj = json.load(fh)
        out[tj['name']] = [s['path'] for s in tj.get('sources', [])]
    return out


def run(cmd, log=None, **kw):
    if log is None:
        return subprocess.run(cmd, **kw).returncode
    with open(log, 'w') as fh:
        return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, **kw).returncode


def configure(wb, build):
    query = os.path.join(build, '.cmake', 'api', 'v1', 'query')
    os.makedirs(query, exist_ok=True)
    open(os.path.join(query, 'codemodel-v2'), 'a').close()
    cmd = ['cmake', '-S', wb, '-B', build, '-DCMAKE_BUILD_TYPE=Release']
    if not os.path.exists(os.path.join(build, 'CMakeCache.txt')) and shutil.which('ninja'):
        cmd += ['-G', 'Ninja']
    cuda = os.environ.get('TUTORIAL_CUDA')
    if cuda:
        cmd.append(f'-DTUTORIAL_CUDA={cuda}')
    if os.environ.get('CMAKE_CUDA_ARCHITECTURES'):
        cmd.append('-DCMAKE_CUDA_ARCHITECTURES=' + os.environ['CMAKE_CUDA_ARCHITECTURES'])
    log = os.path.join(build, 'configure.log')
    if run(cmd, log) != 0:
        with open(log) as fh:
            sys.stderr.write(fh.read()[-4000:])
        die('the workbook does not configure (the CMake output is above)', 1)


def junit_results(path):
    """{test name: 'pass' | 'fail' | 'skip'}"""
    out = {}
    if not os.path.exists(path):
        return out
    for tc in ET.parse(path).getroot().iter('testcase'):
        name = tc.get('name', '')
        if tc.find('failure') is not None or tc.find('error') is not None or tc.get('status') == 'fail':
            out[name] = 'fail'
        elif tc.find('skipped') is not None or tc.get('status') in ('notrun', 'disabled'):
            out[name] = 'skip'
        else:
            out[name] = 'pass'
    return out


def cmd_status(root, wb, expect_fresh, only):
    if not os.path.exists(os.path.join(wb, STATE, 'created')):
        die('no workbook yet: ./tutorial workbook makes one')
    exs = exercises(root)
    for i in only:
        if i not in exs:
            die(f'no exercise {i} (see ./tutorial exercise list)')
    ids = only or list(exs)

    # Which exercises the learner has touched.
    started = {}
    missing = []
    for ex_id in ids:
        rel, stub = repo_stub(root, ex_id)
        body = workbook_region(wb, rel, ex_id)
        if body is None:       # added to the repository after the workbook was made, or deleted
            missing.append(ex_id)
            continue
        started[ex_id] = norm(body) != norm(stub)
    ids = [i for i in ids if i not in missing]

    # Build only the test binaries that hold the exercises' tests.
    build = os.path.join(wb, STATE, 'build')
    configure(wb, build)
    files = exercise_test_files(wb)
    targets = codemodel_targets(build)
    wanted, holders = set(), {}
    for name, srcs in targets.items():
        for s in srcs:
            for ex_id in files.get(os.path.normpath(s), ()):
                holders.setdefault(ex_id, set()).add(name)
                if ex_id in ids:
                    wanted.add(name)
    with open(os.path.join(build, 'CMakeCache.txt')) as fh:
        cuda_on = re.search(r'^TUTORIAL_CUDA:BOOL=(ON|TRUE|1)$', fh.read(), re.M) is not None
    jobs = os.environ.get('JOBS') or str(os.cpu_count() or 2)
    build_log = os.path.join(build, 'build.log')
    failed_targets = set()
    if wanted:
        say(f'workbook: building {" ".join(sorted(wanted))} (CUDA {"ON" if cuda_on else "OFF"})')
        keep_going = ['--', '-k', '0'] if os.path.exists(os.path.join(build, 'build.ninja')) else ['--', '-k']
        rc = run(['cmake', '--build', build, '-j', jobs] + [a for t in sorted(wanted) for a in ('--target', t)]
                 + keep_going, build_log)
        if rc != 0:
            # Which targets are still out of date (did not compile or link): never run their old binaries.
            for t in sorted(wanted):
                dry = subprocess.run(['cmake', '--build', build, '--target', t, '--', '-n'],
                                     capture_output=True, text=True)
                if 'no work to do' not in dry.stdout:
                    failed_targets.add(t)
            if not failed_targets:
                failed_targets = set(wanted)

    # Run every test named "exercise ID:" at once; ctest writes one JUnit record per test.
    junit = os.path.join(build, 'exercises.xml')
    if os.path.exists(junit):
        os.remove(junit)
    alt = '|'.join(re.escape(i) for i in ids)
    run(['ctest', '--test-dir', build, '-R', f':exercise ({alt}):', '--timeout', '300', '-j', jobs,
         '--output-junit', junit], os.path.join(build, 'ctest.log'))
    results = junit_results(junit)
    per = {}
    for name, r in results.items():
        m = re.search(r':exercise (ch\d+\.\d+):', name)
        if m:
            per.setdefault(m.group(1), []).append((name, r))

    unsolved, defects = 0, 0
    say('')
    for ex_id in ids:
        rel, task, line = exs[ex_id]
        rs = per.get(ex_id, [])
        n_pass = sum(r == 'pass' for _, r in rs)
        n_fail = sum(r == 'fail' for _, r in rs)
        n_skip = sum(r == 'skip' for _, r in rs)
        broken = holders.get(ex_id, set()) & failed_targets
        where = f'{rel}:{line}'
        if ex_id not in holders:
            state = 'not started' if not started[ex_id] else 'changed'
            if not any(ex_id in v for v in files.values()):
                defects += 1
                note = f'DEFECT: no TEST_CASE named "exercise {ex_id}:"'
            elif not cuda_on:
                note = 'its tests are GPU tests, not built without the CUDA toolkit'
            else:
                defects += 1
                note = 'DEFECT: no test binary holds its tests'
        elif broken:
            state = 'failing' if started[ex_id] else 'not started'
            note = f'does not compile: {" ".join(sorted(broken))} (see {os.path.relpath(build_log, os.getcwd())})'
            if not started[ex_id]:
                # Another exercise's code in the same test binary may be what fails; only a
                # fresh workbook proves that the stubs themselves compile.
                note = 'untested: ' + note
                if expect_fresh or not any(started.get(o) for o in ids if holders.get(o, set()) & broken):
                    defects += 1
                    note = 'DEFECT: the stubs do not compile: ' + note[len('untested: '):]
        elif n_fail:
            state = 'failing' if started[ex_id] else 'not started'
            if started[ex_id]:
                note = (f'{n_fail} of {len(rs)} tests fail; why: ctest --test-dir {os.path.relpath(build, os.getcwd())} '
                        f"--output-on-failure -R 'exercise {ex_id.replace('.', chr(92) + '.')}:'")
            elif n_pass:
                # On the stub every one of the exercise's own tests must fail: one that passes
                # cannot tell the stub from the solution.
                defects += 1
                note = f'DEFECT: {n_pass} of its {len(rs)} tests pass on the stub ({n_fail} fail)'
            else:
                note = 'its test fails on the stub' if n_fail == 1 else f'its {n_fail} tests fail on the stub'
        elif n_pass and not n_skip:
            state = 'solved' if started[ex_id] else 'not started'
            note = f'{n_pass} of {len(rs)} tests pass'
            if not started[ex_id]:
                defects += 1
                note = f'DEFECT: its tests pass on the stub ({note})'
        else:
            state = 'not started' if not started[ex_id] else 'changed'
            note = 'its tests need a GPU (skipped here)'
        if state != 'solved':
            unsolved += 1
        if expect_fresh and state != 'not started':
            defects += 1
            note += ' [a fresh workbook must be not started]'
        say(f'{ex_id:<7} {state:<12} {note}')
        say(f'        {task}  ({where})')
    if failed_targets:
        say('')
        say(f'build errors ({os.path.relpath(build_log, os.getcwd())}, last lines):')
        with open(build_log, errors='replace') as fh:
            err = [l.rstrip() for l in fh if 'error' in l or 'FAILED' in l]
        for l in err[-15:]:
            say('  ' + l)
    for ex_id in missing:
        rel, task, line = exs[ex_id]
        unsolved += 1
        if expect_fresh:
            defects += 1
        say(f'{ex_id:<7} {"missing":<12} not in this workbook: ./tutorial workbook --reset {ex_id} brings it in')
        say(f'        {task}  ({rel}:{line})')
    solved = len(ids) - unsolved + len(missing)
    ids = ids + missing
    say('')
    say(f'workbook: {solved} of {len(ids)} exercises solved')
    if expect_fresh:
        if defects:
            die(f'{defects} exercise(s) break the rule "every test fails on a fresh stub"', 1)
        say('workbook: fresh, every exercise is not started, and every test that can run here fails on its stub')
        return 0
    if defects:
        die(f'{defects} defect(s) in the exercises themselves (see DEFECT above)', 1)
    return 1 if unsolved else 0


def cmd_list(root):
    for ex_id, (rel, task, line) in exercises(root).items():
        say(f'{ex_id:<7} {rel}:{line}')
        say(f'        {task}')
    return 0


def main(argv):
    if len(argv) < 2:
        die(__doc__.strip().split('\n\n')[0])
    cmd, root = argv[0], os.path.abspath(argv[1])
    rest = argv[2:]
    if cmd == 'list':
        return cmd_list(root)
    if not rest:
        die('workbook folder missing')
    wb, args = os.path.abspath(rest[0]), rest[1:]
    if cmd == 'create':
        return cmd_create(root, wb, '--force' in args)
    if cmd == 'reset':
        if not args:
            die('usage: ./tutorial workbook --reset chNN.k [...]')
        return cmd_reset(root, wb, args)
    if cmd == 'status':
        fresh = '--expect-fresh' in args
        return cmd_status(root, wb, fresh, [a for a in args if a != '--expect-fresh'])
    die(f'unknown workbook command {cmd}')


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))

"""A finished run folder is moved elsewhere (issue 33, point 5): its audit pages still render with working links, every
hash its stage.json files record still checks against the files where they now are, `ei confirm status` still
finds the registered models and problems, and no trail file names the old folder."""
import json, re, shutil, subprocess, sys
from pathlib import Path
from ei_nb.core import content_hash
from ei_nb.layout import RunLayout
from tests.driver_common import *   # noqa: F403 (the session fixture `reference`: a finished small demo run)
from tests.driver_common import copy_run
from tests.confirm_doubles import RUNNER, synthetic_model
from ei_nb.confirm import ARMS, load_test_problems, register, run_confirmation
from ei_nb.core import atomic_write_bytes, jsonl_bytes

ENTRY = 'import sys; from ei_nb.cli import _entry; sys.argv[0] = "ei"; _entry()'
SCRATCH = ('.partial', 'logs', 'superseded')                       # job files and logs of the machine that ran it
MODELS = ('model', 'merged', 'adapter', 'tiny', 'warm', 'models')    # weights and what libraries write beside them


def _ei(*args):
    return subprocess.run([sys.executable, '-c', ENTRY, *args], capture_output=True, text=True, timeout=600)


def _trail_files(run):
    "The run's own text records: markers, stage.json, manifests, run.json, executed notebooks, pages, settings, confirm/."
    for p in sorted(run.rglob('*')):
        rel = p.relative_to(run).parts
        if p.is_file() and p.suffix in ('.json', '.done', '.ipynb', '.html') and not set(rel[:-1]) & {*SCRATCH, *MODELS}: yield p


def _confirmed(run):
    "A cheap confirmation registered in the run (two synthetic model folders inside it, a subset of the test problems)."
    sub = run/'test_subset.jsonl'
    atomic_write_bytes(sub, jsonl_bytes(load_test_problems()[0][:12]))
    m, b = (synthetic_model(run/'models'/k, s, seed=i) for i, (k, s) in enumerate(zip(ARMS, (0.45, 0.25))))
    register(run, model=m, baseline_model=b, n=4, max_new_tokens=64, problems=sub, runner=RUNNER)
    run_confirmation(run, report=False)


def test_a_moved_run_renders_verifies_and_confirms(reference, tmp_path):
    first = copy_run(reference, tmp_path/'first'/'run')
    _confirmed(first)
    moved = tmp_path/'second'/'elsewhere'
    moved.parent.mkdir()
    shutil.move(str(first), str(moved))
    assert not first.exists()

    # the hash checks: every file a stage.json names is found where the record says, with the recorded hash
    accounts = [sj for sj in sorted(moved.rglob('stages/*.json'))] + sorted(moved.glob('confirm/*/stage.json'))
    assert len(accounts) > 10
    L, checked = RunLayout(moved), 0
    for sj in accounts:
        rec = json.loads(sj.read_text())
        for kind in ('inputs', 'outputs'):
            for name, f in rec[kind].items():
                if 'sha256' not in f: continue
                path = L.resolve(f['path'])
                assert path.exists() and content_hash(path, cache=False) == f['sha256'], f'{sj}: {kind} {name} {f["path"]}'
                checked += 1
    assert checked > 30
    named = [f['path'] for sj in accounts for k in ('inputs', 'outputs') for f in json.loads(sj.read_text())[k].values()]
    assert named and not [p for p in named if p.startswith('/') and str(moved) not in p and 'ei_nb/data' not in p], named

    # the markers still match: a rerun of the finished run in its new place skips every step
    p = ei(moved)
    assert p.returncode == 0 and executed(p.stderr) == [], p.stderr[-2000:]

    # the pages render in the new place, and every link resolves there
    res = _ei('report', 'html', '--run-dir', str(moved))
    assert res.returncode == 0, res.stderr[-2000:]
    pages = [q for q in moved.rglob('*.html') if not set(q.relative_to(moved).parts) & set(SCRATCH)]
    assert len(pages) > 10
    for page in pages:
        for link in re.findall(r'<a href="([^"#:]+)"', page.read_text(encoding='utf-8')):
            assert (page.parent/link).exists(), f'{page}: broken link {link}'

    # the confirmation still checks: models, problems, frozen problems and the lock, all found in the moved run
    res = _ei('confirm', 'status', '--run-dir', str(moved))
    assert res.returncode == 0, res.stderr[-2000:]
    st = json.loads(res.stdout.strip().splitlines()[-1])
    assert st['locked'] and st['mismatches'] == [] and st['changed_since_lock'] == []

    # no record names the folder the run was made in
    old = str(first.resolve())
    leaks = [str(q.relative_to(moved)) for q in _trail_files(moved) if old in q.read_text(encoding='utf-8', errors='replace')]
    assert leaks == [], leaks


def test_a_moved_run_with_a_changed_file_fails_the_hash_check(reference, tmp_path):
    "The hash check can fail: one byte of a recorded output changed after the move is found and named."
    from ei_nb.layout import stale_files
    run = copy_run(reference, tmp_path/'a'/'run')
    moved = tmp_path/'b'/'run'; moved.parent.mkdir(); shutil.move(str(run), str(moved))
    sj = RunLayout(moved).round(1).stage_json('00_select')
    sel = RunLayout(moved).round(1).selected
    assert stale_files(sj) == []
    sel.write_bytes(sel.read_bytes().replace(b'"', b"'", 1))
    assert stale_files(sj) == ['outputs selected (round_01/selected.jsonl): changed']

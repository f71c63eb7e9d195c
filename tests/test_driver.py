"""Reliability of `ei run` (the round driver): refusals, split hygiene, stage records, the finished run.
Kills, signals and redo are in test_driver_resume.py; both share tests/driver_common.py."""
import hashlib, json, os, re, shutil, subprocess, sys
from pathlib import Path
import pytest
from ei_nb.core import iter_jsonl, read_problems, statement_key, shared_data
from tests.driver_common import *   # noqa: F403 (the helpers and the session fixtures round0 and reference)
from tests.driver_common import _h, _records


def test_second_driver_on_the_same_run_is_refused(reference, tmp_path):
    from ei_nb.run_command import run_lock
    run = copy_run(reference, tmp_path/'run')
    with run_lock(run):
        p = ei(run)
    assert p.returncode == 3 and 'in use by another' in p.stderr


def test_run_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path/'run').write_text('not a folder')
    p = ei(tmp_path/'run')
    assert p.returncode == 2 and 'is a file' in p.stderr and 'Traceback' not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and (tmp_path/'run').read_text() == 'not a folder'

def test_every_stage_writes_its_stage_json(reference):
    "Each stage's own account: what it read (with digests), wrote, its parameters, headline and wall time."
    from ei_nb.layout import RunLayout, read_stage_json
    L = RunLayout(reference)
    for stage in ROUND1:
        rec = read_stage_json(L.round(1).stage_json(stage))
        assert rec and rec['stage'] == stage and rec['status'] == 'done', stage
        assert rec['wall_s'] > 0 or stage == '05_stop_rule', stage   # the stop rule decides in well under a millisecond
    ev = read_stage_json(L.round(1).stage_json('04_eval'))
    assert ev['headline']['solved'] == len({v['name'] for _, v in iter_jsonl(L.round(1).eval_verdicts) if v['verdict'] == 'pass'})
    assert not L.round(1).eval.stage_json.exists() and not (L.round(1).dir/'select.json').exists()   # one summary per stage: stages/
    assert ev['outputs']['verdicts']['sha256'] == _h(L.round(1).eval_verdicts)
    assert read_stage_json(L.round(1).stage_json('05_stop_rule'))['headline']['reason'] == 'budget'   # the decision
    assert read_stage_json(L.round(0).stage_json('01_sample_verify'))['params']['data_rule'] is False   # no data rule on the pool measurement

def test_until_a_finished_step_stops_there_again(round0, tmp_path):
    "`--until 0:04_eval` on a run whose round 0 is finished stops at once (it used to go on into round 1)."
    run = copy_run(round0, tmp_path/'run')
    p = ei(run, '--until', '0:04_eval')
    assert p.returncode == 0 and executed(p.stderr) == [] and not (run/'round_01').exists(), p.stderr[-2000:]

def test_finished_run_is_skipped_entirely(reference, tmp_path):
    run = copy_run(reference, tmp_path/'run')
    p = ei(run)
    assert p.returncode == 0 and executed(p.stderr) == [], p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary['decision']['reason'] == 'budget'
    S1 = json.loads((run/'round_01'/'stages'/'04_eval.json').read_text())['headline']['solved']
    best = 1 if S1 > summary['S_0'] else 0                            # the base is a candidate and wins ties
    assert summary['best_round'] == best
    assert Path(summary['best']).resolve() == (run/'round_01'/'model' if best else run/'demo'/'model').resolve()

def test_config_typos_are_refused(tmp_path):
    p = ei(tmp_path/'run', '--set', 'select.hii=0.5')
    assert p.returncode == 2 and "did you mean 'hi'" in p.stderr, p.stderr
    bad = tmp_path/'bad.toml'
    bad.write_text(DEMO.read_text().replace('max_problems = 12', 'max_problem = 12'))
    p = ei(tmp_path/'run', config=bad)
    assert p.returncode == 2 and "did you mean 'max_problems'" in p.stderr, p.stderr
    bad.write_text(DEMO.read_text().replace('[stop_rule]', '[stop_rules]'))
    p = ei(tmp_path/'run', config=bad)
    assert p.returncode == 2 and "did you mean 'stop_rule'" in p.stderr, p.stderr
    assert not (tmp_path/'run').exists()                             # nothing was started


def _plain_config(tmp_path, round0, **paths) -> Path:
    "The demo config without its demo stage, pointing at the files round 0 built (and `paths` overrides)."
    text = re.sub(r'\n\[demo\]\n(?:[^\[\n][^\n]*\n|\n)*', '\n', DEMO.read_text())
    d = round0/'demo'
    base = {'pool': d/'pool.jsonl', 'scored': d/'scored.jsonl', 'base_model': d/'model',
            'protected': [d/'protected_test_dsp15.jsonl', d/'protected_test_goedel_v2.jsonl']} | paths
    for k, v in base.items():
        val = json.dumps([str(x) for x in v]) if isinstance(v, list) else json.dumps(str(v))
        text = re.sub(rf'(?m)^{k} = .*$', f'{k} = {val}', text, count=1)
    cfg = tmp_path/'plain.toml'; cfg.write_text(text)
    return cfg

def test_scored_set_with_test_problems_is_refused(round0, tmp_path):
    cfg = _plain_config(tmp_path, round0, scored=shared_data('minif2f_dsp15.jsonl'))
    cmd = lambda *a: [sys.executable, '-c', ENTRY, 'run', '--config', str(cfg), '--run-dir', str(tmp_path/'run'),
                      '--set', 'paths.scored_split=""', *a]
    p = subprocess.run(cmd('--rounds', '1'), capture_output=True, text=True, env=ENV)
    assert p.returncode == 2 and 'test-split problem' in p.stderr, p.stderr
    p = subprocess.run(cmd('--rounds', '2', '--allow-test-selection'), capture_output=True, text=True, env=ENV)
    assert p.returncode == 2 and 'needs rounds = 1' in p.stderr, p.stderr

def test_protected_and_scored_problems_never_reach_the_pool(round0, tmp_path):
    "A pool that hides a renamed test problem and a scored problem: both are removed before any stage runs."
    d = round0/'demo'
    test = read_problems(d/'protected_test_dsp15.jsonl')[0]
    scored = read_problems(d/'scored.jsonl')[0]
    pool = read_problems(d/'pool.jsonl') + [dict(test, name='pool_renamed_test', split='train'), dict(scored, name='pool_scored_copy')]
    from ei_nb.core import write_records
    write_records(tmp_path/'pool.jsonl', pool, 'problem')
    cfg = _plain_config(tmp_path, round0, pool=tmp_path/'pool.jsonl')
    p = subprocess.run([sys.executable, '-c', ENTRY, 'run', '--config', str(cfg), '--run-dir', str(tmp_path/'run'),
                        '--until', '0:inputs'], capture_output=True, text=True, env=ENV)
    assert p.returncode == 0, p.stderr
    info = json.loads((tmp_path/'run'/'inputs'/'inputs.json').read_text())
    assert sorted(info['removed_from_pool']) == ['pool_renamed_test', 'pool_scored_copy']
    assert {q['name'] for q in read_problems(tmp_path/'run'/'inputs'/'pool.jsonl')} == {q['name'] for q in read_problems(d/'pool.jsonl')}

def test_no_protected_problem_in_any_sft_row(reference):
    prot = [q for f in ('protected_test_dsp15.jsonl', 'protected_test_goedel_v2.jsonl', 'scored.jsonl') for q in read_problems(reference/'demo'/f)]
    names, keys = {q['name'] for q in prot}, {statement_key(q['formal_statement']) for q in prot}
    pool = {q['name']: q for q in read_problems(reference/'inputs'/'pool.jsonl')}
    rows = [r for f in reference.glob('round_*/sft.jsonl') for _, r in iter_jsonl(f)]
    assert rows
    for r in rows:
        assert r['name'] not in names and statement_key(pool[r['name']]['formal_statement']) not in keys

def test_sft_guard_stops_on_a_protected_row(reference):
    "02_sft re-checks the rows it is about to train on: a protected problem among them stops the stage."
    from ei_nb.sft import check_rows_not_protected, read_protected
    from ei_nb.core import StageFailed
    d = reference/'round_01'
    rows, problems = [r for _, r in iter_jsonl(d/'sft.jsonl')], read_problems(d/'selected.jsonl')
    protected = read_protected([reference/'demo'/'protected_test_dsp15.jsonl', reference/'demo'/'protected_test_goedel_v2.jsonl',
                                reference/'inputs'/'scored.jsonl'])
    check_rows_not_protected(rows, problems, protected)              # the real rows pass
    test = read_problems(reference/'demo'/'protected_test_dsp15.jsonl')[0]
    with pytest.raises(StageFailed, match='protected'):
        check_rows_not_protected(rows + [{'name': test['name'], 'sample_idx': 0, 'prompt': '', 'completion': ''}], problems, protected)


def test_dry_run_of_the_reference_gpu_config():
    p = subprocess.run([sys.executable, '-c', ENTRY, 'run', '--config', str(REPO/'configs'/'goedel8b.toml'), '--dry-run'],
                       capture_output=True, text=True, env=ENV, cwd=REPO)
    assert p.returncode == 0, p.stderr
    for stage in ROUND1: assert re.search(rf'round 3  {stage}', p.stdout)
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert 20 * 3600 < summary['eta_s'] < 50 * 3600   # round 0 (4,000 x 8, Lean-bound: ~27 h on 8 workers), 3 rounds of ~5 h
    assert not (REPO/'runs'/'goedel8b').exists()


def test_failed_stage_leaves_its_notebook_and_the_error_in_the_manifest(reference, tmp_path):
    run = copy_run(reference, tmp_path/'run')
    p = ei(run, '--redo', '1:02_sft', '--set', 'sft.rank="bogus"')
    assert p.returncode == 3, p.stderr[-2000:]
    assert "1:02_sft failed: BadInput: unknown rank 'bogus'" in p.stderr and '02_sft.ipynb' in p.stderr
    nb = json.loads((run/'round_01'/'02_sft.ipynb').read_text())
    assert any(o.get('output_type') == 'error' for c in nb['cells'] for o in c.get('outputs', []))
    man = json.loads((run/'round_01'/'round_manifest.json').read_text())
    assert man['stages']['02_sft']['status'] == 'failed' and 'bogus' in man['stages']['02_sft']['error']['evalue']
    assert not (run/'round_01'/'stages'/'02_sft.done').exists()

def test_data_stop_exits_4_with_a_decision_and_a_report(reference, tmp_path):
    run = copy_run(reference, tmp_path/'run')
    p = ei(run, '--redo', '1:00_select', '--set', 'select.hi=0.01')
    assert p.returncode == 4, p.stderr[-2000:]
    assert executed(p.stderr) == ['1:00_select', '1:05_stop_rule', '1:06_report', 'final:06_report']   # 05 writes the data stop's decision
    dec = json.loads((run/'round_01'/'stages'/'05_stop_rule.json').read_text())['headline']
    assert dec['stop'] and dec['reason'] == 'data' and 'no problem in the pass-rate band' in dec['detail']
    assert dec['best_round'] == 0 and 'base model' in dec['best_note']   # no round has a score: best/ is the base
    sj = json.loads((run/'round_01'/'stages'/'00_select.json').read_text())
    assert sj['status'] == 'data_stop' and 'no problem in the pass-rate band' in sj['reason']
    assert json.loads((run/'round_01'/'stages'/'00_select.done').read_text())['status'] == 'data_stop'
    p = ei(run, '--set', 'select.hi=0.01')                           # a rerun reaches the same end without running anything
    assert p.returncode == 4 and executed(p.stderr) == []

def test_every_stage_json_stays_true_after_the_run(reference):
    """Each hash a finished stage.json gives its inputs and outputs is still the file's content hash once the whole run is done:
    no later stage (a later round's report included) overwrites a file an earlier account hashed (issue 28, part 4)."""
    from ei_nb.core import content_hash
    from ei_nb.layout import RunLayout
    L, checked = RunLayout(reference), 0
    for sj in sorted(reference.rglob('stages/*.json')):
        if 'superseded' in sj.parts: continue
        rec = json.loads(sj.read_text())
        for kind in ('inputs', 'outputs'):
            for name, f in rec[kind].items():
                if 'sha256' not in f: continue
                assert content_hash(L.resolve(f['path']), cache=False) == f['sha256'], f"{sj.relative_to(reference)}: {kind} {name} changed later"
                checked += 1
    assert checked > 20 and (reference/'round_01'/'figures').is_dir() and (reference/'figures').is_dir()   # one figures folder per report

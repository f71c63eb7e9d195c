"""Reliability of `ei run` (the round driver): kills, signals, refusals, redo, split hygiene.

The runs are real: the demo config (tiny warm-started Qwen3, known-proof verifier) shrunk to one round on a
pool of 10 problems. One run to the end of round 0 is shared; the reference run continues it through round 1;
every other test works on a copy of one of them, so the tests are independent of each other.
"""
import hashlib, json, os, re, shutil, signal, subprocess, sys, time
from pathlib import Path
import pytest
from ei_nb.core import iter_jsonl, read_problems, statement_key, shared_data

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO/'configs'/'demo.toml'
SMALL = ['--rounds', '1', '--set', 'demo.pool_size=10', '--set', 'demo.warm_pool=6', '--set', 'demo.scored_size=6',
         '--set', 'demo.warm_scored=3', '--set', 'demo.epochs=40', '--set', 'eval.max_new_tokens=96']
ROUND1 = ['00_select', '01_sample_verify', '02_sft', '03_average', '04_eval', '05_stop_rule', '06_report']
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'TOKENIZERS_PARALLELISM': 'false'}
ENTRY = 'import sys; from ei_nb.cli import _entry; sys.argv[0] = "ei"; _entry()'


def ei_cmd(run_dir, *args, config=DEMO):
    return [sys.executable, '-c', ENTRY, 'run', '--config', str(config), '--run-dir', str(run_dir), *SMALL, *args]

def ei(run_dir, *args, config=DEMO, timeout=1200):
    "Run `ei run` on `run_dir` to the end; the CompletedProcess."
    return subprocess.run(ei_cmd(run_dir, *args, config=config), capture_output=True, text=True, env=ENV, timeout=timeout)

def executed(stderr:str) -> list[str]:
    "The steps a driver executed, from its progress lines."
    return re.findall(r'^ei run: (\S+) -> ', stderr, re.M)

def tagged(run_dir) -> list[int]:
    "Live processes started for this run (kernels, stage children)."
    from ei_nb.driver import _tagged_pids
    return _tagged_pids(str(Path(run_dir).resolve()))

def copy_run(src, dst) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return Path(dst)

def _h(path) -> str: return hashlib.sha256(Path(path).read_bytes()).hexdigest()

def _records(path, drop=('verify_s',)) -> str:
    rows = [{k: v for k, v in r.items() if k not in drop} for _, r in iter_jsonl(path)]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()

def artefacts(run_dir) -> dict:
    "What an uninterrupted run and a killed-and-resumed one must agree on (timings left out)."
    d, out = Path(run_dir)/'round_01', {}
    for name in ('samples.jsonl', 'verdicts.jsonl', 'eval/eval_samples.jsonl', 'eval/eval_verdicts.jsonl'):
        out[f'round_00/{name}'] = _records(Path(run_dir)/'round_00'/name)
    for name in ('selected.jsonl', 'samples.jsonl', 'verdicts.jsonl', 'sft.jsonl', 'eval/eval_samples.jsonl', 'eval/eval_verdicts.jsonl'):
        out[name] = _records(d/name)
    for name in ('select.json', 'decision.json'): out[name] = _h(d/name)
    for sub in ('merged', 'model'):
        for f in sorted((d/sub).glob('*.safetensors')): out[f'{sub}/{f.name}'] = _h(f)
    ev = json.loads((d/'eval'/'eval.json').read_text())
    out['eval'] = (ev['solved'], ev['pass_at_k'])
    for m in sorted(Path(run_dir).glob('**/stages/*.done')):
        if 'superseded' not in m.parts: out[str(m.relative_to(run_dir))] = json.loads(m.read_text())['chain']
    return out


@pytest.fixture(scope='session')
def round0(tmp_path_factory) -> Path:
    "The small demo run up to the end of round 0 (demo set-up, inputs, pool measurement, baseline)."
    run = tmp_path_factory.mktemp('ei_run')/'round0'
    p = ei(run, '--until', '0:04_eval')
    assert p.returncode == 0, p.stderr[-3000:]
    return run

@pytest.fixture(scope='session')
def reference(round0, tmp_path_factory) -> Path:
    "The uninterrupted reference: round 0 copied, then round 1 and the final report."
    run = copy_run(round0, tmp_path_factory.mktemp('ei_run')/'reference')
    p = ei(run)
    assert p.returncode == 0, p.stderr[-3000:]
    got = [f'1:{s}' for s in ROUND1]
    assert [x for x in executed(p.stderr) if x.startswith('1:')] == got, 'round 1 did not run all seven stages (data stop?): ' + p.stderr[-2000:]
    return run


# -- killing and signals -----------------------------------------------------------------------------------

def _start_and_wait_for(run, stage, *args, rnd=1):
    "Start `ei run` in the background and return it once `stage` of round `rnd` is executing in a kernel."
    proc = subprocess.Popen(ei_cmd(run, *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    partial, t0 = run/f'round_{rnd:02d}'/'.partial'/f'{stage}.ipynb', time.time()
    while not partial.exists():
        assert proc.poll() is None, f'driver ended before {stage} started: {proc.stderr.read()[-2000:]}'
        assert time.time() - t0 < 600, f'{stage} never started'
        time.sleep(0.1)
    return proc

def _wait_gone(run, timeout=10.0):
    t0 = time.time()
    while tagged(run) and time.time() - t0 < timeout: time.sleep(0.2)
    return tagged(run)

KILL_POINTS = [(0, '01_sample_verify')] + [(1, s) for s in ROUND1]   # round 1 reuses round 0's samples: kill a real generation in round 0

@pytest.mark.slow
@pytest.mark.parametrize('rnd,stage', KILL_POINTS)
def test_sigkill_inside_each_stage_then_resume(reference, tmp_path, rnd, stage):
    "SIGKILL the driver while `stage` runs in its kernel; rerun: identical artefacts and chain hashes."
    run = copy_run(reference, tmp_path/'run')
    d = run/f'round_{rnd:02d}'
    wall = json.loads((reference/d.name/'stages'/f'{stage}.done').read_text())['wall_s']
    proc = _start_and_wait_for(run, stage, '--redo', f'{rnd}:{stage}', rnd=rnd)
    time.sleep(min(max(0.2, 0.4 * wall - 3.0), 6.0))                 # the kernel starts in about 3 s: kill during the work
    proc.kill(); proc.wait(30)
    assert _wait_gone(run) == [], 'a kernel or stage process outlived the killed driver'
    assert not (d/'stages'/f'{stage}.done').exists(), 'the stage finished before the kill'
    assert not (d/f'{stage}.ipynb').exists()                          # the executed notebook is only moved in when the stage ends
    p = ei(run)
    assert p.returncode == 0, p.stderr[-3000:]
    assert executed(p.stderr)[0] == f'{rnd}:{stage}'                  # earlier stages were skipped, not rerun
    assert artefacts(run) == artefacts(reference)

def test_sigkill_in_every_stage_of_a_round_in_turn(reference, tmp_path):
    "One run killed inside 00, resumed and killed inside 01, ... inside 06, then finished: identical to the reference."
    run, args = copy_run(reference, tmp_path/'run'), ['--redo', '1:00_select']
    for stage in ROUND1:
        wall = json.loads((reference/'round_01'/'stages'/f'{stage}.done').read_text())['wall_s']
        proc = _start_and_wait_for(run, stage, *args)
        time.sleep(min(max(0.2, 0.4 * wall - 3.0), 6.0))
        proc.kill(); proc.wait(30)
        assert _wait_gone(run) == [], f'a process outlived the driver killed in {stage}'
        assert not (run/'round_01'/'stages'/f'{stage}.done').exists(), f'{stage} finished before the kill'
        args = []
    p = ei(run)
    assert p.returncode == 0, p.stderr[-3000:]
    assert executed(p.stderr) == ['1:06_report', 'final:06_report']
    assert artefacts(run) == artefacts(reference)

def test_sigterm_exits_143_and_resumes(reference, tmp_path):
    "SIGTERM during SFT: exit 143, kernel gone, no marker, no partial artefact; a rerun completes identically."
    run = copy_run(reference, tmp_path/'run')
    proc = _start_and_wait_for(run, '02_sft', '--redo', '1:02_sft')
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(90) == 143, proc.stderr.read()[-2000:]
    assert _wait_gone(run, 5) == []
    d = run/'round_01'
    assert not (d/'stages'/'02_sft.done').exists() and not (d/'02_sft.ipynb').exists()
    for f in d.glob('*.jsonl'): list(iter_jsonl(f))                    # every file at a final path is complete
    if (d/'merged').exists(): assert (d/'merged'/'config.json').exists() and list((d/'merged').glob('*.safetensors'))
    assert not [p for p in d.iterdir() if p.name.endswith('.tmp') and not p.name.startswith('.')]
    p = ei(run)
    assert p.returncode == 0, p.stderr[-3000:]
    assert artefacts(run) == artefacts(reference)

def test_second_driver_on_the_same_run_is_refused(reference, tmp_path):
    from ei_nb.driver import run_lock
    run = copy_run(reference, tmp_path/'run')
    with run_lock(run):
        p = ei(run)
    assert p.returncode == 3 and 'in use by another' in p.stderr


# -- refusals and redo ------------------------------------------------------------------------------------

def _bookkeeping(run) -> dict:
    "sha256 of run.json and of every manifest and marker: what a refused run must leave exactly as it was."
    files = [run/'run.json', *run.glob('round_*/round_manifest.json'), *run.glob('**/stages/*.done')]
    return {str(f.relative_to(run)): _h(f) for f in files if 'superseded' not in f.parts}

def test_changed_parameter_is_refused_and_redo_reruns_exactly_the_rest(reference, tmp_path):
    run = copy_run(reference, tmp_path/'run')
    before = {m: json.loads(m.read_text()) for m in run.glob('round_*/stages/*.done')}
    kept = _bookkeeping(run)
    p = ei(run, '--set', 'stop_rule.regress=1')
    assert p.returncode == 3, p.stderr
    assert 'regress: 3 -> 1' in p.stderr and '--redo 1:05_stop_rule' in p.stderr
    assert _bookkeeping(run) == kept                                  # refused before anything was written
    p = ei(run, '--set', 'stop_rule.regress=1', '--redo', '1:05_stop_rule')
    assert p.returncode == 0, p.stderr[-3000:]
    assert executed(p.stderr) == ['1:05_stop_rule', '1:06_report', 'final:06_report']
    for m, old in before.items():
        new = json.loads(m.read_text())
        same = m.parent.parent.name == 'round_00' or m.stem in ROUND1[:5]
        assert (new.get('finished') == old.get('finished')) == same, m        # earlier stages untouched, later ones rerun
    assert json.loads((run/'round_01'/'stages'/'05_stop_rule.done').read_text())['params']['regress'] == 1
    assert list((run/'superseded').glob('*/round_01/05_stop_rule.ipynb'))   # the old audit trail is kept

def test_reseeded_stage_is_refused_not_skipped(reference, tmp_path):
    "A new seed changes the stage's result: a finished stage with another seed is refused (exit 3), never skipped."
    run = copy_run(reference, tmp_path/'run')
    kept = _bookkeeping(run)
    for key, where in (('sft.seed', '1:02_sft'), ('select.seed', '1:00_select'), ('eval.seed', '0:04_eval')):
        p = ei(run, '--set', f'{key}=7')
        assert p.returncode == 3 and 'seed: ' in p.stderr and f'--redo {where}' in p.stderr, (key, p.stderr[-1000:])
        assert executed(p.stderr) == []
    assert _bookkeeping(run) == kept

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
        assert rec and rec['stage'] == stage and rec['status'] == 'done' and rec['wall_s'] > 0, stage
    ev = read_stage_json(L.round(1).stage_json('04_eval'))
    assert ev['headline']['solved'] == json.loads(L.round(1).eval_json.read_text())['solved']
    assert ev['outputs']['verdicts']['sha256'] == _h(L.round(1).eval_verdicts)
    assert read_stage_json(L.round(1).stage_json('05_stop_rule'))['headline'] == json.loads(L.round(1).decision.read_text())
    assert read_stage_json(L.round(0).stage_json('01_sample_verify'))['params']['data_rule'] is False   # no data rule on the pool measurement

def test_redo_a_middle_stage_reruns_it_and_everything_after(reference, tmp_path):
    run = copy_run(reference, tmp_path/'run')
    p = ei(run, '--redo', '1:03')
    assert p.returncode == 0, p.stderr[-3000:]
    assert executed(p.stderr) == ['1:03_average', '1:04_eval', '1:05_stop_rule', '1:06_report', 'final:06_report']
    assert artefacts(run) == artefacts(reference)                    # same seeds, same result

def test_finished_run_is_skipped_entirely(reference, tmp_path):
    run = copy_run(reference, tmp_path/'run')
    p = ei(run)
    assert p.returncode == 0 and executed(p.stderr) == [], p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary['decision']['reason'] == 'budget'
    S1 = json.loads((run/'round_01'/'eval'/'eval.json').read_text())['solved']
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


# -- split hygiene ----------------------------------------------------------------------------------------

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


# -- the plan ---------------------------------------------------------------------------------------------

def test_dry_run_of_the_reference_gpu_config():
    p = subprocess.run([sys.executable, '-c', ENTRY, 'run', '--config', str(REPO/'configs'/'goedel8b.toml'), '--dry-run'],
                       capture_output=True, text=True, env=ENV, cwd=REPO)
    assert p.returncode == 0, p.stderr
    for stage in ROUND1: assert re.search(rf'round 3  {stage}', p.stdout)
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert 20 * 3600 < summary['eta_s'] < 40 * 3600                    # 3 rounds of about 8 h, plus round 0
    assert not (REPO/'runs'/'goedel8b').exists()


# -- failures and data stops ------------------------------------------------------------------------------

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
    dec = json.loads((run/'round_01'/'decision.json').read_text())
    assert dec['stop'] and dec['reason'] == 'data' and 'no problem in the pass-rate band' in dec['detail']
    assert dec['best_round'] == 0 and 'base model' in dec['best_note']   # no round has a score: best/ is the base
    sj = json.loads((run/'round_01'/'stages'/'00_select.json').read_text())
    assert sj['status'] == 'data_stop' and 'no problem in the pass-rate band' in sj['reason']
    assert json.loads((run/'round_01'/'stages'/'00_select.done').read_text())['status'] == 'data_stop'
    p = ei(run, '--set', 'select.hi=0.01')                           # a rerun reaches the same end without running anything
    assert p.returncode == 4 and executed(p.stderr) == []

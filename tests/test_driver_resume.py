"""`ei run` killed, signalled, refused and redone: every resumed run ends identical to an uninterrupted one.
The fixtures (one small demo run to round 0, its continuation through round 1) are built once per worker."""
import json, signal, subprocess, time
from pathlib import Path
import pytest
from ei_nb.core import iter_jsonl
from tests.driver_common import *   # noqa: F403 (the helpers and the session fixtures round0 and reference)
from tests.driver_common import _h, _records


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

@pytest.mark.slow   # 5 minutes; CI keeps the SIGTERM resume below, and 02, DPO, 01c and the CLIs have their own SIGKILL tests
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

def test_redo_a_middle_stage_reruns_it_and_everything_after(reference, tmp_path):
    run = copy_run(reference, tmp_path/'run')
    p = ei(run, '--redo', '1:03')
    assert p.returncode == 0, p.stderr[-3000:]
    assert executed(p.stderr) == ['1:03_average', '1:04_eval', '1:05_stop_rule', '1:06_report', 'final:06_report']
    assert artefacts(run) == artefacts(reference)                    # same seeds, same result

"""`ei confirm`: registration hashes, refusal of changed models, the lock, forced reruns, the report from files
alone, and resumption. Sampling is the synthetic runner (no model, no Lean) except where a real tiny model's
weights are hashed; a real `run_eval` confirmation of a tiny model runs when `ei_nb.eval.run_eval` exists."""
import functools, json, shutil
from pathlib import Path
import pytest
from ei_nb.cli import main
from ei_nb.core import BadInput, StageFailed, jsonl_bytes, atomic_write_bytes, shared_data, sha256_file
from ei_nb import confirm as cf
from ei_nb.layout import RunLayout, stage_numbers
from tests import confirm_doubles as doubles
from tests.confirm_doubles import RUNNER as SYN


def _flip(path, at=100):
    b = bytearray(Path(path).read_bytes()); b[at] ^= 1; Path(path).write_bytes(bytes(b))


@pytest.fixture
def setup(tmp_path):
    "A run folder with two synthetic models and a 10-problem test subset; returns (run_dir, register kwargs)."
    run = tmp_path/'run'
    m, b = doubles.synthetic_model(tmp_path/'m', 0.45), doubles.synthetic_model(tmp_path/'b', 0.25, seed=1)
    sub = tmp_path/'sub.jsonl'
    atomic_write_bytes(sub, jsonl_bytes(cf.load_test_problems()[0][:10]))
    return run, dict(model=m, baseline_model=b, n=4, max_new_tokens=16, problems=sub, runner=SYN)


def _cli_args(run, kw):
    return ['--run-dir', str(run), '--model', str(kw['model']), '--baseline-model', str(kw['baseline_model']),
            '--n', str(kw['n']), '--max-new-tokens', str(kw['max_new_tokens']), '--problems', str(kw['problems']), '--runner', SYN]


@pytest.fixture(scope='module')
def tiny_pair(tmp_path_factory):
    from ei_nb.tiny import build_tiny_model
    d = tmp_path_factory.mktemp('tiny')
    return build_tiny_model(d/'base', seed=0), build_tiny_model(d/'chosen', seed=1)


def test_registration_hash_changes_with_one_weight_byte(tmp_path, tiny_pair):
    base, chosen = tiny_pair
    m = tmp_path/'chosen'; shutil.copytree(chosen, m)
    kw = dict(model=m, baseline_model=base, n=2, problems=None, runner=SYN)
    r0, _ = cf.build_registration(tmp_path/'run', **kw)
    _flip(m/'model.safetensors', at=4096)
    r1, _ = cf.build_registration(tmp_path/'run', **kw)
    f0, f1 = r0['models']['model']['files'], r1['models']['model']['files']
    assert f0['model.safetensors']['sha256'] != f1['model.safetensors']['sha256']
    assert {k: v for k, v in f0.items() if k != 'model.safetensors'} == {k: v for k, v in f1.items() if k != 'model.safetensors'}
    assert r0['models']['model']['fingerprint'] != r1['models']['model']['fingerprint']
    assert r0['registration_id'] != r1['registration_id']
    assert r0['models']['baseline'] == r1['models']['baseline']
    assert r0['problems']['sha256'][:16] == 'd6654c88476ff14d' and r0['problems']['n_problems'] == 244


def test_registration_records_protocol_and_problem_file(setup):
    run, kw = setup
    goedel = shared_data('minif2f_test_goedel_v2.jsonl')
    out = cf.register(run, **{**kw, 'problems': goedel, 'sampler': {}, 'verifier': {'verify_backend': 'synthetic'}})
    reg = json.loads((run/'confirm'/'registration.json').read_text())
    assert out['n_problems'] == 244 and reg['problems']['file'] == 'minif2f_test_goedel_v2.jsonl'
    assert reg['problems']['sha256'] == sha256_file(goedel) and reg['problems']['format'] == 'full_text'
    assert len(reg['problems']['differs_from_default']['changed']) == 15
    assert reg['verifier'] == {'verify_backend': 'synthetic'} and reg['seeds'] == {'model': 0, 'baseline': 0}
    assert reg['hypothesis']['alpha'] == 0.05 and 'more of the registered test problems' in reg['hypothesis']['text']
    assert set(reg['code']) >= {'git_commit', 'libraries', 'ei_nb', 'python'} and reg['runner']['defaults']['n'] == 8
    rows = [json.loads(l) for l in (run/'confirm'/'problems.jsonl').read_text().splitlines()]
    assert all(r['header'].startswith('import Mathlib') and r['formal_statement'].startswith('theorem ') for r in rows)


def test_run_refuses_without_registration_and_on_changed_model(setup):
    run, kw = setup
    assert main(['confirm', 'run', '--run-dir', str(run)]) == 2            # no registration
    assert main(['confirm', 'register', *_cli_args(run, kw)]) == 0
    _flip(kw['model']/'model.safetensors')
    with pytest.raises(StageFailed, match='model: model.safetensors changed'): cf.run_confirmation(run, report=False)
    assert main(['confirm', 'run', '--run-dir', str(run), '--no-report']) == 3
    assert not cf.has_test_samples(run/'confirm')                          # refused before any sample
    _flip(kw['model']/'model.safetensors')                                 # restored: runs
    (kw['baseline_model']/'extra.bin').write_bytes(b'x')
    with pytest.raises(StageFailed, match='baseline: extra.bin was added'): cf.run_confirmation(run, report=False)


def test_default_models_need_a_run_record(setup):
    run, kw = setup
    with pytest.raises(BadInput, match='--model and --baseline-model'):
        cf.register(run, **{**kw, 'model': None, 'baseline_model': None})


def test_lock_holds(setup):
    run, kw = setup
    cf.register(run, **kw)
    first = cf.run_confirmation(run, report=False)
    assert first['status'] == 'confirmed' and (run/'confirm'/'lock.json').exists()
    with pytest.raises(StageFailed, match='already ran'): cf.run_confirmation(run, report=False)
    assert main(['confirm', 'run', '--run-dir', str(run), '--no-report']) == 3
    assert cf.register(run, **kw)['status'] == 'unchanged'                 # same protocol: a no-op
    with pytest.raises(StageFailed, match='test samples already exist'): cf.register(run, **{**kw, 'seed': 7})
    assert main(['confirm', 'register', *_cli_args(run, kw), '--n', '8']) == 3
    with pytest.raises(BadInput, match='--reason'): cf.run_confirmation(run, force_rerun=True, report=False)


def test_changed_registration_refused_once_samples_exist(setup):
    run, kw = setup
    cf.register(run, **kw)
    cf.register(run, **{**kw, 'seed': 3})                                  # before any sample: allowed, old one kept
    assert len(list((run/'confirm'/'history').glob('registration_*.json'))) == 1
    with pytest.raises(KeyboardInterrupt):
        cf.run_confirmation(run, runner=functools.partial(doubles.synthetic_runner, _interrupt_after=2), report=False)
    with pytest.raises(StageFailed, match='test samples already exist'): cf.register(run, **{**kw, 'seed': 4})


def test_forced_rerun_keeps_both_records(setup):
    run, kw = setup
    cd = run/'confirm'
    cf.register(run, **kw)
    cf.run_confirmation(run, report=False)
    first = json.loads((cd/'result.json').read_text())
    first_verdicts = (cd/'model'/'eval_verdicts.jsonl').read_bytes()
    assert main(['confirm', 'run', '--run-dir', str(run), '--no-report', '--force-rerun', '--reason', 'verifier bug fixed']) == 0
    second = json.loads((cd/'result.json').read_text())
    assert second['attempt'] == 2 and second['forced_rerun'] == {'reason': 'verifier bug fixed', 'previous': 'attempts/001'}
    assert json.loads((cd/'attempts'/'001'/'result.json').read_text()) == first
    assert (cd/'attempts'/'001'/'model'/'eval_verdicts.jsonl').read_bytes() == first_verdicts
    assert (cd/'attempts'/'001'/'registration.json').read_bytes() == (cd/'registration.json').read_bytes()
    ev = cf.read_record(cd)
    assert [e['event'] for e in ev] == ['registered', 'run_started', 'run_finished', 'archived', 'run_started', 'run_finished']
    done = [e for e in ev if e['event'] == 'run_finished']
    assert [e['attempt'] for e in done] == [1, 2] and done[1]['reason'] == 'verifier bug fixed' and done[0]['reason'] is None
    assert done[0]['result']['model_solved'] == first['scores']['model']['solved']
    # a forced re-registration after samples exist archives attempt 2 as well
    cf.register(run, force_rerun=True, reason='wrong cap registered', **{**kw, 'max_new_tokens': 32})
    assert (cd/'attempts'/'002'/'result.json').exists() and not (cd/'result.json').exists()
    assert cf.read_record(cd)[-1] == {**cf.read_record(cd)[-1], 'event': 'registered', 'reason': 'wrong cap registered', 'forced': True}


def test_resumed_confirmation_equals_uninterrupted(tmp_path, setup):
    run, kw = setup
    other = tmp_path/'run2'
    cf.register(run, **kw); cf.register(other, **kw)
    cf.run_confirmation(run, report=False)
    for k in (3, 7):   # 3 of 10 problems of the model arm; then its other 7 and 7 of the baseline arm
        with pytest.raises(KeyboardInterrupt):
            cf.run_confirmation(other, runner=functools.partial(doubles.synthetic_runner, _interrupt_after=k), report=False)
    assert (other/'confirm'/'model'/'arm_done.json').exists() and not (other/'confirm'/'baseline'/'arm_done.json').exists()
    cf.run_confirmation(other, report=False)
    for arm in cf.ARMS:
        for f in ('eval_samples.jsonl', 'eval_verdicts.jsonl'):
            assert (run/'confirm'/arm/f).read_bytes() == (other/'confirm'/arm/f).read_bytes()
    a, b = (json.loads((d/'confirm'/'result.json').read_text()) for d in (run, other))
    for k in ('registration_id', 'scores', 'mcnemar', 'disagreements', 'power', 'outcome', 'statement', 'verdicts_sha256'):
        assert a[k] == b[k], k
    assert [e.get('resumed') for e in cf.read_record(other/'confirm') if e['event'] == 'run_started'] == [False, True, True]


def test_baseline_from_an_earlier_confirmation(tmp_path, setup):
    run, kw = setup
    cf.register(run, **kw); cf.run_confirmation(run, report=False)
    new = doubles.synthetic_model(tmp_path/'m2', 0.5, seed=2)
    with pytest.raises(BadInput, match='different settings: n'):
        cf.register(tmp_path/'r2', **{**kw, 'model': new, 'n': 8, 'baseline_from': run})
    cf.register(tmp_path/'r2', **{**kw, 'model': new, 'baseline_from': run})
    out = cf.run_confirmation(tmp_path/'r2', report=False)
    assert (tmp_path/'r2'/'confirm'/'baseline'/'eval_verdicts.jsonl').read_bytes() == (run/'confirm'/'baseline'/'eval_verdicts.jsonl').read_bytes()
    assert json.loads((tmp_path/'r2'/'confirm'/'baseline'/'arm_done.json').read_text())['source'] == str((run/'confirm').resolve())
    assert out['baseline_solved'] == json.loads((run/'confirm'/'result.json').read_text())['scores']['baseline']['solved']
    # the earlier verdicts are checked by hash when they are copied
    cf.register(tmp_path/'r3', **{**kw, 'model': new, 'baseline_from': run})
    _flip(run/'confirm'/'baseline'/'eval_verdicts.jsonl', at=5)
    with pytest.raises(StageFailed, match='changed since it was registered'): cf.run_confirmation(tmp_path/'r3', report=False)


@pytest.mark.slow
def test_report_renders_from_files_alone(tmp_path, capsys):
    cd = doubles.synthetic_confirmation(tmp_path/'run', n_problems=12, n=8)
    moved = tmp_path/'elsewhere'/'confirm'
    shutil.copytree(cd, moved)
    shutil.rmtree(tmp_path/'run')                                      # no models, no source problems file: files only
    nb = cf.render_report(moved.parent)
    assert nb == moved.resolve()/'confirm_report.ipynb'
    assert (moved/'confirm_scores.png').stat().st_size > 1000 and (moved/'confirm_problems.png').stat().st_size > 1000
    text = nb.read_text()
    res = json.loads((moved/'result.json').read_text())
    assert 'synthetic runner' in text and f"b = {res['mcnemar']['b']}, c = {res['mcnemar']['c']}" in text
    assert 'Outcome: ' + res['outcome'] in text
    assert all(n in text for n in res['disagreements']['model_only'] + res['disagreements']['baseline_only'])
    # a tampered verdict file stops the report before the notebook runs, naming the file (exit 3 from `ei confirm report`)
    _flip(moved/'model'/'eval_verdicts.jsonl', at=3)
    with pytest.raises(StageFailed, match='changed after its lock: model/eval_verdicts.jsonl changed after the lock'): cf.render_report(moved.parent)
    capsys.readouterr()
    assert main(['confirm', 'status', '--run-dir', str(moved.parent)]) == 3
    assert main(['confirm', 'report', '--run-dir', str(moved.parent)]) == 3
    assert capsys.readouterr().err.count('model/eval_verdicts.jsonl changed after the lock') == 2
    assert json.loads(nb.read_text())  # the earlier report is still in place


def _has_run_eval():
    import ei_nb.eval
    return hasattr(ei_nb.eval, 'eval_arm')


@pytest.mark.slow
@pytest.mark.skipif(not _has_run_eval(), reason='ei_nb.eval.run_eval not available yet')
def test_tiny_model_confirmation_with_run_eval(tmp_path, tiny_pair):
    "A real confirmation (transformers sampling) of a tiny random model against another: the numbers mean nothing."
    base, chosen = tiny_pair
    sub = tmp_path/'sub.jsonl'
    atomic_write_bytes(sub, jsonl_bytes(cf.load_test_problems()[0][:3]))
    kw = dict(model=chosen, baseline_model=base, n=2, max_new_tokens=8, problems=sub)
    with pytest.raises(BadInput, match='nothing can pass'): cf.register(tmp_path/'run', **kw)
    cf.register(tmp_path/'run', allow_unverified=True, sampler={'chunk_problems': 2}, **kw)
    with pytest.raises(KeyboardInterrupt):   # interrupted after the model arm: resumes with the registered runner
        cf.run_confirmation(tmp_path/'run', runner=_stop_before_baseline, report=False)
    out = cf.run_confirmation(tmp_path/'run', report=False)
    assert out['n_problems'] == 3 and out['status'] == 'confirmed'
    assert (out['model_solved'], out['baseline_solved'], out['outcome']) == (0, 0, 'not supported')   # nothing verified
    ev = stage_numbers(RunLayout(tmp_path/'run').confirm.arm('model').stage_json)     # the arm's one summary, named by the layout
    assert ev['allow_test_selection'] and ev['sampler']['max_new_tokens'] == 8 and ev['n_samples'] == 6


def _stop_before_baseline(problems, model_dir, out_dir, **kw):
    from ei_nb.eval import eval_arm
    if Path(out_dir).name == 'baseline': raise KeyboardInterrupt('stop')
    return eval_arm(problems, model_dir, out_dir, **kw)


def test_every_file_of_a_confirmation_is_named_by_the_layout(tmp_path):
    "After a run and a forced rerun, each file in RUN/confirm/ is one `ConfirmLayout` names (arms: `EvalLayout`)."
    cd = doubles.synthetic_confirmation(tmp_path/'run', n_problems=4, n=4)
    cf.run_confirmation(tmp_path/'run', force_rerun=True, reason='layout test', report=False)   # attempt 1 moves to attempts/001/
    C = RunLayout(tmp_path/'run').confirm
    named = {C.registration, C.problems, C.record, C.result, C.lock, C.report, C.scores_png, C.problems_png,
             *(p for a in cf.ARMS for p in (C.arm(a).samples, C.arm(a).verdicts, C.arm(a).stage_json, C.arm_done(a)))}
    for f in cd.rglob('*'):
        if not f.is_file() or f.name.endswith('.settings.json'): continue
        rel = f.relative_to(cd)
        if rel.parts[0] == 'attempts': f = cd/Path(*rel.parts[2:])     # an attempt keeps the names of the files it moved
        assert f in named, f'{rel} is not named by ConfirmLayout'
    assert (C.attempts/'001'/'model'/'stage.json').exists()             # the arm's summary moved with its attempt

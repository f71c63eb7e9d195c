"""Lean's messages kept in verdicts (REPL and `lean --json` shapes, through the fake REPL) and the
self-correction turn built from them, on real miniF2F statements and published proofs. No Lean runs."""
import json, sys
from pathlib import Path
import pytest

from ei_nb.core import check_record, shared_data
from ei_nb.prompts import CORRECTION_PROMPT, correction_messages, error_feedback
from ei_nb.lean_reply import MESSAGE_CAP
from ei_nb.policy import extract_code
from ei_nb.verify import make_verifier

FAKE = str(Path(__file__).with_name('fake_repl.py'))
FAKE_REPLAY = str(Path(__file__).with_name('fake_replay.py'))   # the stand-in kernel replay tool (issue 28)
MINIF2F = {r['name']: r for r in map(json.loads, open(shared_data('minif2f_dsp15.jsonl'), encoding='utf-8'))}
FEW_SHOT = {r['name']: r for r in map(json.loads, open(shared_data('minif2f_valid_few_shot_dsp15.jsonl'), encoding='utf-8'))}
NAME = 'mathd_algebra_182'


def completion(directive:str) -> str:
    "The published proof of NAME with a fake-REPL directive on its last line (a Lean comment)."
    p, fs = MINIF2F[NAME], FEW_SHOT[NAME]
    return f"A plan.\n\n```lean4\n{p['header']}{fs['formal_statement']}{fs['formal_proof'].rstrip()}  -- {directive}\n```\n"


def sample(text, idx=0):
    return {'name': NAME, 'sample_idx': idx, 'round': 0, 'completion': text, 'n_tokens': 10, 'capped': False}


@pytest.fixture
def project(tmp_path):
    (tmp_path/'lean-toolchain').write_text('leanprover/lean4:v4.9.0-rc1\n')
    return tmp_path


def verifiers(project):
    "The three Lean back-ends against their stand-ins: the REPL, `lean --json`, a kimina-lean-server (positions from its own start)."
    from tests.test_verify import kimina
    yield 'repl', make_verifier('repl', project=project, timeout=5, mem_mb=256, repl_cmd=[sys.executable, FAKE], replay_cmd=[sys.executable, FAKE_REPLAY])
    yield 'lean', make_verifier('lean', project=project, timeout=5, mem_mb=256, lean_cmd=[sys.executable, FAKE, '--lean'], replay_cmd=[sys.executable, FAKE_REPLAY])
    with kimina(1) as (urls, _):
        yield 'server', make_verifier('server', endpoints=urls, timeout=5)


def test_lean_errors_are_kept_at_the_proofs_own_lines(project):
    "The REPL counts from the proof, `lean --json` from the header, the server from the first non-import line: all land on the proof's line."
    text = completion('FAKE:error')
    code = extract_code(text)
    want = next(i for i, l in enumerate(code.split('\n'), 1) if 'FAKE:error' in l)
    for kind, v in verifiers(project):
        with v: r = v.verify_one(MINIF2F[NAME], sample(text))
        check_record(r, 'verdict')
        assert r['verdict'] == 'fail' and r['reason'].startswith('lean error'), (kind, r)
        assert [(m['severity'], m['line'], m['text']) for m in r['messages']] == [('error', want, 'unsolved goals\n⊢ False')], (kind, r)
        assert r['messages_cap'] == MESSAGE_CAP and r['messages_omitted'] == 0
        fb = error_feedback(r['proof'], r['messages'])
        assert '<error>' in fb and 'Error Message: unsolved goals' in fb and 'FAKE:error' in fb, fb


def test_a_pass_and_a_sorry(project):
    for kind, v in verifiers(project):
        with v:
            ok = v.verify_one(MINIF2F[NAME], sample(completion('nothing'), 0))
            sorry = v.verify_one(MINIF2F[NAME], sample(completion('FAKE:sorry428'), 1))
        assert ok['verdict'] == 'pass' and 'messages' not in ok, (kind, ok)
        assert sorry['verdict'] == 'fail' and [m['severity'] for m in sorry['messages']] == ['warning'], (kind, sorry)


def test_a_precheck_rejection_carries_its_rule_and_cannot_be_quoted(project):
    p = MINIF2F[NAME]
    cheat = f"```lean4\n{p['header']}{FEW_SHOT[NAME]['formal_statement']}\n  sorry\n```"
    for kind, v in verifiers(project):
        with v: r = v.verify_one(p, sample(cheat))
        assert r['verdict'] == 'fail' and r['messages'] == [{'severity': 'error', 'rule': 'sorry', 'text': r['reason']}], (kind, r)
        assert error_feedback(r['proof'], r['messages']) == ''


def test_correction_turn_on_a_real_statement():
    p = MINIF2F[NAME]
    code = FEW_SHOT[NAME]['formal_statement'] + '  nlinarith [sq_nonneg y]\n  ring_nf'
    n = code.split('\n').index('  ring_nf') + 1
    msgs = [{'severity': 'error', 'line': n, 'column': 2, 'end_line': n, 'end_column': 9, 'text': 'no goals to be proved'}]
    turn = correction_messages(p, 'my plan\n```lean4\n' + code + '\n```', error_feedback(code, msgs))
    assert [m['role'] for m in turn] == ['user', 'assistant', 'user']
    assert turn[0]['content'].startswith('Complete the following Lean 4 code:') and p['formal_statement'].split(':=')[0] in turn[0]['content']
    last = turn[2]['content']
    assert last.startswith('The proof (Round 0) is not correct.') and last.endswith('analysis of the error message.')
    assert '  <error>ring_nf</error>' in last and 'Error Message: no goals to be proved' in last
    assert CORRECTION_PROMPT.format(attempt=0, feedback='F') in last.replace(error_feedback(code, msgs), 'F')


# ---------------------------------------------------------------- the 01c_correct stage
class AcceptAll:
    "A stand-in Lean that accepts every proof the pre-check lets through (its report names the theorem, no bad axiom)."
    identity = {'backend': 'accept_all'}
    def run(self, header, sent, timeout):
        info = lambda line, data: {'severity': 'info', 'pos': {'line': line, 'column': 0}, 'data': data}
        if '#print axioms' not in sent: return {'messages': [info(sent.count('\n'), 'ei-statement-type: T')]}   # the reference statement
        at = sent.rindex('#print axioms')
        line = sent[:at].count('\n') + 1
        name = sent[at:].split()[2].removeprefix('_root_.')          # `#print axioms _root_.NAME`: Lean prints the root NAME
        return {'messages': [info(line, f"'{name}' depends on axioms: [propext]"), info(line + 1, 'ei-statement-type: T')]}
    def close(self): pass

def accept_all(settings): return AcceptAll()


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    from ei_nb.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp('m')/'tiny')


def round_files(d:Path, extra:int=0):
    "A round's 01 records: sample 0 failed with a Lean error, 1 was a pre-check cheat, 2 timed out, 3 passed; `extra` more Lean failures."
    from ei_nb.core import write_records
    p, fs = MINIF2F[NAME], FEW_SHOT[NAME]
    good = fs['formal_statement'] + fs['formal_proof']
    bad = fs['formal_statement'] + '  linarith [foo]'
    cheat = fs['formal_statement'] + '  sorry'
    n_bad = bad.count('\n') + 1
    samples = [sample(f'```lean4\n{c}\n```', i) for i, c in enumerate([bad, cheat, bad + ' ', good])]
    verdicts = [{'name': NAME, 'sample_idx': 0, 'verdict': 'fail', 'proof': bad, 'reason': f"lean error: line {n_bad}: unknown identifier 'foo'",
                 'messages': [{'severity': 'error', 'line': n_bad, 'column': 12, 'end_line': n_bad, 'end_column': 15, 'text': "unknown identifier 'foo'"}]},
                {'name': NAME, 'sample_idx': 1, 'verdict': 'fail', 'proof': cheat, 'reason': 'sorry: line 3',
                 'messages': [{'severity': 'error', 'rule': 'sorry', 'text': 'sorry: line 3'}]},
                {'name': NAME, 'sample_idx': 2, 'verdict': 'error', 'proof': bad, 'reason': 'repl: timeout after 300 s'},
                {'name': NAME, 'sample_idx': 3, 'verdict': 'pass', 'proof': good, 'reason': None}]
    for i in range(4, 4 + extra):
        samples.append(sample(f'```lean4\n{bad}{" " * i}\n```', i)); verdicts.append({**verdicts[0], 'sample_idx': i, 'proof': bad + ' ' * i})
    write_records(d/'selected.jsonl', [p], 'problem'); write_records(d/'samples.jsonl', samples, 'sample')
    write_records(d/'verdicts.jsonl', verdicts, 'verdict')
    return d/'selected.jsonl', d/'samples.jsonl', d/'verdicts.jsonl'


from ei_nb.sample import SAMPLERS, TransformersSampler

class Scripted(TransformersSampler):
    "The tiny model's tokenizer with scripted corrections (a random tiny model writes no Lean the pre-check would pass)."
    name = 'scripted'
    ANSWERS = ['  nlinarith [sq_nonneg y]', '  ring', '  ring']
    def generate(self, prompts, params, seeds):
        return [[{'completion': self.ANSWERS[i % 3], 'n_tokens': len(self.ANSWERS[i % 3]) // 3, 'capped': False} for i in range(params.n)]
                for _ in prompts]


def correct(tiny, d, out, sampler=Scripted, extra=0, **kw):
    from ei_nb.correct import run_correct
    from ei_nb.sample import verifier_of
    SAMPLERS['scripted'] = sampler
    return run_correct(*round_files(d, extra), tiny, out, 1, n=kw.pop('n', 3), max_new_tokens=12, prompt_style='completion', sampler='scripted',
                       verifier=verifier_of('tests.test_corrections:accept_all'), log=lambda *a: None, progress=False, **kw)


def test_only_lean_failures_are_corrected_and_verified_ones_become_rows(tiny, tmp_path):
    from ei_nb.rows import read_sft_rows
    res = correct(tiny, tmp_path, tmp_path/'out')
    assert (res['failures_tried'], res['corrections_sampled']) == (1, 3)          # the cheat, the timeout and the pass: never tried
    tried = [json.loads(l) for l in open(tmp_path/'out'/'correction_problems.jsonl')]
    assert [t['corrects']['sample_idx'] for t in tried] == [0] and "-- Error Message: unknown identifier 'foo'" in tried[0]['turn_prompt']
    rows = read_sft_rows(tmp_path/'out'/'correction_rows.jsonl')
    assert res['corrections_verified'] == 3 and len(rows) == res['rows'] == 1          # distinct, shortest, one per failure
    assert res['keep'] == {'kept': 1, 'over_cap': 1, 'duplicate': 1} and rows[0]['completion'] == '  ring'
    assert rows[0]['name'] == NAME and rows[0]['kind'] == 'correction' and rows[0]['corrects']['sample_idx'] == 0
    assert rows[0]['prompt'] == tried[0]['turn_prompt']


def test_protected_problems_are_never_correction_rows(tiny, tmp_path):
    res = correct(tiny, tmp_path, tmp_path/'out', protected=[{'name': 'x', 'formal_statement': MINIF2F[NAME]['formal_statement']}])
    assert res['rows'] == 0 and res['keep'] == {'dropped_protected': 1} and (tmp_path/'out'/'correction_rows.jsonl').read_text() == ''


def test_a_rerun_resumes_to_identical_files(tiny, tmp_path):
    correct(tiny, tmp_path, tmp_path/'a')
    first = {f: (tmp_path/'a'/f).read_bytes() for f in ('correction_problems.jsonl', 'correction_samples.jsonl', 'correction_rows.jsonl')}
    (tmp_path/'a'/'correction_rows.jsonl').unlink()
    correct(tiny, tmp_path, tmp_path/'a')
    assert {f: (tmp_path/'a'/f).read_bytes() for f in first} == first


def test_02_trains_on_capped_corrections(tmp_path):
    "02 with `correction_rows_path`: corrections join the rows, at most `max_correction_frac` of them, protected never."
    import papermill as pm
    from ei_nb.core import write_records
    p, fs = MINIF2F[NAME], FEW_SHOT[NAME]
    corr = [{'name': NAME, 'sample_idx': i, 'round': 1, 'prompt': f'-- turn {i}\n' + p['formal_statement'], 'completion': fs['formal_proof'],
             'eos': True, 'n_tokens': 40 + i, 'kind': 'correction', 'corrects': {'name': NAME, 'sample_idx': 9, 'round': 1}} for i in range(50)]
    write_records(tmp_path/'corr.jsonl', corr)
    nb = Path(__file__).resolve().parents[1]/'nbs'/'02_sft.ipynb'
    pm.execute_notebook(str(nb), str(tmp_path/'out.ipynb'), kernel_name='python3', progress_bar=False, cwd=str(nb.parent),
                        parameters={'out_dir': str(tmp_path/'round'), 'correction_rows_path': str(tmp_path/'corr.jsonl'),
                                    'max_correction_frac': 0.2, 'max_steps': 1, 'min_rows': 1})
    rows = [json.loads(l) for l in open(tmp_path/'round'/'sft.jsonl')]
    got = [r for r in rows if r.get('kind') == 'correction']
    data = json.loads((tmp_path/'round'/'stage.json').read_text())['detail']['data']   # 02's one summary
    assert 0 < len(got) <= 0.2 * len(rows) + 1e-9 and data['correction_rows'] == len(got) and data['rows'] == len(rows)
    assert [r['sample_idx'] for r in got] == list(range(len(got)))                  # the shortest first
    write_records(tmp_path/'protected.jsonl', [{'name': NAME}])
    with pytest.raises(pm.PapermillExecutionError, match='protected problem'):      # the guard covers correction rows too
        pm.execute_notebook(str(nb), str(tmp_path/'out2.ipynb'), kernel_name='python3', progress_bar=False, cwd=str(nb.parent),
                            parameters={'out_dir': str(tmp_path/'round2'), 'correction_rows_path': str(tmp_path/'corr.jsonl'),
                                        'max_correction_frac': 0.2, 'max_steps': 1, 'min_rows': 1,
                                        'protected_paths': [str(tmp_path/'protected.jsonl')]})


def test_the_stage_is_wired_only_when_enabled(tmp_path):
    "demo_corrections.toml runs 01c after 01 in every round and feeds 02 its rows; demo.toml has neither."
    from ei_nb.config import load_config; from ei_nb.sources import Sources; from ei_nb.dryrun import plan
    cfgs = Path(__file__).resolve().parents[1]/'configs'
    for name, on in (('demo_corrections.toml', True), ('demo.toml', False)):
        run = Sources(load_config(cfgs/name), tmp_path/name)
        steps = [(s['round'], s['stage']) for s in plan(run)]
        assert ((1, '01c_correct') in steps) == on and ((2, '01c_correct') in steps) == on, steps
        if on: assert steps.index((1, '01c_correct')) == steps.index((1, '01_sample_verify')) + 1
        rows = run.params(1, '02_sft')['correction_rows_path']
        assert rows == (str(tmp_path/name/'round_01'/'correction_rows.jsonl') if on else ''), rows


class SlowScripted(Scripted):
    def generate(self, prompts, params, seeds):
        import time; time.sleep(1.5)
        return super().generate(prompts, params, seeds)


def test_sigkill_inside_the_stage_then_rerun_gives_identical_files(tiny, tmp_path):
    "Killed while correcting the third of six failures (one per chunk); the rerun resumes to the files of an uninterrupted run."
    import signal, subprocess, time
    from ei_nb.core import iter_jsonl
    kw = dict(extra=5, max_per_problem=6, chunk_problems=1)
    a = correct(tiny, tmp_path/'a', tmp_path/'a'/'out', **kw)
    (tmp_path/'b').mkdir()
    child = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); from pathlib import Path; "
             f"import tests.test_corrections as T; T.correct(Path({str(tiny)!r}), Path({str(tmp_path/'b')!r}), "
             f"Path({str(tmp_path/'b'/'out')!r}), sampler=T.SlowScripted, **{kw!r})")
    proc = subprocess.Popen([sys.executable, '-c', child], stderr=subprocess.PIPE, text=True)
    got, t0 = tmp_path/'b'/'out'/'correction_samples.jsonl', time.time()
    while not (got.exists() and got.read_text().count('\n') >= 6):            # two chunks (of three samples) written
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.time() - t0 < 120; time.sleep(0.05)
    proc.send_signal(signal.SIGKILL); proc.wait()
    assert not (tmp_path/'b'/'out'/'correction_rows.jsonl').exists()          # killed inside the stage (the rows come last)
    b = correct(tiny, tmp_path/'b', tmp_path/'b'/'out', **kw)
    for f in ('correction_problems.jsonl', 'correction_samples.jsonl', 'correction_verdicts.jsonl', 'correction_rows.jsonl'):
        rows = lambda d: [{k: v for k, v in r.items() if k != 'verify_s'} for _, r in iter_jsonl(tmp_path/d/'out'/f)]
        assert rows('a') == rows('b'), f
    same = lambda r: {k: v for k, v in r.items() if k not in ('timings', 'n_generated')}   # the rerun generated only what was missing
    assert same(a) == same(b) and b['n_generated'] < a['n_generated']

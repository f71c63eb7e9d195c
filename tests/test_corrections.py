"""Lean's messages kept in verdicts (REPL and `lean --json` shapes, through the fake REPL) and the
self-correction turn built from them, on real miniF2F statements and published proofs. No Lean runs."""
import json, sys
from pathlib import Path
import pytest
ROOT = Path(__file__).resolve().parents[1]

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


# -- Goedel-Prover-V2's feedback, byte for byte. The expected strings are derived by hand from the behaviour of
# `get_error_str` (Goedel-LM/Goedel-Prover-V2 @ 2e9036e, src/utils.py; the repository has no licence, so it is not
# copied): per error "\nError i:\n", "\nCorresponding Code:\n```lean4\n", four lines before the span, the span
# marked (a long one: five lines, a blank line, the marker indented as the fifth), one line after, "\n```\n",
# "\nError Message: ...\n"; then "\n... [Omitted k more errors] ...\n".
GCODE = '\n'.join(['theorem t : True := by', '  have h1 : 1 = 1 := by', '    rfl', '  have h2 : 2 = 2 := by', '    rfl', '  exact foo',
                   '  simp', '  norm_num', '  omega', '  trivial'])
E = lambda l, c, el, ec, text='boom': {'severity': 'error', 'line': l, 'column': c, 'end_line': el, 'end_column': ec, 'text': text}
GOEDEL_CASES = [
    ('one-line span', E(6, 2, 6, 11, "unknown identifier 'foo'"),
     "  have h1 : 1 = 1 := by\n    rfl\n  have h2 : 2 = 2 := by\n    rfl\n  <error>exact foo</error>\n  simp\n", "unknown identifier 'foo'"),
    ('no end position, first line', E(1, 8, None, None),
     "theorem <error>t : True := by</error>\n  have h1 : 1 = 1 := by\n", 'boom'),
    ('last line', E(10, 2, 10, 9),
     "  exact foo\n  simp\n  norm_num\n  omega\n  <error>trivial</error>\n", 'boom'),
    ('two-line span', E(2, 2, 3, 7),
     "theorem t : True := by\n  <error>have h1 : 1 = 1 := by\n    rfl</error>\n  have h2 : 2 = 2 := by\n", 'boom'),
    ('ten-line span, truncated', E(1, 0, 10, 9),
     "<error>theorem t : True := by\n  have h1 : 1 = 1 := by\n    rfl\n  have h2 : 2 = 2 := by\n    rfl\n  exact foo\n"
     "\n  ... --[Truncated]-- ...\n  trivial</error>\n", 'boom'),
]


@pytest.mark.parametrize('case', GOEDEL_CASES, ids=[c[0] for c in GOEDEL_CASES])
def test_feedback_is_goedels_byte_for_byte(case):
    _, msg, block, text = case
    assert error_feedback(GCODE, [msg]) == f"\nError 1:\n\nCorresponding Code:\n```lean4\n{block}\n```\n\nError Message: {text}\n"


def test_ten_whole_errors_keep_eight_and_count_the_rest():
    "Issue 30, point 12: a reply with a sorry warning and ten errors of 2,500 characters (longer than the old 2,000-character cut): 8 kept whole, 2 counted, and the turn says so."
    from ei_nb.lean_reply import lean_messages
    err = lambda k: {'severity': 'error', 'pos': {'line': k, 'column': 0}, 'endPos': {'line': k, 'column': 2}, 'data': chr(96 + k) * 2500}
    reply = {'messages': [{'severity': 'warning', 'pos': {'line': 1, 'column': 0}, 'endPos': None, 'data': "declaration uses 'sorry'"}]
                         + [err(k) for k in range(1, 11)]}
    msgs, omitted = lean_messages(reply, body_lines=10)
    errs = [m for m in msgs if m['severity'] == 'error']
    assert [len(m['text']) for m in errs] == [2500] * 8 and omitted == 2
    fb = error_feedback('\n'.join(f'l{i}' for i in range(1, 11)), msgs, omitted=omitted)
    assert fb.endswith('\n... [Omitted 2 more errors] ...\n') and fb.count('Error Message: ') == 8
    assert all(chr(96 + k) * 2500 in fb for k in range(1, 9))


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


def round_files(d:Path, extra:int=0, solved:bool=False):
    """A round's 01 records: sample 0 failed with a Lean error, 1 was a pre-check cheat, 2 timed out, 3 is an incomplete proof
    (`lean sorry:`; with `solved`, a pass); `extra` more Lean failures."""
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
                {'name': NAME, 'sample_idx': 3, 'verdict': 'pass', 'proof': good, 'reason': None} if solved else
                {'name': NAME, 'sample_idx': 3, 'verdict': 'fail', 'proof': good, 'reason': 'lean sorry: line 2: declaration uses \'sorry\'',
                 'messages': [{'severity': 'warning', 'line': 2, 'column': 8, 'end_line': None, 'end_column': None, 'text': "declaration uses 'sorry'"}]}]
    for i in range(4, 4 + extra):
        samples.append(sample(f'```lean4\n{bad}{" " * i}\n```', i)); verdicts.append({**verdicts[0], 'sample_idx': i, 'proof': bad + ' ' * i})
    write_records(d/'selected.jsonl', [p], 'problem'); write_records(d/'samples.jsonl', samples, 'sample')
    write_records(d/'verdicts.jsonl', verdicts, 'verdict')
    return d/'selected.jsonl', d/'samples.jsonl', d/'verdicts.jsonl'


from ei_nb.samplers import SAMPLERS, TransformersSampler

class Scripted(TransformersSampler):
    "The tiny model's tokenizer with scripted corrections (a random tiny model writes no Lean the pre-check would pass)."
    name = 'scripted'
    ANSWERS = ['  nlinarith [sq_nonneg y]', '  ring', '  ring']
    def generate(self, prompts, params, seeds):
        return [[{'completion': self.ANSWERS[i % 3], 'n_tokens': len(self.ANSWERS[i % 3]) // 3, 'capped': False} for i in range(params.n)]
                for _ in prompts]


def correct(tiny, d, out, sampler=Scripted, extra=0, solved=False, **kw):
    "`run_correct` with the scripted sampler, completion prompts, a verifier that accepts all, and the recipe's rules."
    from ei_nb.correct import PREFIXES, CorrectionRules, run_correct
    from ei_nb.samplers import SampleParams
    from ei_nb.sample_job import SamplerSetup
    from ei_nb.verify import verifier_of
    SAMPLERS['scripted'] = sampler
    rules = CorrectionRules(kw.pop('max_per_problem', 0), kw.pop('max_per_failure', 1), tuple(kw.pop('prefixes', PREFIXES)),
                            kw.pop('max_tokens', 18432))
    setup = SamplerSetup('scripted', None, 'completion', kw.pop('chunk_problems', 4), 0.75)
    return run_correct(*round_files(d, extra, solved), tiny, out, 1, SampleParams(n=kw.pop('n', 3), max_new_tokens=12),
                       verifier_of('tests.test_corrections:accept_all'), setup, rules, kw.pop('protected', ()), log=lambda *a: None)


def test_only_lean_failures_are_corrected_and_verified_ones_become_rows(tiny, tmp_path):
    from ei_nb.rows import read_sft_rows
    res = correct(tiny, tmp_path, tmp_path/'out')
    assert (res['failures_tried'], res['corrections_sampled']) == (2, 6)          # the Lean error and the sorry; the cheat and the timeout never
    tried = [json.loads(l) for l in open(tmp_path/'out'/'correction_problems.jsonl')]
    assert [t['corrects']['sample_idx'] for t in tried] == [0, 3] and "-- Error Message: unknown identifier 'foo'" in tried[0]['turn_prompt']
    assert 'Error Message' not in tried[1]['turn_prompt']                       # an incomplete proof: Lean gave no error
    rows = read_sft_rows(tmp_path/'out'/'correction_rows.jsonl')
    assert res['corrections_verified'] == 6 and len(rows) == res['rows'] == 2          # distinct, shortest, one per failure
    assert res['keep'] == {'kept': 2, 'over_cap': 2, 'duplicate': 2} and rows[0]['completion'] == '  ring'
    assert rows[0]['name'] == NAME and rows[0]['kind'] == 'correction' and [r['corrects']['sample_idx'] for r in rows] == [0, 3]
    assert rows[0]['prompt'] == tried[0]['turn_prompt']


def test_a_problem_the_round_solved_is_not_corrected(tiny, tmp_path):
    "Goedel-Prover-V2 corrects only problems with no passing variant: with a pass, nothing is tried and the files are empty."
    res = correct(tiny, tmp_path, tmp_path/'out', solved=True)
    assert (res['failures_tried'], res['corrections_sampled'], res['rows']) == (0, 0, 0)
    assert (tmp_path/'out'/'correction_rows.jsonl').read_text() == ''


def test_which_failures_qualify_as_goedels():
    """Issue 30, point 13, against Goedel-Prover-V2's `load_data_for_correction` (src/utils.py @ 2e9036e): problem A has a pass and
    3 Lean errors (none tried); B has no pass and 8 failures: 2 Lean errors and 1 incomplete proof are tried, in sample order; a timeout
    (Goedel skips it too), a pre-check cheat, an axiom and a statement rejection, and `no_code` are not (our stated departures)."""
    import inspect, tomllib
    from ei_nb.correct import correction_candidates, correction_problem, run_correct
    pa, pb = (dict(MINIF2F[NAME], name=n) for n in ('A', 'B'))
    smp = lambda n, i: {'name': n, 'sample_idx': i, 'round': 1, 'completion': 'x', 'n_tokens': 9 - i, 'capped': False}
    ver = lambda n, i, verdict, reason, **kw: {'name': n, 'sample_idx': i, 'verdict': verdict, 'reason': reason, 'proof': 'p', **kw}
    va = [ver('A', 0, 'pass', None)] + [ver('A', i, 'fail', 'lean error: e') for i in (1, 2, 3)]
    vb = [ver('B', 0, 'fail', 'lean error: x'), ver('B', 1, 'error', 'repl: timeout after 300 s'), ver('B', 2, 'fail', 'lean sorry: 1 sorries'),
          ver('B', 3, 'fail', 'sorry: line 2', messages=[{'severity': 'error', 'rule': 'sorry', 'text': 'sorry: line 2'}]),
          ver('B', 4, 'fail', 'axioms: B uses sorryAx'), ver('B', 5, 'no_code', 'no closed block'),
          ver('B', 6, 'fail', 'lean_statement: the theorem is not the problem'), ver('B', 7, 'fail', 'lean error: y')]
    got = correction_candidates([pa, pb], [smp('A', i) for i in range(4)] + [smp('B', i) for i in range(8)], va + vb)
    assert [(p['name'], s['sample_idx']) for p, s, _ in got] == [('B', 0), ('B', 2), ('B', 7)]
    assert tomllib.loads((ROOT/'configs'/'demo_corrections.toml').read_text())['correct']['n'] == 2   # Goedel's NUM_SAMPLES_CORRECTION
    turn = correction_problem(pb, smp('B', 2), vb[2])['turn_prompt']
    assert 'position of the error.\n\n\n\nBefore producing' in turn           # Goedel's empty error section


def test_protected_problems_are_never_correction_rows(tiny, tmp_path):
    res = correct(tiny, tmp_path, tmp_path/'out', protected=[{'name': 'x', 'formal_statement': MINIF2F[NAME]['formal_statement']}])
    assert res['rows'] == 0 and res['keep'] == {'dropped_protected': 2} and (tmp_path/'out'/'correction_rows.jsonl').read_text() == ''


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
    import random
    room = len(got)                                                                  # drawn uniformly (seeded), not the shortest first
    assert {r['sample_idx'] for r in got} == set(random.Random('0:correction').sample(list(range(50)), room)) and room < 50
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

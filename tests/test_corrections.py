"""Lean's messages kept in verdicts (REPL and `lean --json` shapes, through the fake REPL) and the
self-correction turn built from them, on real miniF2F statements and published proofs. No Lean runs."""
import json, sys
from pathlib import Path
import pytest

from ei_nb.core import check_record, shared_data
from ei_nb.prompts import CORRECTION_PROMPT, correction_messages, error_feedback
from ei_nb.verify import MESSAGE_CAP, extract_code, make_verifier

FAKE = str(Path(__file__).with_name('fake_repl.py'))
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
    yield 'repl', make_verifier('repl', project=project, timeout=5, mem_mb=256, repl_cmd=[sys.executable, FAKE])
    yield 'lean', make_verifier('lean', project=project, timeout=5, mem_mb=256, lean_cmd=[sys.executable, FAKE, '--lean'])


def test_lean_errors_are_kept_at_the_proofs_own_lines(project):
    "The REPL counts from the proof, `lean --json` from the header: both land on the same line of the proof."
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

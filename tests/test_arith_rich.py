"""Property tests of the richer arith fragment (issue 35, point 1): `use`, witnesses written as expressions, `have`
lemmas, three-operand problems, and the correction turn of the warm start.

The verdicts are checked against `independent_value` of tests/test_arith.py (its own scanner, no `ei_nb.arith` code);
the error messages against Lean's words as nbs/tools/arith.ipynb documents them (upstream sources named there).
"""
import itertools
import pytest
from hypothesis import given, strategies as st

from ei_nb.arith import PROOF_FORMS, arith_problem, arith_proof, arith_sets, grade_of, parse_statement
from ei_nb.correct import correction_candidates, correction_problem
from ei_nb.demo import correction_warm_rows
from ei_nb.prompts import verifiable_text
from tests.test_arith import SETTINGS, check, independent_value, verifier  # noqa: F401 (a fixture)

value_of = lambda expr: independent_value(f'x, {expr} = n')


def context(hyps) -> str:
    "Hypotheses as Lean's goal display lists them: consecutive ones of one type on one line."
    groups = itertools.groupby(hyps, key=lambda h: h[1])
    return ''.join(f"{' '.join(n for n, _, _ in g)} : {t}\n" for t, g in groups)
sums = st.lists(st.integers(0, 999), min_size=2, max_size=3)
ops = st.sampled_from(['+', '*'])


def lemma_lines(nums, op, deltas):
    "`have` lines over prefixes of the operands, each off by its delta; their hypotheses as Lean prints them."
    lines, hyps = [], []
    for k, d in enumerate(deltas):
        lhs = f' {op} '.join(map(str, nums[:2 + k % (len(nums) - 1)]))
        rhs = max(0, value_of(lhs) + d)
        lines.append(f'  have h{k} : {lhs} = {rhs} := by norm_num')
        hyps.append((f'h{k}', f'{lhs} = {rhs}', rhs == value_of(lhs)))
    return lines, hyps


@SETTINGS
@given(sums, ops, st.integers(-2, 2), st.sampled_from(['exact', 'refine', 'use']),
       st.lists(st.integers(-1, 1), max_size=3), st.booleans())
def test_every_form_and_lemma_agrees_with_the_independent_evaluator(verifier, nums, op, delta, form, deltas, split):
    p = arith_problem(nums, op)
    value = independent_value(p['formal_statement'])
    lines, hyps = lemma_lines(nums, op, deltas)
    w = str(max(0, value + delta))
    if split and form != 'use' and len(nums) == 3:   # the witness written with a lemma's value: `85 + 12`
        first = value_of(f'{nums[0]} {op} {nums[1]}')
        w = f'{first} {op} {nums[2]}' if delta == 0 else f'{max(0, first + delta)} {op} {nums[2]}' if op == '+' else w
    step = {'exact': [f'  exact ⟨{w}, by norm_num⟩'], 'refine': [f'  refine ⟨{w}, ?_⟩', '  norm_num'],
            'use': [f'  use {w}']}[form]
    r = check(verifier, p, '\n'.join(lines + step))
    if form == 'use' and op == '*':   # not decided: refused, never passed
        assert r['verdict'] == 'fail' and any('no Lean ran' in m['text'] for m in r['messages']), r
        return
    right = value_of(w) == value and all(ok for _, _, ok in hyps)
    assert r['verdict'] == ('pass' if right else 'fail'), (lines + step, r)
    errors = [m for m in r.get('messages', []) if m['severity'] == 'error']
    assert not any('no Lean ran' in m['text'] for m in errors)
    # one error per false lemma, at its own line (header 7 lines, the theorem on line 8), in order
    bad = [9 + k for k, (_, _, ok) in enumerate(hyps) if not ok]
    assert [m['line'] for m in errors[:len(bad)]] == bad
    for k, m in zip([k for k, (_, _, ok) in enumerate(hyps) if not ok], errors):
        assert m['text'] == 'unsolved goals\n' + context(hyps[:k]) + '⊢ False'
    if value_of(w) != value:
        (m,) = errors[len(bad):]
        expr = f' {op} '.join(map(str, nums))
        ctx = context(hyps)
        assert m['text'] == (f'unsolved goals\ncase h\n{ctx}⊢ {expr} = {w}' if form == 'use' else
                             f'unsolved goals\n{ctx}⊢ False')
        assert m['line'] == (9 + len(lines) if form == 'exact' else 8)   # inner `by`, or the theorem's `by`


@pytest.mark.parametrize('proof', [
    '  have h : 1 + 1 = 2 := by norm_num\n  have h : 2 + 2 = 4 := by norm_num\n  use {v}',     # a name used twice
    '  use {v} + 0', '  use {v}\n  norm_num', '  exact ⟨{v}, rfl⟩', '  have h : 1 + 1 = 2 := by simp\n  use {v}',
    '  have h : 1 + 1 = 2 := by norm_num\n    use {v}', '  have h : 1 + 1 = 2 := by norm_num',
    '  have h : 1 + 1 = 2 := by norm_num\n  exact ⟨{v}, by norm_num⟩\n  rfl',
    '  have h : (1 + 1) = 2 := by norm_num\n  use {v}',
    '  use 0{v}', '  exact ⟨{v}, by simp⟩'])
def test_outside_the_grammar_is_refused_even_when_right(verifier, proof):
    p = arith_problem([47, 38, 12])
    r = check(verifier, p, proof.format(v=97))
    assert r['verdict'] == 'fail' and any('no Lean ran' in m['text'] for m in r['messages']), r


def test_lean_words_for_each_form(verifier):
    p = arith_problem([47, 38, 12])
    r = check(verifier, p, '  have h : 47 + 38 = 84 := by norm_num\n  use 96')
    assert [(m['line'], m['text']) for m in r['messages']] == [
        (9, 'unsolved goals\n⊢ False'), (8, 'unsolved goals\ncase h\nh : 47 + 38 = 84\n⊢ 47 + 38 + 12 = 96')]
    for form in PROOF_FORMS:
        assert check(verifier, p, arith_proof(p, form))['verdict'] == 'pass', form
        assert check(verifier, p, arith_proof(p, form, value=98))['verdict'] == 'fail', form


@pytest.mark.parametrize('seed', [0, 5])
def test_three_operand_grades_are_drawn(seed):
    sets = arith_sets(seed, {'2+2+1': 10}, {'2+2+2': 10, '1+2': 5}, {'1+1+1': 10})
    grade = lambda q: grade_of([int(x) for x in parse_statement(q)[1].split('+')], '+')
    assert sorted({grade(q) for q in sets['pool']}) == ['1+2', '2+2+2']
    assert {grade(q) for q in sets['scored']} == {'2+2+1'} and {grade(q) for q in sets['warm']} == {'1+1+1'}


def test_correction_warm_rows_are_01c_prompts_and_their_fix_verifies(verifier):
    """The warm rows' prompt is the one 01c renders (`correction_candidates`, `correction_problem`) for a failed sample
    of the same form off by 1 or 10; the completion, the right proof in that form, passes the checker."""
    problems = [arith_problem([47, 38, 12]), arith_problem([5, 9]), arith_problem([61, 7, 3]), arith_problem([4, 40])]
    rows = correction_warm_rows(problems, ('use', 'have', 'refine', 'exact'), seed=3)
    for q, row, form in zip(problems, rows, ('use', 'have', 'refine', 'exact')):
        assert row['completion'] == arith_proof(q, form) and check(verifier, q, row['completion'])['verdict'] == 'pass'
        rendered = set()
        for v in (parse_statement(q)[2] + d for d in (-10, -1, 1, 10)):
            if v < 0: continue
            sample = {'name': q['name'], 'sample_idx': 0, 'round': 0,
                      'completion': verifiable_text(q, arith_proof(q, form, value=v), 'completion')}
            (cand,) = correction_candidates([q], [sample], [verifier.verify_one(q, sample)])
            rendered.add(correction_problem(*cand, None, 'completion')['turn_prompt'])
        assert row['prompt'] in rendered

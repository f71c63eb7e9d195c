"""Property tests of the arith fragment: the checker, through the whole `Verifier` path, against an independent evaluator.

The evaluator below parses the statement its own way (a character scanner and a two-level fold, no regex, no
`ei_nb.arith` code) and uses Python's integers; the checker must pass exactly the grammar's proofs of the right value.
"""
import random
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ei_nb.arith import (ARITH_HEADER, SPLITS, OutsideFragment, arith_problem, arith_sets, arith_verifier, grade_of,
                         grade_size, parse_grade, parse_statement)
from ei_nb.core import BadInput, read_problems, shared_data
from ei_nb.lean_reply import statement_probe

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def independent_value(formal_statement:str) -> int:
    "The value of the statement's expression: scan `, EXPR = n`, fold products inside sums (written apart from the checker)."
    expr = formal_statement[formal_statement.index(',') + 1:formal_statement.rindex('= n')]
    total, product, number = 0, 1, ''
    for ch in expr + '+':
        if ch.isdigit(): number += ch
        elif ch in '+*':
            product *= int(number); number = ''
            if ch == '+': total, product = total + product, 1
        elif ch != ' ': raise AssertionError(f'unexpected {ch!r}')
    return total


@pytest.fixture(scope='module')
def verifier():
    with arith_verifier() as v: yield v


def check(verifier, problem, proof):
    text = f"```lean4\n{problem['header']}{problem['formal_statement']}{proof}\n```"
    return verifier.verify_one(problem, {'name': problem['name'], 'sample_idx': 0, 'completion': text})


operands = st.lists(st.integers(0, 10**7), min_size=2, max_size=4)
ops = st.sampled_from(['+', '*'])
spaces = st.sampled_from(['', ' ', '  '])


@SETTINGS
@given(operands, ops, st.integers(-3, 3), st.sampled_from(['exact', 'refine']), spaces, spaces, st.booleans())
def test_verdict_matches_independent_evaluator(verifier, nums, op, delta, form, s1, s2, comment):
    p = arith_problem(nums, op)
    v = max(0, independent_value(p['formal_statement']) + delta)
    proof = (f'  exact{s1}⟨{s2}{v},{s1}by norm_num{s2}⟩' if form == 'exact' else f'  refine ⟨{v},{s1}?_{s2}⟩\n  norm_num')
    if comment: proof += '  -- the value'
    r = check(verifier, p, proof)
    right = v == independent_value(p['formal_statement'])
    assert r['verdict'] == ('pass' if right else 'fail'), (proof, r)
    if not right:
        (m,) = r['messages']
        assert m['text'] == 'unsolved goals\n⊢ False' and m['severity'] == 'error'
        assert m['line'] == (9 if form == 'exact' else 8)     # the inner `by` of `exact`; the theorem's `by` for `refine`


@SETTINGS
@given(operands, ops, st.sampled_from(['  exact ⟨_, rfl⟩', '  norm_num', '  simp', '  decide', '  exact ⟨{v}, rfl⟩',
                                       '  use {v} + 0', '  exact ⟨0{v}, by norm_num⟩', '  exact ⟨{v}, by norm_num⟩\n  norm_num',
                                       '  refine ⟨{v}, ?_⟩\n    norm_num', '  exact ⟨{v}, by linarith⟩', '']))
def test_proofs_outside_the_grammar_never_pass(verifier, nums, op, template):
    p = arith_problem(nums, op)
    r = check(verifier, p, template.format(v=independent_value(p['formal_statement'])))
    assert r['verdict'] == 'fail', (template, r)
    assert any('no Lean ran' in m['text'] for m in r.get('messages', [])), r


@SETTINGS
@given(operands, ops)
def test_parse_statement_agrees_with_the_independent_value(nums, op):
    p = arith_problem(nums, op)
    name, _, value = parse_statement(p)
    assert (name, value) == (p['name'], independent_value(p['formal_statement']))


def test_every_minif2f_statement_is_refused(verifier):
    problems = read_problems(shared_data('minif2f_dsp15.jsonl'))
    for q in problems:
        with pytest.raises(OutsideFragment, match=f"problem {q['name']!r} is outside the arith fragment"):
            check(verifier, q, '  norm_num')


@SETTINGS
@given(st.integers(0, 10**6), st.dictionaries(st.sampled_from(['1+1', '2+1', '2+2', '3+2', '2*1']), st.integers(0, 40), max_size=3),
       st.dictionaries(st.sampled_from(['1+1', '2+1', '2+2', '3+3']), st.integers(0, 40), max_size=3),
       st.dictionaries(st.sampled_from(['1+1', '1+2', '2*1']), st.integers(0, 30), max_size=2),
       st.dictionaries(st.sampled_from(['1+1', '2+2']), st.integers(0, 20), max_size=2))
def test_sets_are_seeded_disjoint_and_graded(seed, scored, pool, warm, test):
    every = (scored, pool, warm, test)
    asked = {g: sum(x.get(g, 0) for x in every) for g in {k for x in every for k in x}}
    if any(k > grade_size(g) for g, k in asked.items()):   # e.g. 101 one-digit sums: refused up front, by grade
        with pytest.raises(BadInput, match='problems asked across scored, pool, warm and test'):
            arith_sets(seed, scored, pool, warm, test)
        return
    try: sets = arith_sets(seed, scored, pool, warm, test)
    except BadInput as e:   # the commuted twins of held-out sums are barred: a small grade can run out of problems
        g = str(e).split()[1].rstrip(':')
        assert 'cannot draw' in str(e) and 2 * asked[g] > grade_size(g), (e, asked)
        return
    assert sets == arith_sets(seed, scored, pool, warm, test)
    names = [p['name'] for v in sets.values() for p in v]
    assert len(names) == len(set(names))
    assert len({p['formal_statement'] for v in sets.values() for p in v}) == len(names)
    for kind, grades in (('scored', scored), ('pool', pool), ('warm', warm), ('test', test)):
        got = {}
        for p in sets[kind]:
            _, expr, _ = parse_statement(p)
            op = '*' if '*' in expr else '+'
            got[grade_of([int(x) for x in expr.split(op)], op)] = got.get(grade_of([int(x) for x in expr.split(op)], op), 0) + 1
        assert got == {g: k for g, k in grades.items() if k}
        assert {p['split'] for p in sets[kind]} == ({SPLITS[kind]} if sets[kind] else set())
    # no training problem is a sum of a held-out one reordered (independently of ei_nb.near_dup)
    op_of = lambda e: '*' if '*' in e else '+'
    bag = lambda ps: {(op_of(e), *sorted(int(x) for x in e.split(op_of(e))))
                      for e in (parse_statement(p)[1] for p in ps)}
    assert not bag(sets['pool'] + sets['warm']) & bag(sets['scored'])
    assert not bag(sets['test']) & bag(sets['scored'] + sets['pool'] + sets['warm'])


def test_statement_check_and_probe_run_on_this_backend():
    "A changed statement fails the pre-check; a pass runs the reference statement once per problem, through the probe."
    p = arith_problem([4721, 3856])
    with arith_verifier() as v:
        other = p['formal_statement'].replace('3856', '3857')
        r = v.verify_one(p, {'name': p['name'], 'sample_idx': 0,
                             'completion': f"```lean4\n{ARITH_HEADER}{other}  exact ⟨8578, by norm_num⟩\n```"})
        assert r['verdict'] == 'fail' and r['reason'].startswith('statement')
        assert [check(v, p, '  exact ⟨8577, by norm_num⟩')['verdict'] for _ in range(2)] == ['pass', 'pass']
        assert v.stats['reference_runs'] == 1 and v.stats['lean_runs'] == 2


def test_the_stages_verifier_settings_reach_the_arith_checker():
    "`verify_backend = 'ei_nb.arith:arith_verifier'` (no registration needed) gives the stages this checker."
    from ei_nb.samplers import open_verifier, verifier_of
    p = arith_problem([12, 30])
    with open_verifier(verifier_of('ei_nb.arith:arith_verifier', workers=1)) as v:
        assert v.identity['backend'] == 'arith'
        assert check(v, p, '  exact ⟨42, by norm_num⟩')['verdict'] == 'pass'
        assert check(v, p, '  exact ⟨43, by norm_num⟩')['verdict'] == 'fail'


def test_conjectures_outside_the_fragment_are_rejected_by_the_checker_not_a_crash():
    "The conjecture stage's statement checks on this back-end: an in-fragment conjecture elaborates, anything else is `not_elaborated`."
    from ei_nb.conjecture import HARD_END, check_candidates, elaborate
    seed = arith_problem([47, 38])
    prompt = {'name': 'cprompt_r01_0000', 'header': ARITH_HEADER, 'formal_statement': seed['formal_statement'], 'seed': seed['name'],
              'lemma': 'Exists.intro', 'lemma_statement': 'theorem Exists.intro', 'seed_code': '', 'turn_prompt': ''}
    # in the fragment: accepted. (The stage's too-easy bundle `first | (norm_num; done) | ...` is outside the checker's grammar,
    # so no conjecture of the fragment is `too_easy` here; a real Lean's norm_num would close all of them by `exists_eq'`.)
    written = {' add_123_456 : ∃ n : ℕ, 123 + 456 = n': 'accepted',          # in the fragment: a harder sum
               ' t (x : ℕ) : x + 0 = x': 'not_elaborated',                       # a variable: outside
               ' t : ∃ n : ℕ, 9 - 4 = n': 'not_elaborated',                     # subtraction: outside
               ' t : ∃ n : ℤ, 1 + 1 = n': 'not_elaborated',                     # another type: outside
               ' t : 2 + 2 = 4': 'not_elaborated'}                              # no witness to name: outside
    gens = [{'name': prompt['name'], 'sample_idx': i, 'completion': w + '\n' + HARD_END, 'capped': False} for i, w in enumerate(written)]
    cands = check_candidates(gens, {prompt['name']: prompt}, set(), (), 1)
    assert [c['status'] for c in cands] == ['accepted'] * len(written)     # the text rules pass them all: the checker must decide
    with arith_verifier() as v:
        got = [elaborate(c['problem'], v.backend, 10, 10)[0] for c in cands]
        assert got == list(written.values())
        with pytest.raises(OutsideFragment, match='outside the arith fragment'):   # and the prover refuses one by name, never passes it
            v.verify_one(cands[1]['problem'], {'name': cands[1]['problem']['name'], 'sample_idx': 0, 'completion': '```lean4\n```'})


def test_doctor_needs_no_protected_set_for_the_arith_checker():
    """Without protected files the arith back-end is OK (it refuses miniF2F by name), another is a FAIL; the learning
    demo protects its own test set, a file its demo stage writes."""
    import copy
    from pathlib import Path
    from ei_nb.config import load_config
    from ei_nb.doctor import Context, check_problems
    cfg = load_config(Path(__file__).resolve().parents[1]/'configs'/'demo_learn.toml')
    row = lambda c: next(r for r in check_problems(Context(c, '/tmp/ei_doctor_arith')) if r['check'] == 'protected')
    assert row(cfg)['status'] == 'OK' and 'test.jsonl: written by the demo stage' in row(cfg)['detail'], row(cfg)
    bare = copy.deepcopy(cfg); bare['paths']['protected'] = []
    assert row(bare)['status'] == 'OK' and 'arith checker refuses' in row(bare)['detail']
    other = copy.deepcopy(bare); other['verify']['backend'] = 'known'
    assert row(other)['status'] == 'FAIL', row(other)

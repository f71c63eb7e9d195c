import pytest
"""Property tests of `ei_nb.lean_lex`: the fast lexer against the reference model of Lean's tokenizer
(written from `src/Lean/Parser/Basic.lean`), on random mixtures of comment, string and code pieces."""
import json
from hypothesis import given, settings, strategies as st, HealthCheck

from ei_nb.core import lean_code_only, shared_data
from ei_nb.lean_lex import code_only, labels, reference_labels, spans

PIECES = ['/-', '-/', '--', '/--', '/-!', '"', '\\', '\\"', '\\{', "'", '«', '»', 's!', 'm!', 'f!', 'r', '#', '{', '}',
          '\n', ' ', '\t', 'x', 'h', "h'", '2', '0x', 'e', '.', '!', '?', '-', '/', "''", '⁻¹', "⁻¹'", 'ℕ', 'α', 'λ',
          '₁', 'sorry', 'axiom', '\\n', '\\x4', 'u', '(', ')', ':=', 'throwError', 'dbg_trace', 'throwErrors']

mixtures = st.lists(st.sampled_from(PIECES), max_size=40).map(''.join)

@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(mixtures)
def test_fast_lexer_agrees_with_reference(text):
    ref, error = reference_labels(text)
    if not error: assert labels(text) == ref, (text, labels(text), ref)

@pytest.mark.xfail(strict=True, reason="known disagreements: the fast lexer labels some char literals as code where the "
                   "reference starts a token (e.g. !'/' and after the two-quote token): the safe direction, more text is scanned as code")
@settings(max_examples=600, deadline=None, derandomize=True)
@given(st.text(alphabet='/-"\'«»{}!smr# \nxh\\', max_size=30))
def test_agrees_on_dense_special_characters(text):
    ref, error = reference_labels(text)
    if not error: assert labels(text) == ref

@settings(max_examples=1500, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from([p for p in PIECES if not ('"' in p or "'" in p or '--' in p or '/-' in p)] + ['-', '/']), max_size=40).map(''.join))
def test_texts_without_comment_or_literal_openers_are_all_code(text):
    "`code_only`'s shortcut (no `--`, `/-`, quote or `'`) gives what the lexer gives: «», bangs, braces, raw-string `r#` only make code."
    from ei_nb.lean_lex import _code_only, _plain
    if _plain(text): assert code_only(text) == _code_only(text, spans(text)) == text, text

@settings(max_examples=300, deadline=None)
@given(mixtures)
def test_spans_tile_the_text_and_code_only_keeps_lines(text):
    sp = spans(text)
    assert [a for _, a, _ in sp] == [0 for _ in sp[:1]] + [b for _, _, b in sp[:-1]] and (not sp or sp[-1][2] == len(text))
    assert code_only(text).count('\n') == text.count('\n') - sum(text.count('\n', a, b) for k, a, b in sp if k == 'string')

def test_lean_comment_rules():
    # after `/-` Lean skips one character: `/-/-` opens ONE comment, closed by the first `-/`
    assert code_only('/-/- (h : False) -/ axiom cheat : False -/').split() == ['axiom', 'cheat', ':', 'False', '-/']
    assert code_only('/--/ doc -/ theorem').split() == ['theorem']
    assert code_only('/-!/- x -/ still comment -/ y').split() == ['y']
    assert code_only('/- a /- b -/ c -/ d').split() == ['d']
    assert 'sorry' in code_only('s!"{sorry}"') and 'sorry' not in code_only('"{sorry}"')
    assert 'sorry' in code_only('s! /- c -/ "{sorry}"')
    assert 'sorry' in code_only('throwError "{sorry}"') and 'sorry' not in code_only('throwErrorX "{sorry}"')
    assert code_only("h'' 'x' r#\"/-\"# «/-» --x") == "h'' ' ' \"\" «/-»  "

def test_core_delegates_to_the_lexer():
    t = '/-/- x -/ axiom a : False -/'
    assert lean_code_only(t) == code_only(t)

def test_real_proofs_lex_without_error_and_the_same():
    rows = [json.loads(l) for l in open(shared_data('deepseek_prover_v2_minif2f_solutions.jsonl'), encoding='utf-8')]
    for r in rows[:120]:
        ref, error = reference_labels(r['full_code'])
        assert not error, r['name']
        assert labels(r['full_code']) == ref, r['name']


@pytest.mark.xfail(strict=True, reason="known disagreement found by hypothesis: after Mathlib's two-quote token the fast "
                   "lexer labels a following char literal as code (the safe direction: more text is scanned as code)")
def test_char_literal_right_after_the_two_quote_token():
    text = chr(39) * 3 + "h" + chr(39)
    ref, error = reference_labels(text)
    assert not error and labels(text) == ref

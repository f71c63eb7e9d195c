import pytest
"""Property tests of `ei_nb.lean_lex` and `ei_nb.lean_tokens`: the fast lexers against the reference models of Lean's
tokenizer (written from `src/Lean/Parser/Basic.lean`): comments and literals (`labels`/`reference_labels`), then every
token (`tokenize`/`reference_tokens`, with the generated token table), on random mixtures and real proofs."""
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


# --- every token (issue 28 part 1): the fast tokenizer of ei_nb.lean_tokens against lean_lex.reference_tokens ---
import random
from ei_nb.lean_lex import reference_tokens
from ei_nb.lean_tokens import HEADER_OPENS, token_data, token_table, tokenize

TABLE = token_table()
# numerals and quotes glued to words, the quote-ending tokens, command words, interpolation and escapes
TOKEN_PIECES = PIECES + ['0b', '0o', '1e', 'E', '+', '¹', 'ᶜ', '×', "×'", 'Σ', "Σ'", '∑', "∑'", '∏', "∏'", 'instance', 'run_cmd', '#eval',
                         'open', 'in', 'theorem', 'variable', 'infix', 'set_option', '[', ']', '⟨', '⟩', 'Type*', 'Type', '*',
                         'throwErrorAt', 'trace[', '`', '`(', "'a'", '1', '0', '5', '=', '≤', '|', '@[', '_', '·', 'ℝ≥0', 'ℝ', '≥', '.1',
                         '"s"', 's!"a{x}b"', 'r#"q"#', '"\\{"']
token_mixtures = st.lists(st.sampled_from(TOKEN_PIECES), max_size=30).map(''.join)

def _lex_both(text):
    ref, error = reference_tokens(text, TABLE.tokens, TABLE.interpolation)
    return ref, error, tokenize(text, TABLE)

@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(token_mixtures)
def test_tokenizer_agrees_with_reference(text):
    ref, error, fast = _lex_both(text)
    if not error: assert fast == ref, (text, [(k, text[a:b]) for k, a, b in fast], [(k, text[a:b]) for k, a, b in ref])

CLEAN_PIECES = [p for p in TOKEN_PIECES if p not in ('\t', '"', '«', '/-', '\\x4', '0x', '0b', '1e', "'", '\\')]

@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.lists(st.sampled_from(CLEAN_PIECES), max_size=30).map(''.join))
def test_tokenizer_agrees_with_reference_without_error_prone_pieces(text):
    ref, error, fast = _lex_both(text)
    if not error: assert fast == ref, (text, [(k, text[a:b]) for k, a, b in fast], [(k, text[a:b]) for k, a, b in ref])

def test_mixtures_are_mostly_lexable():
    "The property above is not vacuous: most random mixtures are files Lean lexes without error, and they hit every kind."
    rng, ok, kinds = random.Random(0), 0, set()
    for _ in range(600):
        text = ''.join(rng.choice(TOKEN_PIECES) for _ in range(rng.randint(0, 30)))
        ref, error, _ = _lex_both(text)
        if not error: ok += 1; kinds |= {k for k, _, _ in ref}
    assert ok >= 100, ok                          # about a quarter; the mixture without error-prone pieces below lexes more often
    assert {'ident', 'keyword', 'symbol', 'num', 'str', 'char', 'comment', 'doc', 'name'} <= kinds, kinds

def test_tokenizer_agrees_with_reference_on_real_proofs():
    codes = [json.loads(l)['full_code'] for l in open(shared_data('deepseek_prover_v2_minif2f_solutions.jsonl'), encoding='utf-8')]
    codes += [json.loads(l)['code'] for l in open(shared_data('lean_workbook_goedel_proofs_kimina_verdicts.jsonl'), encoding='utf-8')]
    for code in codes:
        ref, error, fast = _lex_both(code)
        assert not error and fast == ref, code[:200]
        assert not [t for t in fast if t[0] == 'error']

def _kinds(text): return [(k, text[a:b]) for k, a, b in tokenize(text)]

@pytest.mark.parametrize('glued, before', [('1instance', '1'), ("'a'instance", "'a'"), ('x⁻¹instance', '⁻¹'), ('sᶜvariable', 'ᶜ'),
                                           ('2run_cmd', '2'), ('0x1F#eval', '0x1F'), ("'b'axiom", "'b'"), ('3infix', '3'),
                                           ('1.5set_option', '1.5'), ('2e3open', '2e3')])
def test_command_words_glued_to_the_token_before(glued, before):
    "Lean ends a numeral, a char literal, `⁻¹`, `ᶜ` where they end (numberFnAux, charLitFnAux, the longest token), so the word after is a token."
    toks = _kinds(glued)
    assert toks[-2][1] == before and toks[-1][0] in ('keyword', 'symbol') and toks[-1][1] == glued[len(glued) - len(toks[-1][1]):], toks
    assert toks[-1][1] in TABLE.command_starts

@pytest.mark.parametrize('quote_token', ["''", "⁻¹'", "×'", "Σ'", "∑'", "∏'"])
def test_tokens_ending_in_a_quote_then_a_char_literal(quote_token):
    "`f '' 'a'`: the declared token takes its quote (longest match), the next `'…'` is a char literal, not a string's start."
    text = f"x {quote_token} '\"' axiom bad : False -- \""
    toks = _kinds(text)
    assert ('symbol', quote_token) in toks and ('char', "'\"'") in toks and ('keyword', 'axiom') in toks, toks
    assert not [t for t in toks if t[0] == 'str']

def test_token_table_names_its_sources():
    d = token_data()
    assert {s['repo']: s['commit'] for s in d['sources']}['xinhjBrant/mathlib4'] == '2f65ba7f1a9144b20c8e7358513548e317d26de1'
    assert d['toolchain'] == 'leanprover/lean4:v4.9.0-rc1' and d['lean_core']['status'] in ('generated', 'hand-listed')
    assert d['counts']['tokens'] == len(d['tokens']) and d['counts']['command_starts'] == len(d['command_starts'])
    # Mathlib's quote-ending tokens come from Mathlib's own declarations
    assert d['token_origin']["''"].startswith('mathlib:Mathlib/') and d['token_origin']["∑'"].startswith('mathlib:Mathlib/')
    assert 'ℝ≥0' in d['scoped_tokens']['NNReal'] and 'ℝ≥0' not in token_table(HEADER_OPENS).tokens

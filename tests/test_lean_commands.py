"""Tests of `ei_nb.lean_commands.split_commands` (issue 28 part 2): a file is cut where Lean starts a command —
at a token of the command category outside brackets (`parseCommand`, src/Lean/Parser/Module.lean, with the command
keywords of ei_nb/data/lean_tokens.json) — on real published proofs, on the same proofs rewritten with column-0
lines, and on crafted exploits of the classes of issue 28."""
import json, re
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from ei_nb.core import shared_data
from ei_nb.lean_commands import MODIFIERS, split_commands
from ei_nb.lean_tokens import token_table, tokenize


def _proofs():
    rows = [(r['name'], r['full_code']) for r in map(json.loads, open(shared_data('deepseek_prover_v2_minif2f_solutions.jsonl'), encoding='utf-8'))]
    rows += [(r['id'], r['code']) for r in map(json.loads, open(shared_data('lean_workbook_goedel_proofs_kimina_verdicts.jsonl'), encoding='utf-8'))]
    return rows

PROOFS = _proofs()

def heads(text): return [c.head for c in split_commands(text)]

def _declares(code, cmd, name):
    return cmd.head in ('theorem', 'lemma') and re.match(rf'(?:theorem|lemma)\s+{re.escape(name)}(?![\w.\'])', code[cmd.head_start:])


def test_real_proofs_split_into_header_and_theorem():
    for name, code in PROOFS:
        cmds = split_commands(code)
        assert [h for h in heads(code) if h != 'import'] in (['set_option', 'open', 'theorem'], ['theorem']), name
        if not name.startswith('proof'):                    # two kimina rows are named proof1, proof2
            assert sum(bool(_declares(code, c, name)) for c in cmds) == 1, name
        # the theorem command runs to the last token of the file: a proof is one command, however it is indented
        assert cmds[-1].end == max(b for k, a, b in tokenize(code) if k != 'comment'), name


def _dedent_body(code):
    "The same proof with every line of the theorem (statement continuation and tactics) moved to column 0."
    cmds = split_commands(code)
    t = cmds[-1]
    body = '\n'.join(l.lstrip(' ') for l in code[t.head_start:].split('\n'))
    return code[:t.head_start] + body

def test_column_zero_statement_and_tactic_lines_do_not_start_commands():
    "A statement continuing at column 0 and a tactic block written at column 0 stay one command (13 published proofs were rejected so)."
    n = 0
    for name, code in PROOFS[:200]:
        flat = _dedent_body(code)
        if flat == code: continue
        # a line-initial token that is not a command word is not a cut, whatever its column
        assert heads(flat) == heads(code), (name, heads(flat))
        n += 1
    assert n > 150


def test_print_axioms_in_the_middle_is_its_own_command():
    name, code = PROOFS[0]
    helper = '\ntheorem helper_x : (2 : ℕ) + 2 = 4 := by norm_num\n'
    text = code + f'\n#print axioms {name}\n' + helper
    hs = heads(text)
    assert hs[-2:] == ['#print', 'theorem'], hs
    c = split_commands(text)[-2]
    assert c.text(text) == f'#print axioms {name}'


@pytest.mark.parametrize('glue, word', [('1', 'instance'), ("'a'", 'instance'), ('x⁻¹', 'instance'), ('sᶜ', 'variable'),
                                        ('2', 'run_cmd'), ('2', '#eval'), ("'a'", 'axiom'), ('1', 'infix'), ('1', 'set_option'),
                                        ('1', 'open'), ('(3 : ℕ)', 'instance'), ('h.2', 'theorem')])
def test_glued_command_word_after_a_real_proof_starts_a_command(glue, word):
    "`…1instance : …`, `…'a'instance`, `x⁻¹instance`: Lean ends the numeral, char or token and the command word begins a command."
    name, code = PROOFS[3]
    tails = {'instance': ' : Add ℕ := ⟨fun a b => a⟩', 'variable': ' (h : False)', 'run_cmd': ' pure ()', '#eval': ' 1',
             'axiom': ' cheat : False', 'infix': ':65 " +' + "' " + '" => HAdd.hAdd', 'set_option': ' debug.skipKernelTC true in',
             'open': ' Nat in', 'theorem': ' t : True := trivial'}
    text = code.rstrip() + f' {glue}{word}{tails[word]}\n'
    cmds = split_commands(text)
    assert cmds[-1].head == word or (word in ('set_option', 'open') and cmds[-1].prefixes), [(c.head, c.text(text)[:40]) for c in cmds]
    assert any(_declares(text, c, name) for c in cmds[:-1])


@pytest.mark.parametrize('quote_token', ["''", "⁻¹'", "×'", "Σ'", "∑'", "∏'"])
def test_char_literal_after_a_quote_ending_token_hides_nothing(quote_token):
    "After `''`, `⁻¹'`, `×'`, `Σ'`, `∑'`, `∏'` a `'\"'` is a char literal to Lean: the `axiom` after it is a command, not string text."
    text = f"theorem t (f : ℕ → ℕ) : True := by\n  have := f {quote_token} '\"'\naxiom cheat : False\n-- \"\n"
    assert heads(text) == ['theorem', 'axiom']
    # and the other way round: a decoy `theorem` that only seems to be code sits inside a string to Lean
    decoy = f"example := s {quote_token} 'x'\ndef d := \"\ntheorem fake : True := trivial\n\"\n"
    assert heads(decoy) == ['example', 'def']


def test_open_in_at_the_end_of_the_previous_line_prefixes_the_next_command():
    name, code = PROOFS[5]
    main = code.index('theorem ')
    text = 'theorem helper : True := by trivial open Real in\n' + code[main:]
    cmds = split_commands(text)
    assert [c.head for c in cmds] == ['theorem', 'theorem']
    assert [text[a:b] for a, b in cmds[1].prefixes] == ['open Real in'] and _declares(text, cmds[1], name)


def test_open_swallows_the_indented_lines_under_it():
    "`open` takes every name after it, on any line, up to the next command word: one command, whose arguments the policy reads."
    name, code = PROOFS[7]
    text = code.rstrip() + '\nopen Real\n  Nat\n  instance : Inhabited ℕ := ⟨0⟩\n'
    cmds = split_commands(text)
    assert [c.head for c in cmds][-2:] == ['open', 'instance']
    assert cmds[-2].text(text) == 'open Real\n  Nat'


def test_open_and_set_option_in_a_tactic_stay_in_the_proof():
    text = ("theorem t (x : ℝ) : x ^ 2 ≥ 0 := by\n  open Real in\n  set_option maxRecDepth 1000 in\n  nlinarith [sq_nonneg x]\n"
            "open scoped BigOperators\n")
    assert heads(text) == ['theorem', 'open']


def test_modifiers_and_prefixes_belong_to_their_declaration():
    text = ('/-- doc -/\n@[simp] private lemma a : True := trivial\nnoncomputable section\nend\n'
            'set_option maxHeartbeats 400000 in\n/-- d -/\ntheorem b : True := trivial\nlocal notation "ℓ" => 1\n'
            'class inductive C | c\nstructure S where\n  x : ℕ\nderiving Repr\nderiving instance BEq for S\n')
    assert heads(text) == ['lemma', 'section', 'end', 'theorem', 'notation', 'class', 'structure', 'deriving']


# every non-comment token lies in exactly one command, and each command after the first begins at a command word
mixture = st.lists(st.sampled_from(['theorem t : True := by', 'trivial', '1instance', "'a'axiom", 'open Real in', 'open Nat',
                                    'set_option maxHeartbeats 400000 in', '@[simp]', '/-- d -/', '(', ')', '#print axioms t',
                                    'nlinarith [sq_nonneg (a - 1)]', '\n', ' ', 'deriving', 'instance', 'x⁻¹', "f '' 'x'", 'def', ':=',
                                    'open scoped BigOperators', 'noncomputable', 'section', 'end', '-- c', 'in']), max_size=25).map(' '.join)

@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(mixture)
def test_commands_tile_the_tokens(text):
    toks = [t for t in tokenize(text) if t[0] != 'comment']
    cmds = split_commands(text)
    assert [k for c in cmds for k in range(c.first, c.last)] == list(range(len(toks)))
    starts = token_table().command_starts | MODIFIERS | {'/-!'}
    for c in cmds[1:]:
        first = toks[c.first]
        assert text[first[1]:first[2]] in starts or first[0] == 'doc', (text, c)


def test_in_after_a_whole_command_prefixes_the_next():
    "`cmd₁ in cmd₂` is Lean's trailing `in` command (src/Lean/Parser/Command.lean): one command, `cmd₁ in` recorded as its prefix."
    text = "theorem a : True := trivial in\ntheorem b : True := trivial"
    (c,) = split_commands(text)
    assert c.head == 'theorem' and text[c.head_start:].startswith('theorem b') and text[slice(*c.prefixes[0])].startswith('theorem a')


def test_big_operator_in_is_not_a_prefix():
    "`∑ k in Finset.Icc 1 12, …` (miniF2F statements): an `in` followed by a term is no command prefix."
    rows = [json.loads(l) for l in open(shared_data('minif2f_dsp15.jsonl'), encoding='utf-8')]
    with_in = [r for r in rows if re.search(r'\bin\b', r['formal_statement'])]
    assert len(with_in) > 5
    for r in with_in:
        text = r['header'] + r['formal_statement'] + r.get('formal_proof', '  sorry')
        cmds = split_commands(text)
        assert [c.head for c in cmds if c.head != 'import'] == ['set_option', 'open', 'theorem'] and not cmds[-1].prefixes, r['name']

"""The pre-check of issue 28, class by class (parts 1 and 2): it reads Lean's tokens and Lean's commands.

Every exploit is built on a real miniF2F statement (`ei_nb/data/minif2f_dsp15.jsonl`) and, where it says so, a real
published proof; the rule it must meet is the one that names it. Each class names the Lean source it follows:

- tokens: `src/Lean/Parser/Basic.lean` (`tokenFnAux`, `numberFnAux`, `charLitFnAux`, `identFnAux`, `whitespace`), read
  at leanprover/lean4 00c1b82722b50e9b1ae4999ccc97f932b2788b51 (no stored version at v4.9.0-rc1 = be6c4894; the
  functions used here are the same in the older excerpts read), and the tokens Mathlib declares at
  xinhjBrant/mathlib4 2f65ba7f1a9144b20c8e7358513548e317d26de1: `⁻¹` (Mathlib/Algebra/Group/Defs.lean), `ᶜ`
  (Mathlib/Order/Notation.lean), `''` and `⁻¹'` (Mathlib/Data/Set/Defs.lean), `∑'` and `∏'`
  (Mathlib/Topology/Algebra/InfiniteSum/Defs.lean); `×'` and `Σ'` are core's (`ei_nb/data/lean_tokens.json` names
  the origin of each);
- commands: `src/Lean/Parser/Module.lean` (`parseCommand`: a command ends where its parser stops, the next begins at a
  token of the `command` category) and `src/Lean/Parser/Command.lean` (the trailing `in` combinator), same commit;
- `run_io`: Lake's DSL (`src/lake/Lake/DSL/...`, core; hand-listed in the token table), in the header environment
  through Mathlib/Util/GetAllModules.lean's `import Lake.CLI.Main`.

Where git holds the commit before this work (03c78cb, the pre-check of round two), each exploit is also run through
that former pre-check, to show it got past it (`former` fixture; without git only the present pre-check is tested).
"""
import importlib.util, json, subprocess, sys, types
from pathlib import Path

import pytest

from ei_nb.core import StageFailed, shared_data
from ei_nb.policy import load_policy, precheck, prepare
from ei_nb.lean_reply import reference_text

ROOT = Path(__file__).resolve().parents[1]
BEFORE = '03c78cb'      # main before issue 28 was built into the pre-check (round two's policy)

def _rows(f): return [json.loads(l) for l in open(shared_data(f), encoding='utf-8')]
MINIF2F = {r['name']: r for r in _rows('minif2f_dsp15.jsonl')}
DSV2 = {r['name']: r for r in _rows('deepseek_prover_v2_minif2f_solutions.jsonl')}
N = 'mathd_algebra_182'
P = MINIF2F[N]
H, S = P['header'], P['formal_statement']
RING = '  ring\n'
INST = 'instance : Mul ℂ := ⟨fun a _ => a⟩'


@pytest.fixture(scope='module')
def former():
    "The pre-check as it was at BEFORE (ei_nb/policy.py from git), or None (then only the present pre-check is tested)."
    try: src = subprocess.run(['git', '-C', str(ROOT), 'show', f'{BEFORE}:ei_nb/policy.py'], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError): return None
    mod = types.ModuleType('ei_nb._policy_before_28'); mod.__package__ = 'ei_nb'
    exec(compile(src, f'{BEFORE}:ei_nb/policy.py', 'exec'), mod.__dict__)
    return mod


def former_verdict(former, code, problem=P):
    "The former pre-check's reason, None, or 'crash' (its IndexError on multi-line literals lost the whole batch)."
    try: return former.precheck(code, problem)
    except IndexError: return 'crash'

def check(code, rule, former=None, bypassed_before=True):
    "The pre-check rejects `code` under `rule`; the former one let it through (or crashed on it)."
    reason = precheck(code, P)
    assert reason is not None and reason.split(':')[0] == rule, reason
    if former is not None and bypassed_before: assert former_verdict(former, code) in (None, 'crash'), former_verdict(former, code)


# ---------------------------------------------------------------- part 1: tokens as Lean draws them
# a declaration that ends in the token the command word is glued to, then the command (before the theorem)
GLUED = {
    'numeral': ('lemma g (f : ℕ → Prop) (h : ∀ n, f n) : f 1 := h 1', 'instance'),
    'char literal': ("lemma g (f : Char → Prop) (h : ∀ c, f c) : f 'a' := h 'a'", 'instance'),
    '⁻¹': ('lemma g (x : ℝ) (f : ℝ → Prop) (h : ∀ y, f y) : f x⁻¹ := h x⁻¹', 'instance'),
    'ᶜ': ('lemma g (s : Set ℕ) (f : Set ℕ → Prop) (h : ∀ t, f t) : f sᶜ := h sᶜ', 'variable'),
}
TAILS = {'instance': (' : Mul ℂ := ⟨fun a _ => a⟩', 'instance'), 'variable': (' (hf : False)', 'scope'),
         'run_cmd': (' Lean.logInfo "x"', 'metaprogram'), '#eval': (' (1 : ℕ)', 'metaprogram'), 'axiom': (' cheat : False', 'axiom'),
         'infix': (':65 " ⊕⊕ " => HAdd.hAdd', 'syntax'), 'set_option': (' debug.skipKernelTC true in', 'set_option'),
         'open': (' Complex in', 'open')}

@pytest.mark.parametrize('glue', sorted(GLUED))
def test_a_command_word_glued_to_the_token_before_it_is_a_command(glue, former):
    "`numberFnAux`/`charLitFnAux` end the numeral or the character; `⁻¹`, `ᶜ` are declared tokens and `¹`, `ᶜ` no identifier characters."
    decl, word = GLUED[glue]
    tail, rule = TAILS[word]
    check(H + decl + word + tail + '\n' + S + RING, rule, former)

@pytest.mark.parametrize('word', sorted(TAILS))
def test_every_command_word_glued_to_a_numeral(word, former):
    tail, rule = TAILS[word]
    code = H + 'lemma g (f : ℕ → Prop) (h : ∀ n, f n) : f 1 := h 1' + word + tail + '\n' + S + RING
    # `open Complex in` and `set_option … in` glued in front of the theorem: rejected as a prefix reaching it, or by its option
    check(code, rule, former)

QUOTE_TOKENS = {"''": "(fun _ => trivial) '' '\"'", "⁻¹'": "(fun _ => trivial) ⁻¹' '\"'", "×'": "(ℕ ×' '\"')",
                "Σ'": "(Σ' '\"')", "∑'": "(∑' '\"')", "∏'": "(∏' '\"')"}

FORMER_KNEW = {"''", "⁻¹'"}       # the former lexer (ei_nb.lean_lex) already had these two; not ×', Σ', ∑', ∏'

@pytest.mark.parametrize('tok', sorted(QUOTE_TOKENS))
def test_a_char_literal_after_a_quote_ending_token_hides_no_command(tok, former):
    """The longest token takes the quote (`''`, `⁻¹'`, …): the `'\"'` after it is a character to Lean, so the `\"` opens no string.
    (After the binder notations `Σ'`, `∑'`, `∏'` Lean then fails to parse; what matters is that the pre-check reads what Lean reads.)"""
    hidden = f"lemma q : True := by\n  try exact {QUOTE_TOKENS[tok]}\n  trivial\n{INST} -- \"\n"
    check(H + hidden + S + RING, 'instance', former, bypassed_before=tok not in FORMER_KNEW)

@pytest.mark.parametrize('tok', sorted(QUOTE_TOKENS))
def test_a_decoy_statement_is_compared_where_lean_reads_it(tok, former):
    """A decoy the former pre-check compared (code to it, a string to Lean) while Lean checked an easier theorem (a string to it).
    Now the pre-check reads Lean's tokens: it sees the easier theorem and the `def` whose string holds the decoy."""
    easy = S.replace('7 * (3 * y + 2) = 21 * y + 14', 'True')
    code = (H + f"lemma q : True := by\n  try exact {QUOTE_TOKENS[tok]}\n  trivial\n" + easy + '  trivial\n'
            + 'def s := "\n' + S + RING + '"\n-- "\n')
    reason = precheck(code, P)
    check(code, 'definition', former, bypassed_before=tok not in FORMER_KNEW)
    assert 'statement' in reason.split('(also: ')[1], reason
    assert precheck(code, P, load_policy({'rules': {'definition': False}})).startswith('statement: theorem mathd_algebra_182 differs')

@pytest.mark.parametrize('where', ['header line (dropped before Lean runs)', 'after the theorem', 'open … in a tactic'])
def test_scoped_tokens_are_read_only_where_lean_reads_them(where):
    """Scoped tokens count only after an `open` of their namespace (`FirstOrder`'s `='`, Mathlib/ModelTheory/Syntax.lean):
    a table built from an `open` anywhere would read `='"'` before it as `='` then a string, hiding the instance below."""
    hide = "lemma q : True := by\n  try exact (1 ='\"')\n  trivial\n" + INST + ' -- "\n'
    code = {'header line (dropped before Lean runs)': H + 'open FirstOrder\n' + hide + S + RING,
            'after the theorem': H + hide + S + RING + 'open FirstOrder\n',
            'open … in a tactic': H + hide + S + '  open FirstOrder in ring\n'}[where]
    reason = precheck(code, P)
    assert reason is not None and reason.split(':')[0] == 'instance', reason            # the instance is seen, as Lean sees it

def test_scoped_tokens_that_change_the_reading_after_the_open_are_denied():
    "After `open FirstOrder in`, Lean reads `='` then a string where the header's tokens read a character then code: denied."
    after = H + "lemma a : True := trivial\nopen FirstOrder in\nlemma q : True := by\n  try exact (1 ='\"') \"\n  trivial\n" + INST + ' -- "\n' + S + RING
    assert precheck(after, P).startswith('open: `open FirstOrder` at line 9: the scoped notation of FirstOrder'), precheck(after, P)
    assert precheck(H + S + RING + 'open Complex\n', P) is None          # Complex has scoped notation (`cexp`), none after it

def test_statement_tokens_keep_lean_s_blanks():
    "Blanks Lean's parser reads (`checkWsBefore`/`checkNoWsBefore`): `a[i]` indexes, `a [i]` applies; line breaks and comments are blanks."
    stmt = 'theorem t (a : List ℕ) (i : Fin a.length) : a[i] = a[i] := by\n'
    prob = {'name': 't', 'header': H, 'formal_statement': stmt}
    assert precheck(H + stmt + '  rfl', prob) is None
    assert precheck(H + stmt.replace(': a[i] =', ':\n  a[i] /- same -/ =') + '  rfl', prob) is None
    assert precheck(H + stmt.replace(': a[i] =', ': a [i] =') + '  rfl', prob).startswith('statement:')

def test_run_io_runs_io_at_elaboration_time(former):
    check(H + S + '  have := run_io pure ()\n' + RING, 'metaprogram', former)
    check(H + 'lemma g (f : ℕ → Prop) (h : ∀ n, f n) : f 1 := h 1run_io pure ()\n' + S + RING, 'metaprogram', former)


# ---------------------------------------------------------------- part 2: commands split where Lean splits them
def test_statement_and_tactics_at_column_0_are_the_theorem_s():
    "A statement going on at column 0 and a tactic block at column 0 (13 published proofs were rejected so) are one command to Lean."
    r = DSV2['mathd_algebra_182']
    assert precheck(H + S.replace('(y : ℂ) :', '(y : ℂ)\n:') + RING, P) is None
    assert precheck(H + S + 'ring\n', P) is None
    flat = '\n'.join(l.lstrip(' ') for l in r['full_code'].split('\n'))
    assert precheck(flat, P) is None

def test_open_in_at_the_end_of_the_line_above_reaches_the_theorem(former):
    check(H + 'lemma helper : True := trivial open Complex in\n' + S + RING, 'open', former)

def test_open_that_swallows_the_lines_under_it(former):
    "`open` takes names up to the next command word: swallowed lines that are no names are denied; a swallowed command is a command."
    check(H + S + RING + 'open Real\n  local notation "ℂ" => ℕ\n', 'syntax', former)
    assert precheck(H + S + RING + 'open Real\n  (x)\n', P).startswith('open:')
    assert precheck(H + 'open Real\n  instance : Mul ℂ := ⟨fun a _ => a⟩\n' + S + RING, P).startswith('instance:')

def test_print_axioms_is_allowed_anywhere_and_removed_exactly(former):
    "5 published proofs print axioms mid-file; the report that counts is ours (matched by position), so theirs is dropped."
    code = H + 'lemma helper : True := trivial\n#print axioms helper\n' + S + RING + '#print axioms mathd_algebra_182\n'
    reason, body = prepare(code, P)
    assert reason is None and '#print' not in body
    assert body.split('\n')[8] == '' and body.split('\n')[7] == 'lemma helper : True := trivial'    # that line, empty; the others kept
    if former: assert former.precheck(code, P).startswith('hash_command')                          # rejected before

def test_a_plain_helper_def_is_denied():
    "Rules table, rule `definition`: a def can overload a statement name and is unfolded by decide/rfl/simp."
    assert precheck(H + 'def seven : ℂ := 7\n' + S + RING, P).startswith('definition:')

def test_deny_by_default_every_command_not_allowed():
    for cmd, rule in [('suppress_compilation', 'toplevel'), ('attribute [simp] Nat.add_comm', 'instance'), ('universe u', 'scope'),
                      ('export Nat (succ)', 'scope'), ('#check Nat', 'hash_command'), ('example : True := trivial', 'definition'),
                      ('noncomputable instance : Inhabited ℕ := ⟨0⟩', 'instance'),
                      ('@[norm_num] theorem z : True := trivial', 'attribute')]:
        r = precheck(H + cmd + '\n' + S + RING, P)
        assert r is not None and r.split(':')[0] == rule, (cmd, r)

def test_the_rule_that_decides_is_one_that_rejects():
    "An allowed `set_option … in` before the theorem is no hit: a file rejected for `exact?` is reported under `search`."
    assert precheck(H + 'set_option maxHeartbeats 400000 in\n' + S + '  exact?\n', P).startswith("search: 'exact?'")
    r = precheck(H + S + '  set_option trace.Meta.synthInstance true in\n  exact?\n', P)
    assert r.startswith("search: 'exact?'") and r.endswith('(also: set_option)'), r


# ---------------------------------------------------------------- the text sent to Lean: line arithmetic on it
def test_a_multi_line_literal_above_a_column_0_comment(former):
    "The former line arithmetic ran on a copy without literals: it blanked the wrong line or raised IndexError on honest proofs."
    for lit in ('"a\nb\nc"', 'r"x\ny"', "'\\n'"):
        code = H + S + f'  have : {lit} = {lit} := rfl\n' + RING + '/- done -/\n#print axioms mathd_algebra_182\n'
        reason, body = prepare(code, P)
        assert reason is None
        raw = code.split('\n')
        header = [i for i, l in enumerate(raw[:7]) if l]          # the repeated header's lines, blanked too
        assert [i for i, (a, b) in enumerate(zip(raw, body.split('\n'))) if a != b] == header + [len(raw) - 2], (lit, body)
        if former and '\n' in lit: assert former_verdict(former, code) == 'crash' or former.prepare(code, P)[1] != body   # wrong line, or the crash
    code = H + S + '  have : "a\nb" = "a\nb" := rfl\n' + RING + '/-\n#exit\n-/\n#print axioms mathd_algebra_182\n'
    body = prepare(code, P)[1]
    assert '/-\n#exit\n-/' in body                     # the commented-out command stays commented out

def test_a_precheck_crash_is_that_sample_s_error_not_a_lost_batch():
    from ei_nb.verifier import Verifier
    bad = {**P, 'formal_statement': 'example : True := by'}            # declares no theorem: the pre-check raises
    s = lambda i, c: {'name': N, 'sample_idx': i, 'round': 0, 'completion': f'```lean4\n{c}\n```', 'n_tokens': 1, 'capped': False}
    with Verifier() as v:
        out = list(v.verify_stream([(bad, s(0, H + S + RING)), (P, s(1, H + S + RING))]))
    assert [r['verdict'] for r in out] == ['error', 'unchecked'] and out[0]['reason'].startswith('internal: BadInput')

def test_reference_text_renames_the_declared_name():
    "The name is replaced where the theorem declares it, not inside the word `theorem` or a doc comment."
    assert reference_text('theorem t : True := by').startswith('theorem ei_reference_statement : True := by sorry')
    assert reference_text('/-- see h -/\ntheorem h (x : ℕ) : x = x := by\n').split('\n')[:2] == \
        ['/-- see h -/', 'theorem ei_reference_statement (x : ℕ) : x = x := by sorry']


# ---------------------------------------------------------------- honest proofs, before and after
def _published():
    "(source, problem, code) of every published proof bundled in ei_nb/data."
    from ei_nb.demo import _workbook_rows
    few = _rows('minif2f_valid_few_shot_dsp15.jsonl')
    out = [('dsv2', MINIF2F[r['name']], r['full_code']) for r in DSV2.values()]
    out += [('few-shot', MINIF2F[r['name']], MINIF2F[r['name']]['header'] + r['formal_statement'] + r['formal_proof']) for r in few]
    out += [('workbook', {'name': r['id'], 'header': s['header'], 'formal_statement': s['formal_statement']}, r['code']) for r, s in _workbook_rows()]
    return out

def test_published_proofs_before_and_after(former):
    "607 published proofs: the 9 DeepSeek-Prover-V2 solutions of a corrected statement are rejected (unfaithful), before and after."
    res = [(src, p['name'], former_verdict(former, code, p) if former else None, precheck(code, p)) for src, p, code in _published()]
    assert len(res) == 607
    unfaithful = {n for n, r in DSV2.items() if not r['statement_matches_minif2f_dsp15']}
    if former: assert {n for _, n, old, _ in res if old} == unfaithful
    assert {n for _, n, _, new in res if new} == unfaithful and all(new.startswith('statement:') for _, n, _, new in res if new)

def test_published_proofs_rewritten_as_other_publishers_write_them(former):
    "Column-0 tactic blocks, `#print axioms` mid-file, a multi-line literal: accepted now; the former pre-check rejected or crashed on them."
    few = _rows('minif2f_valid_few_shot_dsp15.jsonl')
    n_before = 0
    for r in few:
        p = MINIF2F[r['name']]
        flat = p['header'] + '\n'.join(l.lstrip(' ') for l in (r['formal_statement'] + r['formal_proof']).split('\n'))
        mid = p['header'] + 'lemma helper : True := trivial\n#print axioms helper\n' + r['formal_statement'] + r['formal_proof']
        for code in (flat, mid):
            assert precheck(code, p) is None, (r['name'], precheck(code, p))
            n_before += former is not None and former_verdict(former, code, p) is not None
    assert former is None or n_before >= len(few)          # every `#print axioms` mid-file was rejected before, and column-0 tactics mostly too

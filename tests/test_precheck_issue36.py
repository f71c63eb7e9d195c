"""Issue 36, point 3: the pre-check admits only syntax it knows, and never raises.

SOURCE of every exploit class here: the description of issue 36 (`/work/wt/issue36.md`, "A third outside corpus ...
sent 68 exploits through the pre-check. 55 reach Lean"): Mathlib's `conv => run_conv do …`; `eval% …`; attributes on a
`let rec` inside brackets with `«»`-escaped names (`@[«instance»]`, `@[«command_elab» k]`, `@[«tactic» k]`,
`@[norm_num …]`, `@[«implemented_by» …]`); interpolated strings opened by `println!` or `aesop_trace![…]` hiding code
in `{…}`; search tactics under other names (`observe`, `have?`, `rw?`, `hint`, `slim_check`); three malformed
completions whose interpolation `{` runs to the end (IndexError).
The corpus itself was kept back, so each exploit is rebuilt
from that description on a real miniF2F statement (`ei_nb/data/minif2f_dsp15.jsonl`). Lean sources followed:
`println!` is `syntax "println! " (interpolatedStr(term) <|> term) : term` (src/Init/System/IO.lean), `aesop_trace![`
is `macro "aesop_trace![" opt:ident "] " msg:(interpolatedStr(term) <|> term)` (Aesop/Tracing.lean), and inside the
string Lean's `interpolatedStrFn` (src/Lean/Parser/StrInterpolation.lean, leanprover/lean4 edefad1d) parses a term
after each `{`. Where git holds the commit before this work (d868896), each exploit is also run through that former
pre-check to show it got past it (or crashed it).
"""
import json, subprocess, sys, types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ei_nb.core import shared_data
from ei_nb.lean_tokens import tokenize
from ei_nb.policy import load_policy, precheck, syntax_allowlist

ROOT = Path(__file__).resolve().parents[1]
BEFORE = 'd868896'        # main before issue 36 (the pre-check of issue 28)

def _rows(f): return [json.loads(line) for line in open(shared_data(f), encoding='utf-8')]
MINIF2F = {r['name']: r for r in _rows('minif2f_dsp15.jsonl')}
DSV2 = [r for r in _rows('deepseek_prover_v2_minif2f_solutions.jsonl') if r['statement_matches_minif2f_dsp15']]
N = 'mathd_algebra_182'
P = MINIF2F[N]
H, S, RING = P['header'], P['formal_statement'], '  ring\n'


def _module_before(path:str, name:str):
    "The module `ei_nb/{path}` as it was at BEFORE (from git), or None without git."
    try: src = subprocess.run(['git', '-C', str(ROOT), 'show', f'{BEFORE}:ei_nb/{path}'], capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError): return None
    mod = types.ModuleType(f'ei_nb.{name}'); mod.__package__ = 'ei_nb'
    exec(compile(src, f'{BEFORE}:ei_nb/{path}', 'exec'), mod.__dict__)
    return mod

@pytest.fixture(scope='module')
def former():
    "The pre-check at BEFORE (ei_nb/policy.py from git, on today's tokenizer), or None without git."
    return _module_before('policy.py', '_policy_before_36')

@pytest.fixture(scope='module')
def former_tokens():
    "The tokenizer at BEFORE (ei_nb/lean_tokens.py from git), or None without git."
    return _module_before('lean_tokens.py', '_tokens_before_36')

def former_verdict(former, code):
    try: return former.precheck(code, P)
    except IndexError: return 'crash'

# ---------------------------------------------------------------- the exploit classes of issue 36, one rule each
EXPLOITS = {   # class -> (code, the rule that must name it)
    'conv => run_conv do': (H + S + '  conv => run_conv do IO.FS.writeFile "/tmp/pwn" "x"\n' + RING, 'metaprogram'),
    'eval% (the interpreter, IO included)':
        (H + S + '  have h : (2 : ℕ) = eval% (2 : ℕ) := rfl\n' + RING, 'metaprogram'),
    'let rec @[«instance»] in brackets':
        (H + S + '  exact (let rec @[«instance»] i : Mul ℂ := ⟨fun a _ => a⟩; by ring)\n', 'attribute'),
    'let rec @[«command_elab» k]':
        (H + S + '  exact (let rec @[«command_elab» k] e : Lean.Elab.Command.CommandElab := fun _ => pure ();'
         ' by ring)\n',
         'attribute'),
    'let rec @[«tactic» k]':
        (H + S + '  exact (let rec @[«tactic» k] t : Lean.Elab.Tactic.Tactic := fun _ => pure (); by ring)\n',
         'attribute'),
    'let rec @[norm_num …]':
        (H + S + '  exact (let rec @[norm_num _ + _] e : ℕ := 0; by ring)\n', 'attribute'),
    'let rec @[«implemented_by» …]':
        (H + S + '  exact [(let rec @[«implemented_by» g] f : ℕ → ℕ := id; f 1)].length.succ_ne_zero.elim (by ring)\n',
         'unsafe'),        # the rule that names `implemented_by` (read through its «»), before `attribute` in the table
    'println! hiding code in {…}':
        (H + S + '  have := (println! "{(← IO.FS.writeFile "/tmp/pwn" "x")}" : IO Unit)\n' + RING, 'metaprogram'),
    'aesop_trace![…] hiding code in {…}':
        (H + S + '  have := (do aesop_trace![steps] "{(← IO.getEnv "SECRET")}" : Lean.MetaM Unit)\n' + RING,
         'metaprogram'),
    'observe': (H + S + '  observe h : (1 : ℕ) + 1 = 2\n' + RING, 'search'),
    'have?': (H + S + '  have? using y\n' + RING, 'search'),
    'rw?': (H + S + '  rw?\n', 'search'),
    'hint': (H + S + '  hint\n', 'search'),
    'slim_check': (H + S + '  slim_check\n', 'search'),
}

@pytest.mark.parametrize('cls', sorted(EXPLOITS))
def test_each_exploit_class_is_stopped_by_the_rule_that_names_it(cls, former):
    code, rule = EXPLOITS[cls]
    reason = precheck(code, P)
    assert reason is not None and reason.split(':')[0] == rule, (cls, reason)
    if former is not None and 'implemented_by' not in cls and 'have?' not in cls:
        # the issue: these reached Lean (`implemented_by` was a rule word; `have? using` an error of the former lexer)
        assert former_verdict(former, code) is None, (cls, former_verdict(former, code))

@pytest.mark.parametrize('spelling', ['@[«instance»]', '@[instance]', '@[ «instance» ]', '@[«simp», «instance»]'])
def test_escaped_attribute_names_are_compared_as_the_keywords_they_spell(spelling):
    "Attributes anywhere are refused; with that rule off, `«instance»` inside is still the keyword `instance`."
    code = H + S + f'  exact (let rec {spelling} i : Mul ℂ := ⟨fun a _ => a⟩; by ring)\n'
    assert precheck(code, P).startswith('attribute:')
    assert precheck(code, P, load_policy({'rules': {'attribute': False}})).startswith('instance:')

def test_every_attribute_at_any_depth_is_refused():
    for code in (H + '@[simp] lemma z : True := trivial\n' + S + RING,
                 H + S + '  have := ((([(let rec @[simp] f : ℕ := 1; f)])))\n' + RING,
                 H + S + RING + 'where\n  @[simp] g : ℕ := 1\n'):
        assert precheck(code, P).split(':')[0] == 'attribute', code

@pytest.mark.parametrize('opener', ['println! ', 'aesop_trace![x] ', 'aesop_trace[x] ', 's!', 'm!', 'f!', 'throwError ',
                                    'dbg_trace '])
def test_code_inside_an_interpolation_is_read_as_lean_reads_it(opener):
    """Every interpolation-opening token of the table: the `{…}` of its string is code (`interpolatedStrFn`), so a
    search tactic hidden there is seen even with the rule that names the opener switched off."""
    code = H + S + f'  have := {opener}"a{{(by exact? : 1 = 1)}}b"\n' + RING
    assert precheck(code, P, load_policy({'rules': {'metaprogram': False}})).startswith("search: 'exact?'"), opener
    hidden = [code[a:b] for k, a, b in tokenize(code) if k == 'keyword']
    assert 'exact?' in hidden

MALFORMED = [H + S + '  have := m!"{', H + S + '  have := s!"x{ (1 + ', H + S + '  exact (println! "{ by ring']

@pytest.mark.parametrize('code', MALFORMED, ids=['m!', 's!', 'println!'])
def test_an_interpolation_brace_running_to_the_end_is_a_lexer_reject_not_a_crash(code, former_tokens):
    "The three malformed completions of the issue: IndexError before (a broken verifier, exit 3), a `lexer` reject now."
    reason = precheck(code, P)           # the opener's own rule first (`m!` is a metaprogram word), the lexer too
    assert reason.split(':')[0] == 'metaprogram' and reason.endswith('lexer)') or reason.startswith('lexer'), reason
    off = load_policy({'rules': {'metaprogram': False}})
    assert precheck(code, P, off).startswith('lexer: an interpolation `{` that runs to the end'), precheck(code, P, off)
    # the former tokenizer drew an empty error token there: `text[a]` raised IndexError
    if former_tokens is not None:
        assert any(k == 'error' and a == b == len(code) for k, a, b in former_tokens.tokenize(code))
    assert all(b > a for _, a, b in tokenize(code))

# ---------------------------------------------------------------- the pre-check never raises
PIECES = ['m!"{', 's!"', 'println! "{', 'aesop_trace![x] "{', '{', '}', '(', ')', '[', ']', '⟨', '⟩', '"', "'",
          '`', '«', '»', '/-', '-/', '--', '@[', ':=', 'by', '\n', ' ', '\t', 'theorem', 'open Real in', 'set_option',
          '#print axioms', '0x', '1e', 'r#"', '\\', 'λ', '∑', '⁻¹', "''", '×\'', 'h.1.2', '\u200b', '\U0001F600',
          '\x00', '\r']

def _never_raises(code:str):
    reason = precheck(code, P)
    assert reason is None or isinstance(reason, str)

@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=40))
def test_random_completions_never_raise(parts):
    _never_raises(''.join(parts))
    _never_raises(H + S + ''.join(parts))

@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.integers(0, len(DSV2) - 1), st.floats(0, 1), st.floats(0, 1),
       st.sampled_from(['truncate', 'insert', 'delete', 'unicode']),
       st.one_of(st.sampled_from(PIECES), st.text(max_size=3)))
def test_mutated_real_proofs_never_raise(i, at, upto, how, piece):
    "Mutations of DeepSeek-Prover-V2's published proofs: truncated, a piece inserted (an unclosed `{`, a bracket), cut."
    text = DSV2[i]['full_code']
    a, b = sorted((int(at * len(text)), int(upto * len(text))))
    code = {'truncate': text[:a], 'insert': text[:a] + piece + text[a:], 'delete': text[:a] + text[b:],
            'unicode': text[:a] + ''.join(chr(0x80 + (ord(c) * 7919) % 0x2FF00) for c in piece or 'x') + text[a:]}[how]
    _never_raises(code)

# ---------------------------------------------------------------- the allow-list: what it costs on honest proofs
def _allowlist():
    return json.loads((ROOT/'ei_nb'/'data'/'lean_syntax_allowlist.json').read_text(encoding='utf-8'))

def test_no_published_proof_is_rejected_by_the_syntax_rules():
    """All 607 bundled published proofs (DeepSeek-Prover-V2 438, Goedel/kimina Lean-workbook 102, DSP-1.5 few-shot 67):
    none is rejected by `token`, `attribute`, `search` or `metaprogram`; only the 9 proofs of corrected statements fail
    (`statement`). The false rejects of a list built without a publisher are measured in the JSON (`held_out`)."""
    sys.path.insert(0, str(ROOT/'tools'))
    from gen_syntax_allowlist import proof_sets
    rejected = {}
    for name, files in proof_sets().items():
        for pid, text in files:
            problem = MINIF2F.get(pid) or _own_problem(text)
            if (r := precheck(text, problem)) is not None: rejected[(name, pid)] = r.split(':')[0]
    assert set(rejected.values()) <= {'statement'}, rejected
    assert len(rejected) == 9 and all(name == 'deepseek_prover_v2_minif2f' for name, _ in rejected), rejected

def _own_problem(text):
    "A Lean-workbook file is checked against its own theorem (its statement is the file's, up to `:= by`)."
    i = text.index('theorem')
    return {'name': 'workbook', 'header': H, 'formal_statement': text[i:text.index(':= by', i) + 5] + '\n'}

def test_the_allow_list_is_what_the_generator_makes_and_its_held_out_cost_is_recorded():
    data = _allowlist()
    assert set(data['tokens']) == syntax_allowlist() and len(data['tokens']) >= 100
    held = data['held_out']
    assert set(held) >= {'deepseek_prover_v2_minif2f', 'goedel_lean_workbook', 'dsp15_few_shot_valid'}
    for name, h in held.items():
        assert 0 <= h['rejected'] <= h['proofs'] and sum(h['tokens'].values()) >= h['rejected'], name
    sys.path.insert(0, str(ROOT/'tools'))
    from gen_syntax_allowlist import proof_sets, statements, syntax_tokens
    from ei_nb.policy import rule_words
    sets = proof_sets()
    every = [f for fs in sets.values() for f in fs] + statements()
    bundled = set().union(*(syntax_tokens(t) for _, t in every)) - set(rule_words())
    assert bundled <= syntax_allowlist()                                 # every bundled proof's syntax is on the list
    assert not {'run_conv', 'eval%', 'observe', 'hint', 'slim_check', 'println!', '@['} & syntax_allowlist()

def test_a_problems_own_notation_is_admitted_in_its_proofs():
    """The statement is trusted input: its syntax tokens are admitted in its proofs even when no published proof uses
    them (a training pool's notation: `⋃`, `∅` are not on the list), and only there."""
    assert not {'⋃', '∅'} & syntax_allowlist()
    stmt = 'theorem union_empty (s : ℕ → Set ℕ) (h : ∀ i, s i = ∅) : (⋃ i, s i) = ∅ := by\n'
    prob = {'name': 'union_empty', 'header': H, 'formal_statement': stmt}
    assert precheck(H + stmt + '  simp [h]\n', prob) is None
    assert precheck(H + S + '  have : (∅ : Set ℕ) = ∅ := rfl\n' + RING, P).startswith("token: '∅'")

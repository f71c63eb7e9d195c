"""Tests of the verifier (`ei_nb.policy`, `ei_nb.lean_reply`, `ei_nb.lean_backends`, `ei_nb.verifier`, `ei_nb.verify`;
issue 3). Three kinds, labelled as such:

- PRE-CHECK tests (no Lean needed): table-driven cheats and legitimate proofs built on the real statements and proofs
  bundled in `ei_nb/data`, the full few-shot and DeepSeek-Prover-V2 sets, `ei verify`.
- FAULT-INJECTION tests (`TestFaultInjection*`): the process layer driven by `tests/fake_repl.py`, a fake
  REPL/`lean`/server that runs NO Lean. They prove timeouts, restarts, recycling, header reuse, caching, streaming, and
  that no fault is ever a `pass`. They are not evidence about Lean itself.
- REAL-LEAN tests (`TestRealLean`): the real `repl` and `lean` backends; skipped, with the reason shown, unless `lean`
  is on PATH and EI_LEAN_PROJECT names a Mathlib project.
"""
import contextlib, http.server, io, json, os, shutil, socket, sys, threading, time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ei_nb.cli import main as ei_main
from ei_nb.core import BadInput, RecordError, StageFailed, check_record, read_verdicts, shared_data
from ei_nb.policy import DEFAULT_POLICY, RULES, extract_code, load_policy, precheck, split_code
from ei_nb.lean_reply import LeanError, judge
from ei_nb.verifier import cache_key
from ei_nb.verify import make_verifier, verify_cli
from tests import fake_repl

FAKE = str(Path(__file__).with_name('fake_repl.py'))
# the stand-in `ei-replay` (kernel replay of what a proof added)
FAKE_REPLAY = str(Path(__file__).with_name('fake_replay.py'))

def _rows(f): return [json.loads(l) for l in open(shared_data(f), encoding='utf-8')]
MINIF2F = {r['name']: r for r in _rows('minif2f_dsp15.jsonl')}
FEW_SHOT = _rows('minif2f_valid_few_shot_dsp15.jsonl')
DSV2 = _rows('deepseek_prover_v2_minif2f_solutions.jsonl')

def fence(code, thinking='Let me work out the proof step by step.'):
    return f"{thinking}\n\n```lean4\n{code}\n```\n"

def few_shot_code(r, header=True):
    return (MINIF2F[r['name']]['header'] if header else '') + r['formal_statement'] + r['formal_proof']

def sample(name, idx, completion):
    return {'name': name, 'sample_idx': idx, 'round': 0, 'completion': completion, 'n_tokens': 10, 'capped': False}

# ---------------------------------------------------------------- pre-check: the cheat table
FS = {r['name']: r for r in FEW_SHOT}
A = FS['mathd_algebra_182']          # 7 * (3 * y + 2) = 21 * y + 14, proof: ring
B = FS['mathd_numbertheory_169']     # Nat.gcd 20! 200000 = 40000
C = FS['mathd_algebra_116']
H, S, P, N = MINIF2F[A['name']]['header'], A['formal_statement'], A['formal_proof'], A['name']
SB, PB = B['formal_statement'], B['formal_proof']

CHEATS = [  # (id, problem name, code, rule that must reject it)
    ('sorry', N, H + S + '  sorry', 'sorry'),
    ('admit', N, H + S + '  admit', 'sorry'),
    ('sorryAx term', N, H + S + '  exact sorryAx _ false', 'sorry'),
    ('sorry in a have', N, H + S + '  have h : False := by sorry\n' + P, 'sorry'),
    ('sorry after a block comment', N, H + S + '  /- fine -/ sorry', 'sorry'),
    ('sorry after a string holding --', N, H + S + '  have : "--" = "--" := rfl\n  sorry', 'sorry'),
    ('axiom', N, H + 'axiom cheat : False\n' + S + '  exact cheat.elim', 'axiom'),
    ('axiom with attribute', N, H + '@[simp] axiom cheat : ∀ y : ℂ, 7 * (3 * y + 2) = 21 * y + 14\n' + S + '  simp', 'axiom'),
    ('native_decide', B['name'], H + SB + '  native_decide', 'native_decide'),
    ('Lean.ofReduceBool', B['name'], H + SB + '  exact Lean.ofReduceBool _ _ rfl', 'native_decide'),
    ('implemented_by', N, H + '@[implemented_by id] def f (n : ℕ) : ℕ := n\n' + S + P, 'unsafe'),
    ('extern', N, H + '@[extern "c_f"] opaque f : ℕ → ℕ\n' + S + P, 'unsafe'),
    ('unsafe def', N, H + 'unsafe def f : ℕ := 1\n' + S + P, 'unsafe'),
    ('macro', N, H + 'macro "cheat" : tactic => `(tactic| simp)\n' + S + '  cheat', 'syntax'),
    ('macro_rules', N, H + 'macro_rules | `(tactic| ring) => `(tactic| simp)\n' + S + P, 'syntax'),
    ('syntax', N, H + 'syntax "cheat" : tactic\n' + S + P, 'syntax'),
    ('notation', N, H + 'notation "ℂ" => ℕ\n' + S + P, 'syntax'),
    ('local notation', N, H + 'local notation "seven" => 7\n' + S + P, 'syntax'),
    ('infixl', N, H + 'infixl:65 " +ᵥ " => HAdd.hAdd\n' + S + P, 'syntax'),
    ('postfix', N, H + 'postfix:max "!!" => Nat.factorial\n' + S + P, 'syntax'),
    ('elab', N, H + 'elab "cheat" : tactic => pure ()\n' + S + '  cheat', 'syntax'),
    ('elab_rules', N, H + 'elab_rules : tactic | `(tactic| cheat) => pure ()\n' + S + P, 'syntax'),
    ('instance', N, H + 'instance : Mul ℂ := ⟨fun a _ => a⟩\n' + S + P, 'instance'),
    ('attribute [local instance]', N, H + 'attribute [local instance] Classical.propDecidable\n' + S + P, 'instance'),
    ('run_cmd', N, H + 'run_cmd Lean.logInfo "hi"\n' + S + P, 'metaprogram'),
    ('run_tac', N, H + S + '  run_tac Lean.Elab.Tactic.evalTactic (← `(tactic| ring))', 'metaprogram'),
    ('#eval', N, H + '#eval 1 + 1\n' + S + P, 'metaprogram'),
    ('#exit', N, H + S + P + '\n#exit\n', 'exit'),
    ('#guard_msgs', N, H + '#guard_msgs in\n' + S + P, 'hash_command'),
    ('#print fake axiom report', N, H + S + P + f"\n#print \"'{N}' does not depend on any axioms\"\n", 'hash_command'),
    ('debug.skipKernelTC', N, H + 'set_option debug.skipKernelTC true in\n' + S + P, 'set_option'),
    ('set_option trace', N, H + S + '  set_option trace.Meta.Tactic.simp true in\n' + P, 'set_option'),
    ('apply?', N, H + S + '  apply?', 'search'),
    ('exact?', N, H + S + '  exact?', 'search'),
    ('@[simp] helper (issue 36: attributes anywhere)', N, H + '@[simp] lemma z : True := trivial\n' + S + P,
     'attribute'),
    ('conv => run_conv (issue 36)', N, H + S + '  conv => run_conv do pure ()\n' + P, 'metaprogram'),
    ('unknown syntax (issue 36: the allow-list)', N, H + S + '  compute_degree\n', 'token'),
    ('Nat.pow written out (issue 36: lean4#8060)', N, H + S + '  have : Nat.pow 2 2 = 4 := rfl\n' + P, 'kernel'),
    ('def shadowing', N, H + 'def sqrt (x : ℝ) : ℝ := 0\n' + S + P, 'definition'),
    ('abbrev', N, H + 'abbrev K := ℕ\n' + S + P, 'definition'),
    ('variable adds a hypothesis', N, H + 'variable (h : False)\n' + S + '  exact h.elim', 'scope'),
    ('open ... in before the theorem', N, H + 'open Complex in\n' + S + P, 'open'),
    ('open after a helper, before the theorem', N, H + 'lemma h : True := trivial\nopen Complex\n' + S + P, 'open'),
    ('open hiding', N, H + S + P + '\nopen Real hiding sqrt\n', 'open'),
    ('theorem inside a namespace', N, H + 'namespace X\n' + S + P + '\nend X', 'namespace'),
    ('indented namespace (a command to Lean)', N, H + 'lemma h : True := by\n  trivial\n  namespace X\n' + S + P, 'namespace'),
    ('late import', N, H + 'theorem helper : True := trivial\nimport Mathlib.Tactic\n' + S + P, 'import'),
    ('unterminated comment', N, H + S + P + '\n/- never closed', 'lexer'),
    ('unterminated string', N, H + S + '  have := "abc\n' + P, 'lexer'),
    ('quoted name (Lean reads the same name; the text check does not)', N, H + S.replace(N, f'«{N}»') + P, 'statement'),
    # Lean's comment rule: after `/-` one character is skipped, so `/-/-` is ONE opener (a nesting lexer hid the axiom)
    ('axiom hidden by the /-/- rule', N, H + '/-/- -/\naxiom cheat : ∀ y : ℂ, 7 * (3 * y + 2) = 21 * y + 14\n-- -/\n' + S + '  exact cheat y', 'axiom'),
    ('hypothesis hidden by the /-/- rule', N, H + S.replace('(y : ℂ)', '(y : ℂ) /-/- -/ (hf : False) -- -/') + '  exact hf.elim', 'statement'),
    ('instance hidden by the /-/- rule', N, H + '/-/- -/ local instance : Mul ℂ := ⟨fun a _ => a⟩ -- -/\n' + S + P, 'instance'),
    ('decoy statement in a /-/- comment', N, H + '/-/- -/ theorem mathd_algebra_182 (y : ℂ) : True := trivial -- -/\n' + S + P, 'statement'),
    ('sorry in an interpolated string', N, H + S + '  have := s!"{(sorry : ℕ)}"\n' + P, 'sorry'),
    ('sorry in m! after a comment', N, H + S + '  have := m! /- c -/ "{(sorry : ℕ)}"\n' + P, 'sorry'),
    ('stop', N, H + S + '  stop\n' + P, 'sorry'),
    ('decide +native', B['name'], H + SB + '  decide +native', 'native_decide'),
    ('bv_decide', B['name'], H + SB + '  bv_decide', 'native_decide'),
    ('Lean.trustCompiler', N, H + S + '  exact absurd Lean.trustCompiler id', 'native_decide'),
    ('simproc', N, H + 'simproc cheat (foo _) := fun _ => pure none\n' + S + P, 'metaprogram'),
    ('dsimproc', N, H + 'dsimproc cheat (foo _) := fun _ => pure none\n' + S + P, 'metaprogram'),
    ('variables (Mathlib)', N, H + 'variables (h : False)\n' + S + '  exact h.elim', 'scope'),
    ('variable?', N, H + 'variable? [Mul ℂ]\n' + S + P, 'scope'),
    ('variable!', N, H + 'variable! (h : False)\n' + S + P, 'scope'),
    ('unlisted command (deny by default)', N, H + 'suppress_compilation\n' + S + P, 'toplevel'),
    ('set_option in before the theorem', N, H + 'set_option autoImplicit true in\n' + S + P, 'set_option'),
    ('#print with more than a name', N, H + S + P + '\n#print axioms mathd_algebra_182 Nat.add_comm', 'hash_command'),
    ('#print of a string', N, H + S + P + '\n#print "hello"', 'hash_command'),
    ('extra hypothesis', N, H + S.replace('(y : ℂ)', '(y : ℂ) (hf : False)') + '  exact hf.elim', 'statement'),
    ('changed type', N, H + S.replace('(y : ℂ)', '(y : ℕ)') + P, 'statement'),
    ('changed conclusion', N, H + S.replace('21 * y + 14', '7 * (3 * y + 2)') + '  rfl', 'statement'),
    ('theorem missing', N, H + 'theorem helper (y : ℂ) : 7 * (3 * y + 2) = 21 * y + 14 := by\n  ring', 'statement'),
    ('theorem twice', N, H + S + P + '\n' + S + P, 'statement'),
    ('proved as lemma', N, H + S.replace('theorem', 'lemma', 1) + P, 'statement'),
    ('statement of another problem', N, H + SB.replace(B['name'], N) + PB, 'statement'),
    ('statement only in a comment', N, H + '/-\n' + S + '-/\ntheorem x : True := trivial', 'statement'),
]

LEGIT = [  # (id, problem name, completion)
    *[(f'few-shot {r["name"]}', r['name'], fence(few_shot_code(r))) for r in FEW_SHOT[:8]],
    *[(f'dsv2 {r["name"]}', r['name'], fence(r['full_code'])) for r in [r for r in DSV2 if r['statement_matches_minif2f_dsp15']][:5]],
    ('no header at all', N, fence(S + P)),
    ('header with other heartbeats and opens', N, fence('import Mathlib\nimport Aesop\nset_option maxHeartbeats 400000\nopen Real Nat\n\n' + S + P)),
    ('helper lemma first', N, fence(H + 'lemma helper (y : ℂ) : 7 * (3 * y + 2) = 21 * y + 14 := by ring\n\n' + S + '  exact helper y')),
    ('banned words only in comments', N, fence(H + '-- no sorry, no native_decide, no axiom here\n/- #exit -/\n' + S + '  -- admit? no.\n' + P)),
    ('allowed set_option in', N, fence(H + S + '  set_option maxRecDepth 10000 in\n' + P)),
    ('CRLF line endings', N, fence((H + S + P).replace('\n', '\r\n'))),
    ('a draft with sorry, then the final proof', N, '```lean4\n' + S + '  sorry\n```\nNow properly:\n' + fence(H + S + P)),
    ('docstring before the theorem', N, fence(H + '/-- Expand 7(3y+2). -/\n' + S + P)),
    ('trailing #print axioms of the theorem', N, fence(H + S + P + f'\n\n#print axioms {N}\n')),
    ('set_option tactic.hygienic false', N, fence(H + 'set_option tactic.hygienic false\n' + S + P)),
    ('set_option ... in before the theorem', N, fence(H + 'set_option maxHeartbeats 400000 in\n' + S + P)),
    ('term-mode proof', N, fence(H + S.replace(':= by', ':=') + '  (by ring)')),
    ('open Foo in before a helper', N, fence(H + 'open Real in\nlemma helper (y : ℂ) : 7 * (3 * y + 2) = 21 * y + 14 := by ring\n\n' + S + '  exact helper y')),
    ('namespace around a helper', N, fence(H + 'namespace Foo\nlemma helper : True := trivial\nend Foo\n\n' + S + P)),
    ('open after the theorem', N, fence(H + S + P + '\nopen Complex\n')),
    ('open ... in inside the proof', N, fence(H + S + '  open Real in\n' + P)),
    ('raw string and «name» in a proof', N, fence(H + S + '  have : r"\\" = r#"\\"# := rfl\n  have «my h» : True := trivial\n' + P)),
    ('statement reflowed over lines', C['name'], fence(few_shot_code(C).replace('(k x : ℝ) (h₀', '(k x : ℝ)\n    (h₀'))),
    # issue 28: Lean splits commands at command words, not at columns, and `#print axioms` is harmless anywhere
    ('indented theorem after the proof (a command to Lean)', N, fence(H + S + P + '\n  theorem x : True := trivial')),
    ('#print axioms in the middle', N, fence(H + S + P + '\n#print axioms mathd_algebra_182\ntheorem x : True := trivial')),
    ('#print axioms of another name', N, fence(H + S + P + '\n#print axioms Nat.add_comm')),
]

@pytest.mark.parametrize('cid,name,code,rule', CHEATS, ids=[c[0] for c in CHEATS])
def test_precheck_rejects_cheat(cid, name, code, rule):
    reason = precheck(extract_code(fence(code)), MINIF2F[name])
    assert reason is not None, f'{cid} passed the pre-check'
    assert reason.split(':')[0] == rule, reason

@pytest.mark.parametrize('cid,name,completion', LEGIT, ids=[c[0] for c in LEGIT])
def test_precheck_keeps_legit(cid, name, completion):
    assert precheck(extract_code(completion), MINIF2F[name]) is None

def test_table_sizes():
    assert len(CHEATS) >= 30 and len(LEGIT) >= 15
    # every pattern rule is exercised
    assert {r['rule'] for r in RULES} - {'set_option', 'statement'} <= {c[3] for c in CHEATS}

def test_all_few_shot_proofs_pass_precheck():
    bad = [(r['name'], precheck(extract_code(fence(few_shot_code(r))), MINIF2F[r['name']])) for r in FEW_SHOT]
    assert len(FEW_SHOT) == 67 and [b for b in bad if b[1]] == []

def test_lean_workbook_proofs_pass_with_their_own_statements():
    from ei_nb.demo import _workbook_rows      # the 102 rows of kimina-lean-server's lean-workbook file, full code
    rows = _workbook_rows()
    assert len(rows) == 102
    probs = [({'name': r['id'], 'header': s['header'], 'formal_statement': s['formal_statement']}, r['code'])
             for r, s in rows]
    assert [(p['name'], why) for p, code in probs if (why := precheck(code, p))] == []

def test_dsv2_solutions_429_pass_9_unfaithful():
    res = [(r, precheck(extract_code(fence(r['full_code'])), MINIF2F[r['name']])) for r in DSV2]
    assert sum(1 for r, why in res if r['statement_matches_minif2f_dsp15'] and why is None) == 429
    unfaithful = [(r['name'], why) for r, why in res if not r['statement_matches_minif2f_dsp15']]
    assert len(unfaithful) == 9 and all(why and why.startswith('statement:') for _, why in unfaithful), unfaithful

def test_extraction():
    assert extract_code('no code') is None
    assert extract_code('```lean4\nunclosed') is None
    assert extract_code('```LEAN4\nA\n```') == 'A\n'
    assert extract_code('```lean4\nA\n```\n```lean\nB\n```') == 'A\n'
    assert extract_code('```lean\nA\n```\n```lean\nB\n```') == 'B\n'
    assert extract_code('  ```lean4  \r\nA\r\n  ```  \r\n') == 'A\r\n'

def test_split_code_keeps_lines():
    pre, body = split_code('import Mathlib\nopen Real\n\ntheorem t : True := by\n  trivial')
    assert pre == 'import Mathlib\nopen Real' and body.split('\n')[3] == 'theorem t : True := by'

def test_policy_from_json_file(tmp_path):
    (tmp_path/'p.json').write_text(json.dumps({'rules': {'native_decide': False},
                                                'set_options': ['maxHeartbeats', 'trace.']}))
    pol = load_policy(tmp_path/'p.json')
    code = H + SB + '  native_decide'
    assert precheck(code, MINIF2F[B['name']]) and precheck(code, MINIF2F[B['name']], pol) is None
    assert precheck(H + S + '  set_option trace.Meta.Tactic.simp true in\n' + P, MINIF2F[N], pol) is None
    (tmp_path/'bad.json').write_text('{"rules": {"nativ_decide": false}}')
    with pytest.raises(BadInput, match='unknown rules'): load_policy(tmp_path/'bad.json')

# ---------------------------------------------------------------- ei verify --backend none on the shared data
def _write(path, rows):
    path.write_text(''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in rows), encoding='utf-8')
    return str(path)

def test_ei_verify_none_on_shared_data(tmp_path, capsys):
    probs = _write(tmp_path/'problems.jsonl', list(MINIF2F.values()))
    legit = [sample(r['name'], i, fence(few_shot_code(r))) for i, r in enumerate(FEW_SHOT)]
    legit += [sample(r['name'], 100 + i, fence(r['full_code'])) for i, r in enumerate(DSV2)
              if r['statement_matches_minif2f_dsp15']]
    legit += [sample(name, 1000 + i, comp) for i, (_, name, comp) in enumerate(LEGIT)]
    unfaithful = [sample(r['name'], 100 + i, fence(r['full_code'])) for i, r in enumerate(DSV2)
                  if not r['statement_matches_minif2f_dsp15']]
    cheats = [sample(name, 2000 + i, fence(code)) for i, (_, name, code, _) in enumerate(CHEATS)]
    # the second is cut off
    nocode = [sample(N, 3000, 'I could not find a proof.'), sample(N, 3001, '```lean4\n' + S + P)]
    samples = legit + unfaithful + cheats + nocode
    sams, out = _write(tmp_path/'samples.jsonl', samples), tmp_path/'verdicts.jsonl'
    assert ei_main(['verify', '--problems', probs, '--samples', sams, '--out', str(out)]) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts == {'n': len(samples), 'pass': 0, 'fail': len(unfaithful) + len(cheats), 'error': 0, 'no_code': 2,
                      'unchecked': len(legit)}
    verdicts = read_verdicts(out)
    assert [(v['name'], v['sample_idx']) for v in verdicts] == [(s['name'], s['sample_idx']) for s in samples]
    by = {(v['name'], v['sample_idx']): v for v in verdicts}
    assert all(by[(s['name'], s['sample_idx'])]['verdict'] == 'unchecked' for s in legit)
    assert all(by[(s['name'], s['sample_idx'])]['verdict'] == 'fail' for s in unfaithful + cheats)
    assert all(by[(s['name'], s['sample_idx'])]['reason'].startswith('statement:') for s in unfaithful)
    assert by[(N, 0 + FEW_SHOT.index(A))]['proof'] == extract_code(fence(few_shot_code(A)))

def test_ei_verify_unknown_problem_is_a_record_error(tmp_path, capsys):
    probs = _write(tmp_path/'p.jsonl', [MINIF2F[N]])
    sams = _write(tmp_path/'s.jsonl', [sample(N, 0, fence(H + S + P)), sample('no_such_problem', 0, 'x')])
    with pytest.raises(RecordError, match=r"s.jsonl:2: field 'name': unknown problem 'no_such_problem'"):
        verify_cli(['--problems', probs, '--samples', sams, '--out', str(tmp_path/'v.jsonl')])
    assert ei_main(['verify', '--problems', probs, '--samples', sams, '--out', str(tmp_path/'v.jsonl')]) == 2
    assert not (tmp_path/'v.jsonl').exists()

def test_ei_console_script(tmp_path):
    import subprocess
    probs = _write(tmp_path/'p.jsonl', [MINIF2F[N]])
    sams = _write(tmp_path/'s.jsonl', [sample(N, 0, fence(H + S + P)), sample(N, 1, fence(H + S + '  sorry'))])
    exe = shutil.which('ei') or pytest.skip('the ei console script is not installed')
    r = subprocess.run([exe, 'verify', '--problems', probs, '--samples', sams, '--out', str(tmp_path/'v.jsonl')],
                       capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {'n': 2, 'pass': 0, 'fail': 1, 'error': 0, 'no_code': 0,
                                                             'unchecked': 1}

def test_make_verifier_rejects_bad_settings(tmp_path):
    with pytest.raises(BadInput, match='unknown backend'): make_verifier('lean5')
    with pytest.raises(BadInput, match='needs --project'): make_verifier('repl', project=tmp_path/'missing')
    with pytest.raises(BadInput, match="unknown setting 'repl_cmdd'"):
        make_verifier('repl', project=tmp_path, repl_cmdd=['x'])
    with pytest.raises(BadInput, match='endpoint'): make_verifier('server')

def test_judge_rejects_fake_report_and_bad_axioms():
    rep = lambda line, data, sev='info': {'severity': sev, 'pos': {'line': line, 'column': 0}, 'data': data}
    ok = rep(9, "'t' depends on axioms: [propext, Classical.choice, Quot.sound]")
    assert judge({'messages': [ok]}, 't') == ('pass', None)
    assert judge({'messages': [rep(12, 'later info'), ok]}, 't')[0] == 'fail'          # the report must be last
    assert judge({'messages': [rep(9, ok['data'], 'warning')]}, 't')[0] == 'fail'
    assert judge({'messages': [rep(9, "'t' depends on axioms: [Lean.ofReduceBool]")]}, 't')[0] == 'fail'
    allowing = load_policy({'rules': {'native_decide': False}})
    assert judge({'messages': [rep(9, "'t' depends on axioms: [Lean.ofReduceBool]")]}, 't', allowing)[0] == 'pass'
    assert judge({'messages': [ok, rep(3, "declaration uses 'sorry'", 'warning')]}, 't')[0] == 'fail'
    assert judge({'messages': [rep(9, "'t2' does not depend on any axioms")]}, 't')[0] == 'fail'   # another theorem
    assert judge({'messages': [{'severity': 'info'}]}, 't')[0] == 'error'

# ---------------------------------------------------------------- fault injection (fake REPL, no Lean)
@pytest.fixture
def project(tmp_path):
    (tmp_path/'lean-toolchain').write_text('leanprover/lean4:v4.9.0-rc1\n')
    return tmp_path

def _proof(directive='', idx=0, name=N):
    "A legitimate completion of mathd_algebra_182 carrying a fake-REPL directive in a Lean comment."
    return (MINIF2F[name], sample(name, idx, fence(H + S + P + (f'  -- {directive}' if directive else ''))))

def _log(path):
    lines = path.read_text().split() if path.exists() else []
    # `pickle` lines not counted
    return {'start': lines[0::2].count('start'), 'cmd': lines[0::2].count('cmd'), 'lean': lines[0::2].count('lean')}

def _fake_repl(project, tmp_path, *args, timeout=1.0, workers=1, **kw):
    """The fake REPL through `make_verifier`; outside the sandbox by default (its --log is written on the host: the
    sandbox's own tests are tests/test_sandbox.py and the `sandbox=True` cases here)."""
    log = tmp_path/'fake.log'
    kw.setdefault('replay_cmd', [sys.executable, FAKE_REPLAY])
    kw.setdefault('sandbox', False)
    return make_verifier('repl', project=project, workers=workers, timeout=timeout, mem_mb=kw.pop('mem_mb', 256),
                         repl_cmd=[sys.executable, FAKE, '--log', str(log), *args], **kw), log

# a proof's limits are its `fail`; a crash, a protocol surprise: `error`
FAULTS = {'hang': ('fail', 'timeout: no reply within 1 s'), 'crash': ('error', 'crashed'),
          'garbage': ('error', 'malformed reply'), 'partial': ('fail', 'timeout:'), 'flood': ('error', 'reply over'),
          'leak': ('fail', 'memory: the REPL died at the memory limit'), 'badshape': ('error', 'malformed reply'),
          'replerror': ('error', 'protocol: the reply to a proof: expected env 1'),
          'forge': ('error', 'protocol: output after the reply'),
          'wrongenv': ('error', 'protocol: the reply to a proof')}
LEAN_FAILS = {'error': 'lean error', 'sorry': 'lean sorry', 'axiom=sorryAx': 'uses sorryAx',
              'axiom=Lean.ofReduceBool': 'uses Lean.ofReduceBool',
              'axiom=Lean.trustCompiler': 'uses Lean.trustCompiler',
              'noaxioms': 'no report', 'sorry428': 'lean sorry'}

class TestFaultInjection:
    "FAULT-INJECTION: the REPL pool against tests/fake_repl.py. These run no Lean."

    @pytest.mark.parametrize('sandbox', [False, True])
    @pytest.mark.parametrize('fault', sorted(FAULTS))
    def test_fault_verdict_and_the_pool_recovers(self, fault, sandbox, project, tmp_path):
        # issue 36: after any fault, fail or protocol surprise the REPL is replaced; issue 34: a timeout or the memory
        # limit is the proof's `fail`, never `error`
        v = make_verifier('repl', project=project, workers=1, timeout=1.0, mem_mb=256, max_reply=1 << 20,
                          sandbox=sandbox,
                          repl_cmd=[sys.executable, FAKE], replay_cmd=[sys.executable, FAKE_REPLAY])
        with v:
            t0 = time.perf_counter()
            bad = v.verify_one(*_proof(f'FAKE:{fault}', 0))
            took = time.perf_counter() - t0
            after = v.verify_one(*_proof('', 1))
            stats = v.backend.stats
        assert bad['verdict'] == FAULTS[fault][0] and FAULTS[fault][1] in bad['reason'], bad
        assert took < 5
        assert after['verdict'] == 'pass', after
        check_record(bad, 'verdict'); check_record(after, 'verdict')
        assert stats['starts'] == 2                        # killed (or dropped after a non-pass) and restarted

    @pytest.mark.parametrize('kind', sorted(LEAN_FAILS))
    def test_lean_level_failures_are_fail(self, kind, project, tmp_path):
        v, _ = _fake_repl(project, tmp_path)
        with v: r = v.verify_one(*_proof(f'FAKE:{kind}'))
        assert r['verdict'] == 'fail' and LEAN_FAILS[kind] in r['reason'], r

    def test_timeout_is_enforced_and_slow_answers_within_it_pass(self, project, tmp_path):
        v, _ = _fake_repl(project, tmp_path, timeout=0.6)
        with v:
            ok, slow = v.verify_one(*_proof('FAKE:slow=0.2', 0)), v.verify_one(*_proof('FAKE:slow=3', 1))
        assert ok['verdict'] == 'pass'
        assert (slow['verdict'], slow['reason']) == ('fail', 'timeout: no reply within 0.6 s')
        assert slow['verify_s'] < 1.5

    def test_header_is_imported_once_and_reused(self, project, tmp_path):
        v, log = _fake_repl(project, tmp_path)
        with v: verdicts = [v.verify_one(*_proof('', i))['verdict'] for i in range(5)]
        assert verdicts == ['pass'] * 5
        assert _log(log) == {'start': 1, 'cmd': 6, 'lean': 0}     # 1 header + 5 proofs (the replay tool: the reference)

    def test_recycled_after_max_uses(self, project, tmp_path):
        v, log = _fake_repl(project, tmp_path, max_uses=3, statement_check=False)   # counts proofs only
        with v:
            verdicts = [v.verify_one(*_proof('', i))['verdict'] for i in range(7)]
            stats = v.backend.stats
        assert verdicts == ['pass'] * 7
        assert stats == {'starts': 3, 'failures': 0, 'recycles': 2}
        assert _log(log) == {'start': 3, 'cmd': 7 + 3, 'lean': 0}  # each new process imports the header again

    def test_crash_mid_stream_restarts(self, project, tmp_path):
        v, log = _fake_repl(project, tmp_path, '--die-after', '3', statement_check=False)
        with v: res = sorted(v.verify_stream(_proof('', i) for i in range(6)), key=lambda r: r['sample_idx'])
        # a crash is the checker's
        assert [r['verdict'] for r in res] == ['pass', 'pass', 'error', 'pass', 'pass', 'error']
        assert _log(log)['start'] == 2          # the fake's proof counter restarts with the process

    @pytest.mark.parametrize('directive', ['FAKE:twoaxioms', 'FAKE:nullend'])
    def test_reports_elsewhere_and_null_endpos(self, directive, project, tmp_path):
        # a report printed at another line is never read (ours is matched by position)
        v, _ = _fake_repl(project, tmp_path)
        with v: r = v.verify_one(*_proof(directive))
        assert r['verdict'] == 'pass', r

    def test_a_report_about_another_constant_than_the_root_name_fails(self, project, tmp_path):
        # we append `#print axioms _root_.NAME`: Lean prints the root NAME it resolved, the constant the probe and the
        # replay inspect; a report naming `Foo.NAME` is about another constant (issue 28)
        v, _ = _fake_repl(project, tmp_path)
        with v: r = v.verify_one(*_proof('FAKE:qualified=Foo'))
        assert r['verdict'] == 'fail' and r['reason'].startswith('axioms: no report'), r

    def test_lean_side_statement_check(self, project, tmp_path):
        v, log = _fake_repl(project, tmp_path)
        with v:
            ok = [v.verify_one(*_proof('', i)) for i in range(3)]
            bad = v.verify_one(*_proof('FAKE:retype', 3))        # Lean elaborated the theorem's statement to another type
            assert v.stats['reference_runs'] == 0                 # issue 36: the replay tool compares, no probe read
        assert [r['verdict'] for r in ok] == ['pass'] * 3
        assert bad['verdict'] == 'fail' and "is not the reference statement's" in bad['reason'], bad
        v, _ = _fake_repl(project, tmp_path, statement_check=False, replay=False)
        with v: r = v.verify_one(*_proof('FAKE:retype'))
        assert r['verdict'] == 'pass' and r['unreplayed'], r    # no replay, no probe: the axioms decide, and it says

    def test_header_hang_stops_the_run_and_broken_header_is_an_error(self, project, tmp_path):
        v, log = _fake_repl(project, tmp_path, '--hang-on-header', header_timeout=0.5, workers=2)
        with v, pytest.raises(StageFailed, match='4fc1e6d'):
            list(v.verify_stream(_proof('', i) for i in range(6)))
        assert _log(log)['cmd'] <= 2            # one header attempt per worker, then the run stops
        v, _ = _fake_repl(project, tmp_path)
        broken = {**MINIF2F[N], 'header': 'import Broken\n\n'}
        with v: r = v.verify_one(broken, _proof()[1])
        assert r['verdict'] == 'error' and 'header failed' in r['reason'], r

    def test_memory_limit_applies_to_the_repl(self, project, tmp_path):
        v, _ = _fake_repl(project, tmp_path, mem_mb=256)
        with v: r = v.verify_one(*_proof('FAKE:leak'))
        assert r['verdict'] == 'fail' and r['reason'].startswith('memory:'), r
        assert 'INTERNAL PANIC: out of memory' in r['reason'], r

    def test_no_fault_is_ever_a_pass(self, project, tmp_path):
        v, _ = _fake_repl(project, tmp_path, timeout=0.4, workers=2, max_reply=1 << 20, max_uses=4)
        kinds = [''] * 3 + [f'FAKE:{f}' for f in FAULTS] + [f'FAKE:{f}' for f in LEAN_FAILS]
        counter = iter(range(10**6))

        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(st.lists(st.sampled_from(kinds), min_size=1, max_size=5))
        def check(seq):
            pairs = [_proof(k, next(counter)) for k in seq]
            kind_of = {p[1]['sample_idx']: k for p, k in zip(pairs, seq)}
            for r in v.verify_stream(iter(pairs)):
                assert (r['verdict'] == 'pass') == (kind_of[r['sample_idx']] == ''), (kind_of[r['sample_idx']], r)
        with v: check()

    def test_pool_runs_in_parallel(self, project, tmp_path):
        v, _ = _fake_repl(project, tmp_path, workers=2)
        with v:
            list(v.verify_stream(_proof('', i) for i in range(2)))          # start both processes
            t0 = time.perf_counter()
            res = list(v.verify_stream(_proof('FAKE:slow=0.5', 10 + i) for i in range(4)))
            wall = time.perf_counter() - t0
        assert [r['verdict'] for r in res] == ['pass'] * 4 and wall < 1.6

class TestFaultInjectionStreamingAndCache:
    "FAULT-INJECTION: streaming and the verdict cache, with the fake REPL (no Lean)."

    def test_stream_consumes_lazily_and_overlaps(self, project, tmp_path):
        v, _ = _fake_repl(project, tmp_path, workers=2)
        pulled, first_at = [], []
        def gen():
            for i in range(8):
                time.sleep(0.15)         # a sampler producing samples over time
                pulled.append(i)
                yield _proof('FAKE:slow=0.2', i)
        t0 = time.perf_counter()
        with v:
            out = []
            for r in v.verify_stream(gen()):
                if not out: first_at.append(len(pulled))
                out.append(r)
        wall = time.perf_counter() - t0
        assert sorted(r['sample_idx'] for r in out) == list(range(8))
        assert first_at[0] < 8                         # verdicts came out before the generator finished
        assert wall < 8 * 0.15 + 8 * 0.2               # generation and checking overlapped

    def test_stream_window_bounds_the_input_read_ahead(self, project, tmp_path):
        v, _ = _fake_repl(project, tmp_path, workers=1)
        pulled = []
        def gen():
            for i in range(6): pulled.append(i); yield _proof('FAKE:slow=0.2', i)
        with v:
            it = v.verify_stream(gen())
            next(it)
            assert len(pulled) <= 3                    # at most 2 × workers in flight, plus the one just read
            assert len(list(it)) == 5

    def test_cache_makes_a_rerun_free(self, project, tmp_path):
        cache = tmp_path/'cache'
        pairs = [_proof('', 0), _proof('FAKE:error', 1), _proof('FAKE:hang', 2)]
        v, log = _fake_repl(project, tmp_path, timeout=0.5, cache_dir=cache, statement_check=False)
        with v: first = sorted(v.verify_stream(iter(pairs)), key=lambda r: r['sample_idx'])
        assert [r['verdict'] for r in first] == ['pass', 'fail', 'fail']           # the hang: fail, reason timeout
        before = _log(log)
        v, log = _fake_repl(project, tmp_path, timeout=0.5, cache_dir=cache, statement_check=False)
        with v: second = sorted(v.verify_stream(iter(pairs[:2])), key=lambda r: r['sample_idx']); stats = dict(v.stats)
        assert [(r['verdict'], r['reason']) for r in second] == [(r['verdict'], r['reason']) for r in first[:2]]
        # no process was even started
        assert stats == {'lean_runs': 0, 'cache_hits': 2, 'reference_runs': 0, 'replays': 0} and _log(log) == before
        v, log = _fake_repl(project, tmp_path, timeout=0.5, cache_dir=cache, statement_check=False)
        with v: again = v.verify_one(*pairs[2]); stats = dict(v.stats)
        assert again['reason'].startswith('timeout') and stats['lean_runs'] == 1   # a timeout is not cached: retried

    def test_cache_key_covers_policy_and_checker(self, project, tmp_path):
        code = H + S + P
        k = cache_key(MINIF2F[N], code, DEFAULT_POLICY, {'backend': 'repl', 'toolchain': 'v4.9.0-rc1'})
        assert k != cache_key(MINIF2F[N], code, load_policy({'rules': {'native_decide': False}}),
                              {'backend': 'repl', 'toolchain': 'v4.9.0-rc1'})
        assert k != cache_key(MINIF2F[N], code, DEFAULT_POLICY, {'backend': 'repl', 'toolchain': 'v4.10.0'})
        assert k != cache_key(MINIF2F[N], code + ' ', DEFAULT_POLICY, {'backend': 'repl', 'toolchain': 'v4.9.0-rc1'})
        v1, _ = _fake_repl(project, tmp_path)
        (project/'lean-toolchain').write_text('leanprover/lean4:v4.10.0\n')
        v2, _ = _fake_repl(project, tmp_path)
        assert v1.identity != v2.identity

    def test_ei_verify_repl_backend_with_fake(self, project, tmp_path, monkeypatch):
        probs = _write(tmp_path/'p.jsonl', [MINIF2F[N]])
        sams = _write(tmp_path/'s.jsonl', [_proof('', 0)[1], _proof('FAKE:crash', 1)[1], _proof('FAKE:error', 2)[1],
                                           sample(N, 3, 'none'), sample(N, 4, fence(H + S + '  sorry'))])
        args = ['--problems', probs, '--samples', sams, '--out', str(tmp_path/'v.jsonl'), '--workers', '2',
                '--timeout', '5', '--mem-mb', '512']
        import ei_nb.verify as ver
        real = ver.make_verifier   # the CLI has no --repl-cmd: point the REPL command at the fake
        fake = dict(repl_cmd=[sys.executable, FAKE], replay_cmd=[sys.executable, FAKE_REPLAY])
        monkeypatch.setattr(ver, 'make_verifier', lambda *a, **kw: real(*a, **fake, **kw))
        counts = ver.verify_cli(args + ['--backend', 'repl', '--project', str(project)])
        assert counts == {'n': 5, 'pass': 1, 'fail': 2, 'error': 1, 'no_code': 1, 'unchecked': 0}
        assert (tmp_path/'verdict_cache').is_dir()                  # next to the output by default

class TestFaultInjectionLeanBackend:
    "FAULT-INJECTION: the plain `lean` backend against fake_repl.py --lean (no Lean)."

    @pytest.mark.parametrize('directive,verdict,why', [
        ('', 'pass', None), ('FAKE:error', 'fail', 'lean error'), ('FAKE:sorry', 'fail', 'lean sorry'),
        ('FAKE:axiom=sorryAx', 'fail', 'sorryAx'), ('FAKE:hang', 'fail', 'timeout: no answer within 1 s'),
        ('FAKE:crash', 'error', 'crashed'), ('FAKE:garbage', 'error', 'malformed output'),
        ('FAKE:leak', 'fail', 'memory: lean died at the memory limit (exit 1: INTERNAL PANIC: out of memory)'),
        ('FAKE:replerror', 'error', 'malformed output'), ('FAKE:u2028', 'pass', None),
        ('FAKE:sorry428', 'fail', 'lean sorry')])
    def test_lean_backend(self, directive, verdict, why, project, tmp_path):
        v = make_verifier('lean', project=project, timeout=1, mem_mb=256, lean_cmd=[sys.executable, FAKE, '--lean'],
                          replay_cmd=[sys.executable, FAKE_REPLAY])
        with v: r = v.verify_one(*_proof(directive))
        assert r['verdict'] == verdict and (why is None or why in r['reason']), r
        # nothing written into the project (sandboxed: it cannot)
        assert list(project.iterdir()) == [project/'lean-toolchain']

    def test_broken_header_is_an_error(self, project):
        v = make_verifier('lean', project=project, timeout=2, lean_cmd=[sys.executable, FAKE, '--lean'],
                          replay_cmd=[sys.executable, FAKE_REPLAY])
        with v: r = v.verify_one({**MINIF2F[N], 'header': 'import Broken\n\n'}, _proof()[1])
        assert r['verdict'] == 'error' and 'header failed' in r['reason'], r

# ---------------------------------------------------------------- a fake kimina-lean-server on 127.0.0.1
class _Kimina(http.server.BaseHTTPRequestHandler):
    # as kimina-lean-server: `Authorization: Bearer KEY`, an integer `timeout` (else 422), 429 while no REPL is free,
    # and the REPL runs the text after the leading `import`/blank lines (positions count from there)
    mode, hits, keys, busy = 'ok', None, None, 0
    def log_message(self, *a): pass
    def do_POST(self):
        type(self).hits.append(self.server.server_port)
        auth = self.headers.get('Authorization')
        type(self).keys.append(auth.removeprefix('Bearer ') if auth else None)
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        if self.mode == 'http500': self.send_response(500); self.end_headers(); return
        if self.path != '/verify': self.send_response(404); self.end_headers(); return
        if not isinstance(body.get('timeout'), int): self.send_response(422); self.end_headers(); return
        if type(self).busy: type(self).busy -= 1; self.send_response(429); self.end_headers(); return
        results = []
        for c in body['codes']:
            a = fake_repl.action(c['proof'])
            if a == 'hang': time.sleep(3)
            if a == 'garbage' or self.mode == 'garbage': out = b'<html>oops</html>'; break
            if a == 'crash':
                late = f"Lean REPL command timed out in {body['timeout']} seconds"
                results.append({'custom_id': c['custom_id'], 'error': late, 'response': None}); continue
            lines = c['proof'].split('\n')
            lead = next(k for k, l in enumerate(lines) if l.strip() and not l.strip().startswith('import '))
            results.append({'custom_id': c['custom_id'], 'error': None,
                            'response': fake_repl.reply_for('\n'.join(lines[lead:]), 1)})
        else: out = json.dumps({'results': results}).encode()
        self.send_response(200); self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(out)))
        self.end_headers(); self.wfile.write(out)

@contextlib.contextmanager
def kimina(n=2, mode='ok', busy=0):
    handler = type('H', (_Kimina,), {'mode': mode, 'hits': [], 'keys': [], 'busy': busy})
    servers = [http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler) for _ in range(n)]
    for s in servers: threading.Thread(target=s.serve_forever, daemon=True).start()
    try: yield [f'http://127.0.0.1:{s.server_port}' for s in servers], handler
    finally:
        for s in servers: s.shutdown(); s.server_close()

def _dead_url():
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return f'http://127.0.0.1:{s.getsockname()[1]}'

class TestFaultInjectionServer:
    "FAULT-INJECTION: the server backend against a fake kimina-lean-server on 127.0.0.1 (no Lean)."

    def test_round_robin_and_verdicts(self):
        with kimina(2) as (urls, h):
            with make_verifier('server', endpoints=urls, workers=2, timeout=5, api_key='k3y',
                               statement_check=False) as v:
                kinds = ['', 'FAKE:error', 'FAKE:axiom=sorryAx', '', 'FAKE:crash', '']
                res = sorted(v.verify_stream(_proof(d, i) for i, d in enumerate(kinds)),
                             key=lambda r: r['sample_idx'])
        assert [r['verdict'] for r in res] == ['pass', 'fail', 'fail', 'pass', 'fail', 'pass']
        # kimina's timeout: the proof's
        assert res[4]['reason'].startswith('timeout: server: Lean REPL command timed out')
        ports = [int(u.rsplit(':', 1)[1]) for u in urls]
        # 3 proofs and 1 line probe each (issue 27)
        assert sorted(h.hits.count(p) for p in ports) == [4, 4] and set(h.keys) == {'k3y'}

    def test_dead_endpoint_is_skipped_and_all_dead_is_an_error(self):
        with kimina(1) as (urls, h):
            with make_verifier('server', endpoints=[_dead_url(), urls[0]], workers=1, timeout=5) as v:
                assert [v.verify_one(*_proof('', i))['verdict'] for i in range(3)] == ['pass'] * 3
        with make_verifier('server', endpoints=[_dead_url(), _dead_url()], timeout=5) as v:
            r = v.verify_one(*_proof())
        assert r['verdict'] == 'error' and 'all endpoints failed' in r['reason']

    @pytest.mark.parametrize('mode', ['http500', 'garbage'])
    def test_bad_server_answers_are_errors(self, mode):
        with kimina(1, mode) as (urls, h), make_verifier('server', endpoints=urls, timeout=5) as v:
            r = v.verify_one(*_proof())
        assert r['verdict'] == 'error', r

    def test_busy_server_is_retried_with_backoff_then_an_error(self):
        with kimina(1, busy=2) as (urls, h), make_verifier('server', endpoints=urls, timeout=2.5, busy_retries=3,
                                                           statement_check=False) as v:
            v.backend.busy_backoff = 0.05
            r = v.verify_one(*_proof())
        # two 429s, then the line probe and the answer; 2.5 s sent as 3
        assert r['verdict'] == 'pass' and len(h.hits) == 4, r
        with kimina(1, busy=99) as (urls, h), make_verifier('server', endpoints=urls, timeout=2, busy_retries=2,
                                                            statement_check=False) as v:
            v.backend.busy_backoff = 0.05
            r = v.verify_one(*_proof())
        assert r['verdict'] == 'error' and 'HTTP 429' in r['reason'] and len(h.hits) == 3, r

    def test_client_timeout_fails_the_proof(self):
        with kimina(1) as (urls, h), make_verifier('server', endpoints=urls, timeout=0.3, margin=0.2) as v:
            t0 = time.perf_counter(); r = v.verify_one(*_proof('FAKE:hang'))
        assert r['verdict'] == 'fail' and r['reason'].startswith('timeout: server') and time.perf_counter() - t0 < 2.5

def test_server_endpoints_come_from_the_environment_when_not_given(monkeypatch):
    "A stage passes no endpoints: the `server` backend reads EI_LEAN_SERVER_ENDPOINTS (configs/goedel8b_two_node.toml)."
    from ei_nb.verify import make_verifier
    from ei_nb.core import BadInput
    monkeypatch.delenv('EI_LEAN_SERVER_ENDPOINTS', raising=False)
    with pytest.raises(BadInput, match='EI_LEAN_SERVER_ENDPOINTS'): make_verifier('server')
    monkeypatch.setenv('EI_LEAN_SERVER_ENDPOINTS', 'http://127.0.0.1:1, http://127.0.0.1:2')
    v = make_verifier('server')
    try: assert v.backend.endpoints == ['http://127.0.0.1:1', 'http://127.0.0.1:2']
    finally: v.close()

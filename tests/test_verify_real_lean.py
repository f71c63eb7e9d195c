"""REAL-LEAN tests of the verifier (moved from tests/test_verify.py): the real `repl` and `lean` backends, skipped, with
the reason shown, unless `lean` is on PATH and EI_LEAN_PROJECT names a Mathlib project (with `ei setup-lean`'s tools:
the REPL and the kernel replay tool `ei-replay`, found through EI_REPL_BIN / EI_REPLAY_BIN)."""
import os, shutil
import pytest
from ei_nb.verify import make_verifier
from tests.test_verify import FEW_SHOT, H, MINIF2F, N, P, S, fence, few_shot_code, sample

# ---------------------------------------------------------------- real Lean
LEAN_PROJECT = os.environ.get('EI_LEAN_PROJECT')
needs_lean = pytest.mark.skipif(shutil.which('lean') is None or not LEAN_PROJECT,
                                reason='REAL LEAN NOT AVAILABLE: `lean` is not on PATH or EI_LEAN_PROJECT (a Mathlib project) '
                                       'is not set, so the real repl/lean backends are not exercised here')

@needs_lean
class TestRealLean:
    "REAL LEAN: known-good proofs pass and cheats fail through the real backends."

    @pytest.mark.parametrize('backend', ['repl', 'lean'])
    def test_real_backend(self, backend):
        cases = [(MINIF2F[r['name']], sample(r['name'], i, fence(few_shot_code(r)))) for i, r in enumerate(FEW_SHOT[:3])]
        wrong = (MINIF2F[N], sample(N, 99, fence(H + S + '  rfl')))
        with make_verifier(backend, project=LEAN_PROJECT, workers=2, timeout=300) as v:
            res = {r['sample_idx']: r for r in v.verify_stream(iter(cases + [wrong]))}
        assert [res[i]['verdict'] for i in range(3)] == ['pass'] * 3, res
        assert res[99]['verdict'] == 'fail', res[99]

    def test_lean_side_statement_check_catches_notation_the_policy_let_through(self):
        # the pre-check's `syntax` rule is switched off, so only the Lean-side check can see that `+` now means `*`
        prob = {**MINIF2F[N], 'name': 't_plus', 'formal_statement': 'theorem t_plus : (2 : ℕ) + 2 = 4 := by\n'}
        cheat = H + 'local notation:65 a " + " b => (a * b : ℕ)\n' + prob['formal_statement'] + '  norm_num\n'
        honest = H + prob['formal_statement'] + '  norm_num\n'
        off = {'rules': {'syntax': False, 'token': False}}       # issue 36: the allow-list would stop it first too
        with make_verifier('repl', project=LEAN_PROJECT, workers=1, timeout=300, policy=off) as v:
            r_cheat = v.verify_one(prob, sample('t_plus', 0, fence(cheat)))
            r_honest = v.verify_one(prob, sample('t_plus', 1, fence(honest)))
        assert r_honest['verdict'] == 'pass', r_honest
        # issue 36: the replay tool elaborates the reference and compares the type (no probe message decides)
        assert r_cheat['verdict'] == 'fail' and "is not the reference statement's" in r_cheat['reason'], r_cheat

    def test_the_kernel_replay_catches_an_environment_a_metaprogram_forged(self):
        "lean4checker's AddFalse (Lean4CheckerTests/AddFalse.lean, tag v4.9.0) with the pre-check rules that name it switched off."
        prob = {**MINIF2F[N], 'name': 't_false', 'formal_statement': 'theorem t_false : False := by\n'}
        forge = (H + 'open private mk from Lean.Environment\n\nopen Lean in\nelab "add_false" : command => do\n  modifyEnv fun env =>\n'
                 '    let constants := env.constants.insert `false $ ConstantInfo.thmInfo\n'
                 '      { name := `false, levelParams := [], type := .const ``False [], value := .const ``False [] }\n'
                 '    mk env.const2ModIdx constants env.extensions env.extraConstNames env.header\n\nadd_false\n\n'
                 + prob['formal_statement'] + '  exact false\n')
        honest = H + 'theorem t_true : True := by\n  trivial\n'
        policy = {'rules': {'syntax': False, 'open': False, 'toplevel': False, 'token': False, 'metaprogram': False}}
        with make_verifier('repl', project=LEAN_PROJECT, workers=1, timeout=300, policy=policy) as v:
            r = v.verify_one(prob, sample('t_false', 0, fence(forge)))
            ok = v.verify_one({**prob, 'name': 't_true', 'formal_statement': 'theorem t_true : True := by\n'}, sample('t_true', 1, fence(honest)))
        assert ok['verdict'] == 'pass', ok                                            # an honest proof survives the replay
        assert r['verdict'] == 'fail' and r['reason'].startswith('replay:'), r        # the REPL's own answers passed it

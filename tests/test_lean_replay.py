"""The kernel replay of what a passing proof added (issue 28 part 3; `ei_nb.lean_replay`, `ei_nb.verifier`).

FAULT-INJECTION and PROTOCOL tests through the recorded-protocol stand-ins, which run NO Lean and check no proof:
`tests/fake_repl.py` answers `{"pickleTo": PATH, "env": N}` like the REPL at v4.9.0-rc1 (REPL/Main.lean
`pickleCommandSnapshot`, REPL/Snapshots.lean `CommandSnapshot.pickle`: `{"env": N}`, a file of the imports and
`constants.map₂`) with a JSON stand-in of that file, and `tests/fake_replay.py` replays it with the algorithm of
core's `Environment.replay` as lean4checker uses it (leanprover/lean4checker tag v4.9.0 = b3178065, `Main.lean`,
`Lean4CheckerTests/AddFalse.lean`, `AddFalseConstructor.lean`, `ReduceBool.lean`, `test.sh`) and SafeVerify's
`tests/replaceAxiom` (GasStationManager/SafeVerify, branch minif2f-deepseek-check 0c0f7dcf). What they show: the
protocol, the decisions and the failure handling. What only a run against real Lean 4.9 can show: that
`ei_nb/lean/EiReplay.lean` compiles and that the kernel rejects what these stand-ins say it rejects.
"""
import json, os, sys, time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ei_nb.cli import main as ei_main
from ei_nb.core import StageFailed, check_record, write_records
from ei_nb.lean_replay import ReplayError, ReplayPool, header_imports, replay_verdict
from ei_nb.verify import make_verifier
from tests.test_verify import FAKE, FAKE_REPLAY, H, MINIF2F, N, S, _proof, fence, sample
PROB = MINIF2F[N]

FORGED = {   # directive -> what the replay must say (lean4checker's and SafeVerify's tests, and the unchecked addDecl)
    'FAKE:addfalse': "(kernel) declaration type mismatch, 'false' has type",
    # issue 36: a constructor or an axiom among the added constants is refused by the kernel-bug guard before any
    # replay (EiReplay.lean `guard`: only theorems and definitions); without the guard the replay said
    # "(kernel) unknown constant 'False.intro'", "No such constructor False.intro", "... uses cheat"
    'FAKE:addctor': 'kernel-bug guard: False.intro declares an inductive type, constructor',
    'FAKE:lonector': 'kernel-bug guard: False.intro declares an inductive type, constructor',
    'FAKE:replaceaxiom': '(kernel) declaration type mismatch',
    'FAKE:skipkernel': '(kernel) declaration type mismatch',
    'FAKE:nativedecide': "(kernel) unknown declaration 'foo'",
    'FAKE:unsafehelper': "(kernel) unknown constant 'helper_unsafe'",
    'FAKE:notadded': 'is not among the declarations the proof added',
    'FAKE:otherimports': "the proof's environment imports",
    'FAKE:hideaxiom': 'kernel-bug guard: cheat declares an inductive type',
    'FAKE:replaytype': "the replayed type of mathd_algebra_182 is not the reference statement's",
}

@pytest.fixture
def project(tmp_path):
    (tmp_path/'lean-toolchain').write_text('leanprover/lean4:v4.9.0-rc1\n')
    return tmp_path

def verifier(project, tmp_path, backend='repl', replay=(sys.executable, FAKE_REPLAY), **kw):
    log = tmp_path/'replay.log'
    cmd = {'repl_cmd': [sys.executable, FAKE, '--log', str(tmp_path/'repl.log')]} if backend == 'repl' else {'lean_cmd': [sys.executable, FAKE, '--lean']}
    kw.setdefault('mem_mb', None)
    rep = {'replay_cmd': [*replay, '--log', str(log)] if 'fake_replay' in replay[-1] else list(replay)} if replay else {'replay': False}
    kw.setdefault('sandbox', False)   # the fakes' --log files are on the host (the sandbox: tests/test_sandbox.py)
    return make_verifier(backend, project=project, timeout=kw.pop('timeout', 5), workers=kw.pop('workers', 1), **rep, **cmd, **kw), log

def lines(log, what): return log.read_text().split().count(what) if log.exists() else 0


# (an id `lean` would mark it as needing Lean)
@pytest.mark.parametrize('backend', ['repl', 'lean'], ids=['repl', 'plain-lean'])
def test_an_honest_proof_passes_the_replay(backend, project, tmp_path):
    v, log = verifier(project, tmp_path, backend)
    with v:
        res = [v.verify_one(*_proof('', i)) for i in range(3)]
        assert v.stats['replays'] == 3 and v.identity['replay']['replay'] == 'ei-replay'
        pickles = v._pickles
    assert [r['verdict'] for r in res] == ['pass'] * 3, res
    for r in res: check_record(r, 'verdict')
    # the header's modules imported once
    assert (lines(log, 'start'), lines(log, 'import'), lines(log, 'replay')) == (1, 1, 3)
    # the files of what proofs added: removed
    assert pickles is not None and not pickles.exists()

@pytest.mark.parametrize('directive', sorted(FORGED))
# (an id `lean` would mark it as needing Lean)
@pytest.mark.parametrize('backend', ['repl', 'lean'], ids=['repl', 'plain-lean'])
def test_a_forged_environment_fails_the_replay(directive, backend, project, tmp_path):
    "The REPL's (or lean's) own answers are a clean pass: only the replay sees the forgery."
    v, _ = verifier(project, tmp_path, backend)
    with v: r = v.verify_one(*_proof(directive))
    assert r['verdict'] == 'fail' and r['reason'].startswith('replay:') and FORGED[directive] in r['reason'], r
    v, _ = verifier(project, tmp_path, backend, replay=None)
    with v: unreplayed = v.verify_one(*_proof(directive))
    # without the replay it passed
    if directive not in ('FAKE:replaytype',): assert unreplayed['verdict'] == 'pass', unreplayed

def test_the_replay_can_be_switched_off_and_the_cache_key_says_so(project, tmp_path):
    on, _ = verifier(project, tmp_path)
    off = make_verifier('repl', project=project, repl_cmd=[sys.executable, FAKE], replay=False, mem_mb=None)
    with on, off:
        assert 'replay' in on.identity and 'replay' not in off.identity
        assert off.verify_one(*_proof('FAKE:addfalse'))['verdict'] == 'pass'

@pytest.mark.parametrize('directive,why', [('FAKE:replaycrash', 'crashed'), ('FAKE:replaygarbage', 'malformed reply'),
                                           ('FAKE:replayerror', 'unknown package Evil')])
def test_a_crashing_or_confused_replay_tool_stops_the_run(directive, why, project, tmp_path):
    v, _ = verifier(project, tmp_path)
    with v, pytest.raises(StageFailed, match=why): v.verify_one(*_proof(directive))

def test_a_missing_replay_tool_stops_the_run(project, tmp_path):
    v, _ = verifier(project, tmp_path, replay=(str(tmp_path/'no-such-ei-replay'),))
    with v, pytest.raises(StageFailed, match='cannot start the replay tool'): v.verify_one(*_proof())
    # under the memory limit's launcher
    v, _ = verifier(project, tmp_path, replay=('lake', 'env', str(tmp_path/'no-such-ei-replay')), mem_mb=256)
    with v, pytest.raises(StageFailed, match='replay tool'): v.verify_one(*_proof())

def test_a_hung_replay_is_an_error_verdict_and_no_pickle_is_an_error(project, tmp_path):
    v, _ = verifier(project, tmp_path, timeout=1)
    v.replay.first_timeout = 1
    with v:
        hung, nopickle = v.verify_one(*_proof('FAKE:replayhang', 0)), v.verify_one(*_proof('FAKE:nopickle', 1))
        after = v.verify_one(*_proof('', 2))
    assert hung['verdict'] == 'error' and 'replay: no answer within 1 s' in hung['reason'], hung
    assert nopickle['verdict'] == 'error' and 'wrote no file' in nopickle['reason'], nopickle
    assert after['verdict'] == 'pass'                                              # the tool process was replaced

def test_ei_verify_exits_3_when_the_replay_tool_is_missing(project, tmp_path, capsys):
    write_records(tmp_path/'p.jsonl', [PROB], 'problem')
    write_records(tmp_path/'s.jsonl', [sample(N, 0, fence(H + S + '  ring'))], 'sample')
    base = ['verify', '--problems', str(tmp_path/'p.jsonl'), '--samples', str(tmp_path/'s.jsonl'), '--backend', 'repl',
            '--project', str(project), '--workers', '1', '--mem-mb', '0', '--repl-cmd', f'{sys.executable} {FAKE}']
    rc = ei_main(base + ['--out', str(tmp_path/'v.jsonl'), '--replay-cmd', str(tmp_path/'missing')])
    assert rc == 3 and 'cannot start the replay tool' in capsys.readouterr().err and not (tmp_path/'v.jsonl').exists()
    assert ei_main(base + ['--out', str(tmp_path/'v.jsonl'), '--replay-cmd', f'{sys.executable} {FAKE_REPLAY}']) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])['pass'] == 1
    assert ei_main(base + ['--out', str(tmp_path/'w.jsonl'), '--no-replay', '--cache-dir', str(tmp_path/'c2')]) == 0

def test_backends_that_cannot_replay_and_policies_that_forbid_it_say_so(project, tmp_path, capsys):
    from tests.test_verify import kimina
    with kimina(1) as (urls, _), make_verifier('server', endpoints=urls, timeout=5) as v:
        assert v.replay is None and v.verify_one(*_proof())['verdict'] == 'pass'
    assert 'passes are NOT replayed' in capsys.readouterr().err
    v, _ = verifier(project, tmp_path, policy={'rules': {'native_decide': False}})
    with v: assert v.replay is None
    assert 'native_decide is allowed' in capsys.readouterr().err

def test_the_replay_answer_is_checked_against_the_protocol():
    ok = {'ok': True, 'replayed': 2, 'axioms': ['propext'], 'type': 'T', 'statement': 'same', 'reference_type': 'T'}
    assert replay_verdict(ok, 't') == ('pass', None)
    assert replay_verdict({**ok, 'axioms': ['sorryAx']}, 't')[0] == 'fail'
    for other in ('differs', 'unchecked'): assert replay_verdict({**ok, 'statement': other}, 't')[0] == 'fail'
    assert replay_verdict({'ok': False, 'reason': '(kernel) x'}, 't')[1].startswith('replay: the kernel replay rejects')
    from ei_nb.lean_replay import _checked
    assert _checked(ok, ['ei-replay']) == ok
    for bad in ({'ok': True}, {'ok': 'yes'}, {}, {'ok': False}, {'error': 'boom'},
                {k: v for k, v in ok.items() if k != 'statement'}, {**ok, 'statement': 'probably'},
                {**ok, 'statement': 'no_reference'}):
        with pytest.raises(ReplayError): _checked(bad, ['ei-replay'])
    assert header_imports(H) == ('Init', 'Mathlib', 'Aesop')

def test_no_replay_fault_or_forgery_is_ever_a_pass(project, tmp_path):
    v, _ = verifier(project, tmp_path, timeout=1, workers=2)
    v.replay.first_timeout = 1
    kinds = [''] * 3 + sorted(FORGED) + ['FAKE:replayhang', 'FAKE:nopickle']
    counter = iter(range(10**6))

    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(st.sampled_from(kinds), min_size=1, max_size=4))
    def run(seq):
        pairs = [_proof(k, next(counter)) for k in seq]
        kind_of = {p[1]['sample_idx']: k for p, k in zip(pairs, seq)}
        for r in v.verify_stream(iter(pairs)):
            assert (r['verdict'] == 'pass') == (kind_of[r['sample_idx']] == ''), (kind_of[r['sample_idx']], r)
    with v: run()

def test_replay_cost_per_proof_on_the_stand_ins(project, tmp_path):
    "The overhead the replay adds per passing proof (pickle + one request), on the stand-ins: measured, bounded loosely."
    walls = {}
    for on in (False, True):
        v, _ = verifier(project, tmp_path, replay=(sys.executable, FAKE_REPLAY) if on else None, statement_check=False)
        with v:
            v.verify_one(*_proof('', 0))                           # start the processes
            t0 = time.perf_counter()
            assert all(v.verify_one(*_proof('', i))['verdict'] == 'pass' for i in range(1, 21))
            walls[on] = (time.perf_counter() - t0) / 20
    print(f'per proof: {1000*walls[False]:.1f} ms without the replay, {1000*walls[True]:.1f} ms with it (stand-ins)')
    assert walls[True] - walls[False] < 0.5


# ---------------------------------------------------------------- issue 36, point 2: the verdict from the kernel alone
def test_the_statement_is_compared_by_the_replay_tool_even_without_the_probe(project, tmp_path):
    """Issue 36: the statement's type is compared in the replay tool's own process, with the reference statement it
    elaborates from the header's imports; before, without `statement_check` a retyped theorem passed the replay (the
    reference type came from the statement probe's logged text, a message the candidate can write)."""
    for check in (False, True):
        v, _ = verifier(project, tmp_path, statement_check=check)
        with v:
            r = v.verify_one(*_proof('FAKE:retype'))
            honest = v.verify_one(*_proof('', 1))
            runs = v.stats['reference_runs']
        assert r['verdict'] == 'fail', r
        assert "is not the reference statement's elaborated by the tool (differs)" in r['reason'], r
        assert honest['verdict'] == 'pass' and 'unreplayed' not in honest, honest
        assert runs == 0              # no Lean run of the reference probe: the tool elaborates the reference itself

def test_a_pass_that_is_not_replayed_says_so(project, tmp_path):
    "Without the replay (the `server` back-end cannot hand over an environment) a pass is marked `unreplayed`."
    v, _ = verifier(project, tmp_path, replay=None)
    with v: r = v.verify_one(*_proof(''))
    assert r['verdict'] == 'pass' and r['unreplayed'] is True, r
    check_record(r, 'verdict')

def _standin(tmp_path, also=(), **extra):
    "A pickle stand-in whose theorem carries the kernel-bug shape `extra` (the fake tool's guard fields), with `also`."
    typ = '(fake) : True'
    thm = {'name': 't', 'kind': 'thm', 'type': typ, 'value_type': typ, 'uses': ['propext'], **extra}
    path = tmp_path/f'{len(list(tmp_path.iterdir()))}.olean'
    path.write_text(json.dumps({'imports': ['Init', 'Mathlib'], 'constants': [thm, *also]}))
    return path

@pytest.mark.parametrize('shape,reason', [
    ({'nat_pow': ['c', 2]}, 'lean4#8060'),                  # Nat.pow reduced on a constant read as a literal
    ({'nat_pow': [1, 2 ** 31]}, '#15022'),                  # mpz::pow's exponent overflow: the kernel hangs
    ({'fvar': True}, 'lean4#14484'),                        # an fvar in a value (the opaque of lean4#14498)
    ({'proj': 'W'}, 'lean4#14576'),                         # a projection whose structure does not match
    ({'also': [{'name': 'P', 'kind': 'induct', 'type': 'Prop', 'ctors': []}]}, 'P declares an inductive type'),
    # ^ lean4#14613, #14806/#14807: the proofs of False declare their own inductive types
])
def test_the_kernel_bug_guards_refuse_the_buggy_paths(shape, reason, tmp_path):
    """Issue 36 point 4: each guard of EiReplay.lean (as the stand-in models it) refuses its exploit shape before the
    kernel of v4.9.0-rc1 sees it; the same theorem without the shape passes."""
    from ei_nb.lean_replay import reference_command
    ref = reference_command({'header': H, 'formal_statement': 'theorem t : True := by\n'})
    pool = ReplayPool([sys.executable, FAKE_REPLAY])
    try:
        good = pool.check(_standin(tmp_path, nat_pow=[2, 10], proj='Prod'), 't', ('Init', 'Mathlib'), 10, reference=ref)
        bad = pool.check(_standin(tmp_path, **shape), 't', ('Init', 'Mathlib'), 10, reference=ref)
    finally: pool.close()
    assert replay_verdict(good, 't') == ('pass', None), good
    verdict, why = replay_verdict(bad, 't')
    assert verdict == 'fail' and 'kernel-bug guard' in why and reason in why, why


def test_ei_eval_refuses_unreplayed_server_passes_unless_told(tiny_model_dir, tmp_path, monkeypatch):
    """Issue 36: the `server` back-end (kimina) cannot hand over an environment, so its passes are `unreplayed`;
    `ei eval` refuses to score them (exit 3) unless `--allow-unreplayed`, and then its numbers say so."""
    from ei_nb.eval import eval_cli
    from tests.test_verifier_guard import _eval_args, _valid, checker
    p = tmp_path/'completions.jsonl'
    p.write_text(json.dumps({'text': '\n  norm_num\n```'}) + '\n')
    monkeypatch.setenv('FAKE_VLLM_COMPLETIONS', str(p))
    monkeypatch.setenv('FAKE_VLLM_LOG', str(tmp_path/'vllm.jsonl'))
    write_records(tmp_path/'problems.jsonl', _valid(4), 'problem')
    with checker('ok') as (url, _):
        args = _eval_args(tmp_path/'problems.jsonl', tiny_model_dir, tmp_path/'eval', url)
        with pytest.raises(StageFailed, match='4 pass.es. were not replayed by the kernel'): eval_cli(args)
        r = eval_cli(args + ['--allow-unreplayed'])
    assert r['solved'] == 4 and r['unreplayed_passes'] == 4 and r['allow_unreplayed'] is True
    stage = json.loads((tmp_path/'eval'/'stage.json').read_text())
    # the trail says it
    assert stage['detail']['unreplayed_passes'] == 4 and stage['detail']['allow_unreplayed'] is True

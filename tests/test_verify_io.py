"""REPL I/O (`ei_nb.lean_backends`), protocol fidelity and the back-end registry of `ei_nb.verify` (FAULT-INJECTION: no
Lean runs here).

- the fake REPL writes replies byte-for-byte in the format of the real REPL's recordings (v4.9.0-rc1);
- a C program that prints with `printf` and never flushes (what the v4.9.0-rc1 REPL is) is read through a pipe (no
  reply: the header stalls, named as such), a pty and `stdbuf -oL` (replies arrive);
- `ei verify` with a REPL that never answers the header exits 3 naming the cause, fast, and keeps the verdicts already
  decided, so a rerun resumes;
- `VerifierSettings` and the registry.
"""
import glob, json, os, shlex, shutil, subprocess, sys, time
from pathlib import Path

import pytest

from ei_nb.cli import main as ei_main
from ei_nb.core import BadInput, StageFailed, read_verdicts, write_records
from ei_nb.lean_reply import HeaderStall, LeanError
from ei_nb.lean_backends import Repl
from ei_nb.verify import VerifierSettings, make_verifier, register_backend, verify_cli
from tests import fake_repl
from tests.test_verify import FAKE, FAKE_REPLAY, H, MINIF2F, N, P, S, _proof, fence, sample

REC = Path(__file__).with_name('data')/'repl_v4.9.0-rc1'

def test_fake_replies_match_the_real_recordings():
    blocks = [(f, b) for f in sorted(REC.glob('*.expected.out')) for b in f.read_text().split('\n\n') if b.strip()]
    assert len(blocks) >= 10
    for f, b in blocks: assert fake_repl.pretty(json.loads(b)) == b.strip('\n'), f.name

def test_fake_answers_a_recorded_session_like_the_real_repl():
    # unknown_environment.in: a command naming an env that does not exist
    out = subprocess.run([sys.executable, FAKE], input=(REC/'unknown_environment.in').read_text(), capture_output=True,
                         text=True)
    assert out.stdout == (REC/'unknown_environment.expected.out').read_text()

def test_malformed_json_is_an_uncaught_exception_and_exit_1():
    out = subprocess.run([sys.executable, FAKE], input='{"cmd": "def f := 1"}\n\n{"cmd": oops\n\n{"cmd": "x"}\n\n',
                         capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == '{"env": 0}\n\n'
    assert out.stderr.startswith('uncaught exception: {"message": "Could not parse as a valid JSON command')

def test_repl_client_survives_the_fake_exiting_on_malformed_reply_input(tmp_path):
    r = Repl([sys.executable, FAKE], stdout_mode='pipe')
    with pytest.raises(LeanError, match='crashed'):
        r.start(); r.proc.stdin.write(b'{"cmd": oops\n\n'); r.proc.stdin.flush(); r.send({'cmd': 'x', 'env': 0}, 5)
    r.close(final=True)

# ---------------------------------------------------------------- no-flush: a C stand-in and the fake
NOFLUSH_C = r'''
#include <stdio.h>
#include <string.h>
int main(void) {   /* answers every blank-line-terminated command with {"env": N} (N counting up from 0) and a
                      `#print "TEXT"` with TEXT as an info message, as the REPL does; printf only, never fflush */
    char line[65536], text[256] = ""; int n = 0, inblock = 0;
    while (fgets(line, sizeof line, stdin)) {
        char *p = strstr(line, "#print \\\""), *q = p ? strstr(p + 9, "\\\"") : 0;
        if (q && q - p - 9 < 255) { memcpy(text, p + 9, q - p - 9); text[q - p - 9] = 0; }
        if (strcmp(line, "\n") != 0) { inblock = 1; continue; }
        if (!inblock) continue;
        if (text[0]) printf("{\"messages\": [{\"severity\": \"info\", \"data\": \"%s\"}], \"env\": %d}\n\n", text, n++);
        else printf("{\"env\": %d}\n\n", n++);
        inblock = 0; text[0] = 0;
    }
    return 0;
}
'''

@pytest.fixture(scope='module')
def noflush_bin(tmp_path_factory):
    cc = shutil.which('cc') or shutil.which('gcc')
    if cc is None: pytest.skip('no C compiler (cc): the no-flush C stand-in cannot be built')
    d = tmp_path_factory.mktemp('noflush')
    (d/'noflush.c').write_text(NOFLUSH_C)
    subprocess.run([cc, '-O0', '-o', str(d/'noflush'), str(d/'noflush.c')], check=True)
    return str(d/'noflush')

@pytest.mark.parametrize('mode,answers', [('pipe', False), ('pty', True), ('stdbuf', True)])
def test_c_stdio_program_that_never_flushes(noflush_bin, mode, answers):
    if mode == 'stdbuf' and shutil.which('stdbuf') is None: pytest.skip('stdbuf (coreutils) is not installed')
    r = Repl([noflush_bin], stdout_mode=mode)
    try:
        if answers:
            assert r.run('import Mathlib', 'theorem t : True := trivial', 5, 5) == {'env': 1}
        else:
            t0 = time.perf_counter()
            with pytest.raises(HeaderStall, match='4fc1e6d'): r.run('import Mathlib', 'x', 5, 0.5)
            assert time.perf_counter() - t0 < 3
    finally: r.close(final=True)

@pytest.mark.parametrize('mode,passes', [('pipe', False), ('pty', True), ('stdbuf', True)])
def test_fake_in_no_flush_mode(mode, passes, tmp_path):
    if mode == 'stdbuf' and shutil.which('stdbuf') is None: pytest.skip('stdbuf (coreutils) is not installed')
    (tmp_path/'lean-toolchain').write_text('leanprover/lean4:v4.9.0-rc1\n')
    with make_verifier('repl', project=tmp_path, workers=1, timeout=5, header_timeout=1, mem_mb=None, stdout_mode=mode,
                       repl_cmd=[sys.executable, FAKE, '--no-flush'], replay_cmd=[sys.executable, FAKE_REPLAY]) as v:
        if passes: assert v.verify_one(*_proof())['verdict'] == 'pass'
        else:
            with pytest.raises(StageFailed, match='avoid buffering stdout'): v.verify_one(*_proof())

def test_ei_verify_header_stall_exits_3_fast_and_a_rerun_resumes(tmp_path, capsys):
    proj = tmp_path/'proj'; proj.mkdir(); (proj/'lean-toolchain').write_text('x\n')
    prob = MINIF2F[N]
    write_records(tmp_path/'p.jsonl', [prob], 'problem')
    write_records(tmp_path/'s1.jsonl', [sample(N, 0, fence(H + S + P))], 'sample')
    base = ['--problems', str(tmp_path/'p.jsonl'), '--backend', 'repl', '--project', str(proj), '--workers', '1',
            '--cache-dir', str(tmp_path/'cache'), '--header-timeout', '1', '--mem-mb', '0']
    good = ['--repl-cmd', shlex.join([sys.executable, FAKE]), '--replay-cmd', shlex.join([sys.executable, FAKE_REPLAY])]
    first = verify_cli(base + good + ['--samples', str(tmp_path/'s1.jsonl'), '--out', str(tmp_path/'v1.jsonl')])
    assert first['pass'] == 1
    write_records(tmp_path/'s2.jsonl', [sample(N, 0, fence(H + S + P)), sample(N, 1, fence(H + S + '  simp\n  ring'))],
                  'sample')
    stalled = ['--repl-cmd', shlex.join([sys.executable, FAKE, '--no-flush']), '--stdout-mode', 'pipe']
    t0 = time.perf_counter()
    rc = ei_main(['verify'] + base + stalled + ['--samples', str(tmp_path/'s2.jsonl'),
                                                '--out', str(tmp_path/'v2.jsonl')])
    err = capsys.readouterr().err
    assert rc == 3 and '4fc1e6d' in err and time.perf_counter() - t0 < 30, err
    assert not (tmp_path/'v2.jsonl').exists()
    res = verify_cli(base + good + ['--samples', str(tmp_path/'s2.jsonl'), '--out', str(tmp_path/'v2.jsonl')])
    assert res['pass'] == 2

# ---------------------------------------------------------------- settings and registry
def test_settings_round_trip_and_refuse_unknown_keys():
    s = VerifierSettings(backend='repl', project='/p', workers=3, header_timeout=9)
    assert VerifierSettings.from_dict(s.to_dict()) == s
    with pytest.raises(BadInput, match="unknown setting 'workerz'"): VerifierSettings.from_dict({'workerz': 2})

def test_registry_plugin_by_name_and_by_import_string(tmp_path):
    class Echo:
        identity = {'backend': 'echo'}
        def run(self, header, code, timeout):
            # Lean prints the name it resolved
            name = code.rsplit('#print axioms ', 1)[1].strip().removeprefix('_root_.')
            return {'env': 1, 'messages': [{'severity': 'info', 'pos': {'line': code.count('\n'), 'column': 0},
                                             'data': f"'{name}' depends on axioms: [propext]"}]}
        def close(self): pass
    register_backend('echo', lambda s: Echo())
    # no `pickles`: not replayed
    with make_verifier('echo', statement_check=False) as v: assert v.verify_one(*_proof())['verdict'] == 'pass'
    with make_verifier(VerifierSettings(backend='ei_nb.verify:_server_backend', endpoints=['http://127.0.0.1:1'])) as v:
        assert type(v.backend).__name__ == 'ServerBackend'
    with pytest.raises(BadInput, match="unknown backend 'nope'.*'echo'"): make_verifier('nope')
    with pytest.raises(BadInput, match='cannot import'): make_verifier('no_such_pkg.mod:f')

def test_known_backend_is_the_known_proof_verifier(tmp_path):
    from ei_nb.demo import known_good_proofs
    from ei_nb.known_proofs import KnownProofVerifier
    write_records(tmp_path/'known.jsonl', known_good_proofs())
    with make_verifier('known', known_proofs=str(tmp_path/'known.jsonl')) as v:
        assert isinstance(v, KnownProofVerifier)               # registered by name, like every built-in back-end
        r = v.verify_one(*_proof())
    assert r['verdict'] in ('pass', 'unchecked') and 'demo, no Lean ran' in r['reason']

def test_verify_module_does_not_import_demo():
    out = subprocess.run([sys.executable, '-c', 'import sys, ei_nb.verify; print("ei_nb.demo" in sys.modules)'],
                         capture_output=True, text=True, env={**os.environ})
    assert out.stdout.strip() == 'False', out.stderr

# ------------------------------------------------------- extraction: the fast scanner = the former regular expression
import re
from hypothesis import given, settings, strategies as st
from ei_nb.policy import extract_code

_OLD_FENCE = re.compile(r'^[ \t]*```[ \t]*(lean4|lean)[ \t]*\r?\n(.*?)^[ \t]*```[ \t]*\r?$', re.M | re.S | re.I)

def _old_extract(completion):
    blocks = _OLD_FENCE.findall(completion)
    for tag in ('lean4', 'lean'):
        found = [code for t, code in blocks if t.lower() == tag]
        if found: return found[-1]
    return None

@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from(['```', '```lean4', '```Lean', '```lean', '```python', ' ', '\t', '\n', '\r\n', 'x',
                                 'theorem t', '``', '`', 'lean4']), max_size=30).map(''.join))
def test_extract_code_equals_the_former_regex(text):
    assert extract_code(text) == _old_extract(text)

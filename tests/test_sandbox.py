"""Issue 36, point 1: every Lean process runs in the bubblewrap sandbox (`ei_nb.sandbox`).

The stand-in is `tests/fake_repl.py`, which speaks the REPL's real protocol and executes the line `-- RUN: CODE` of a
proof (Python) while it "elaborates" it: a literal model of code a proof runs inside Lean (`#eval`, `run_tac`,
`eval%`, …), with the rights of the process that checks it. Each attack goes through the real
`ei verify --backend repl` (and `lean`) path with default settings, and each assertion is made twice: with the
default settings the attack is contained, with `--unsandboxed` it gets out (so the assertion is one that can fail).
Where bwrap is missing the tests fail when CI is set (tests/run.sh installs bubblewrap there) and are skipped, saying
why, elsewhere."""
import json, os, socket, sys, threading, time, uuid
from pathlib import Path

import pytest

from ei_nb.cli import main
from ei_nb.core import read_verdicts, shared_data, write_records
from ei_nb.sandbox import bwrap_command, bwrap_executable, sandbox_check

ROOT = Path(__file__).resolve().parent.parent
FAKE, FAKE_REPLAY = ROOT/'tests'/'fake_repl.py', ROOT/'tests'/'fake_replay.py'
PROB = next(p for p in map(json.loads, open(shared_data('minif2f_dsp15.jsonl'), encoding='utf-8'))
            if p['name'] == 'mathd_algebra_182')

if not bwrap_executable() or sandbox_check()['status'] != 'OK':
    why = f"no working sandbox here: {sandbox_check()['detail']}"
    if os.environ.get('CI'):
        raise RuntimeError(f'{why}: CI must run the sandbox tests (tests/run.sh installs bubblewrap)')
    pytest.skip(why, allow_module_level=True)


def _verify(tmp_path, payloads, *extra, backend='repl'):
    "`ei verify` over one proof per payload (a `-- RUN:` line in a proof that Lean would accept); its rc and verdicts."
    proj = tmp_path/'project'; proj.mkdir(exist_ok=True)
    (proj/'lean-toolchain').write_text('leanprover/lean4:v4.9.0-rc1\n')
    write_records(tmp_path/'p.jsonl', [PROB], 'problem')
    body = PROB['header'] + PROB['formal_statement'] + '  ring\n'
    samples = [{'name': PROB['name'], 'sample_idx': i, 'round': 0, 'n_tokens': 1, 'capped': False,
                'completion': f'```lean4\n{body}  -- RUN: {code}\n```'} for i, code in enumerate(payloads)]
    write_records(tmp_path/'s.jsonl', samples, 'sample')
    out = tmp_path/f'v_{uuid.uuid4().hex[:6]}.jsonl'
    cmd = ['--lean-cmd', f'{sys.executable} {FAKE} --lean'] if backend == 'lean' else \
          ['--repl-cmd', f'{sys.executable} {FAKE}']
    rc = main(['verify', '--problems', str(tmp_path/'p.jsonl'), '--samples', str(tmp_path/'s.jsonl'), '--out', str(out),
               '--backend', backend, '--project', str(proj), '--workers', '1', '--timeout', '10', *cmd,
               '--replay-cmd', f'{sys.executable} {FAKE_REPLAY}', '--cache-dir', str(tmp_path/f'cache_{out.stem}'),
               *extra])
    return rc, (read_verdicts(out) if out.exists() else None), proj


MODES = [pytest.param([], True, id='sandboxed'), pytest.param(['--unsandboxed'], False, id='unsandboxed')]


@pytest.mark.parametrize('backend', ['repl', 'lean'])
@pytest.mark.parametrize('extra,contained', MODES)
def test_writes_to_host_tmp_and_to_the_project_do_not_land(tmp_path, extra, contained, backend):
    mark = Path('/tmp')/f'ei-sandbox-test-{uuid.uuid4().hex}'
    proj = tmp_path/'project'
    try:
        rc, verdicts, _ = _verify(tmp_path, [f"open({str(mark)!r}, 'w').write('x')",
                                             f"open({str(proj/'Mathlib.olean')!r}, 'w').write('poison')"], *extra,
                                  backend=backend)
        assert rc == 0 and [v['verdict'] for v in verdicts] == ['pass', 'pass'], verdicts
        assert mark.exists() is not contained                       # the host's /tmp
        assert (proj/'Mathlib.olean').exists() is not contained     # the Lean project, where Mathlib's oleans live
    finally: mark.unlink(missing_ok=True)


@pytest.mark.parametrize('extra,contained', MODES)
def test_no_tcp_connection_to_the_host_loopback_and_no_secret(tmp_path, monkeypatch, extra, contained):
    monkeypatch.setenv('EI_TEST_SECRET', 'hunter2')                 # in the verifier's environment
    got = []
    with socket.socket() as srv:
        srv.bind(('127.0.0.1', 0)); srv.listen(); srv.settimeout(0.2)
        port, stop = srv.getsockname()[1], threading.Event()
        def serve():
            while not stop.is_set():
                try: c, _ = srv.accept()
                except OSError: continue
                with c: c.settimeout(2); got.append(c.recv(100))
        t = threading.Thread(target=serve, daemon=True); t.start()
        send = (f"import socket; s = socket.create_connection(('127.0.0.1', {port}), 2); "
                "s.sendall(os.environ.get('EI_TEST_SECRET', 'no secret').encode()); s.close()")
        leak = "os.environ.get('EI_TEST_SECRET') and os._exit(42)"     # the secret, seen, ends the process: exit 42
        rc, verdicts, _ = _verify(tmp_path, [send, leak], *extra)
        time.sleep(0.3); stop.set(); t.join()
    assert rc == 0 and verdicts[0]['verdict'] == 'pass', verdicts
    assert (got == []) is contained, got                             # no connection to the host's 127.0.0.1
    if not contained: assert got == [b'hunter2']
    assert (verdicts[1]['verdict'] == 'pass') is contained, verdicts[1]   # the secret is not in the sandbox's env
    if not contained: assert verdicts[1]['verdict'] == 'error' and 'exit 42' in verdicts[1]['reason']


def _alive(token):
    "PIDs of processes whose command line holds `token`."
    out = []
    for d in Path('/proc').iterdir():
        try:
            if d.name.isdigit() and token.encode() in (d/'cmdline').read_bytes(): out.append(int(d.name))
        except OSError: pass
    return out


@pytest.mark.parametrize('extra,contained', MODES)
def test_a_background_process_does_not_outlive_the_check(tmp_path, extra, contained):
    token = f'ei-bg-{uuid.uuid4().hex}'
    # a new session: out of the REPL's process group, so the process-group kill alone does not reach it
    spawn = (f"import subprocess; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}], "
             "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)")
    try:
        rc, verdicts, _ = _verify(tmp_path, [spawn], *extra)
        assert rc == 0 and verdicts[0]['verdict'] == 'pass', verdicts
        deadline = time.monotonic() + 5
        while _alive(token) and contained and time.monotonic() < deadline: time.sleep(0.1)
        assert (not _alive(token)) is contained, _alive(token)
    finally:
        for pid in _alive(token):
            try: os.kill(pid, 9)
            except OSError: pass


def test_a_run_refuses_to_start_without_a_working_sandbox(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv('EI_BWRAP', str(tmp_path/'no-bwrap'))
    import ei_nb.sandbox as sb
    monkeypatch.setattr(sb, '_WORKS', set())
    rc, verdicts, _ = _verify(tmp_path, ['pass'])
    err = capsys.readouterr().err
    assert rc == 3 and verdicts is None, err[-800:]
    assert 'no working sandbox' in err and 'apt-get install bubblewrap' in err, err[-800:]
    rc, verdicts, _ = _verify(tmp_path, ['pass'], '--unsandboxed')   # told so, it runs
    assert rc == 0 and verdicts[0]['verdict'] == 'pass'


def test_every_lean_process_of_a_default_verifier_is_sandboxed(tmp_path):
    from ei_nb.verify import make_verifier
    (tmp_path/'lean-toolchain').write_text('x\n')
    kw = dict(project=tmp_path, replay_cmd=[sys.executable, str(FAKE_REPLAY)])
    with make_verifier('repl', repl_cmd=[sys.executable, str(FAKE)], **kw) as v:
        assert all(r.sandbox is not None for r in v.backend.repls + v.replay.tools)     # the REPLs and the replay tools
        assert v.identity['sandbox'] is True
    with make_verifier('lean', lean_cmd=[sys.executable, str(FAKE), '--lean'], **kw) as v:
        assert v.backend.sandbox is not None and all(t.sandbox is not None for t in v.replay.tools)
    with make_verifier('repl', repl_cmd=[sys.executable, str(FAKE)], sandbox=False, **kw) as v:
        assert all(r.sandbox is None for r in v.backend.repls + v.replay.tools) and v.identity['sandbox'] is False


def test_the_command_line_and_the_environment_inside(tmp_path):
    # what a program sees inside: only `lo`, PID 2, none of the host's /tmp, HOME=/tmp, no variable outside `LEAN_ENV`
    import subprocess
    host_file = Path('/tmp')/f'ei-host-file-{uuid.uuid4().hex}'
    host_file.write_text('x')
    code = ("import os, socket, json; print(json.dumps([[n for _, n in socket.if_nameindex()], os.getpid(), "
            "os.listdir('/tmp'), os.environ.get('HOME'), sorted(os.environ)]))")
    try:
        env = {**os.environ, 'EI_TEST_SECRET': 'x', 'LEAN_PATH': '/lp'}
        r = subprocess.run(bwrap_command([sys.executable, '-I', '-S', '-c', code], cwd=tmp_path, env=env),
                           capture_output=True, text=True)
    finally: host_file.unlink()
    names, pid, tmp, home, keys = json.loads(r.stdout)
    assert (names, pid, home) == (['lo'], 2, '/tmp') and host_file.name not in tmp, r.stdout
    assert tmp == [tmp_path.parts[2]]                     # only the way to the bound project folder
    assert 'EI_TEST_SECRET' not in keys and 'LEAN_PATH' in keys

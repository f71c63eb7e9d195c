"""The `server` verifier (ei_nb.verify.ServerBackend) against the REAL kimina-lean-server code on 127.0.0.1.

kimina-lean-server (project-numina/kimina-lean-server; read at fb2393de, 2026-01-11) starts each REPL as
`lake env $LEAN_SERVER_REPL_PATH` in `$LEAN_SERVER_PROJECT_DIR` (server/repl.py). Here `lake` is a shim that execs its
arguments and the REPL is tests/fake_repl.py (the recorded v4.9.0-rc1 protocol; it runs NO Lean), so these tests show
the HTTP layer of the real server and our client together: the API key, integer timeouts, 429 back-off, and where the
server puts message lines (since its commit e2cdc1f, PR #56: counted from the top of the submitted file), which the client
learns from one probe per server (tests/test_kimina_lines.py covers the convention before e2cdc1f with a stand-in).

Its server is not on PyPI (only its client is, as kimina-client) and nothing of it is vendored here, so the tests need
  EI_KIMINA_DIR     a checkout of project-numina/kimina-lean-server (its server/ and client/ folders)
  EI_KIMINA_PYTHON  a Python with the server's dependencies at its requirements.txt versions (fastapi 0.116.1,
                    starlette 0.47.2, uvicorn 0.35.0, pydantic 2.11.7, pydantic-settings 2.10.1, loguru, rich, psutil,
                    google-cloud-logging); FastAPI >= 0.12x refuses its `FastAPI(logger=...)`
and skip, saying so, without them. Its `prisma` database client needs `prisma generate`, which downloads engines
(no network here); the database is used only with LEAN_SERVER_DATABASE_URL, so an inert `prisma` module stands in."""
import json, os, socket, subprocess, sys, threading, time, urllib.request
from pathlib import Path
import pytest
from ei_nb.core import shared_data
from ei_nb.setup_lean import CHECK_HEADER
from ei_nb.lean_backends import ServerBackend, ServerRefused
from ei_nb.lean_reply import LeanError
from ei_nb.verify import make_verifier

ROOT = Path(__file__).resolve().parent.parent
KIMINA_DIR, KIMINA_PYTHON = os.environ.get('EI_KIMINA_DIR'), os.environ.get('EI_KIMINA_PYTHON')
pytestmark = pytest.mark.skipif(
    not (KIMINA_DIR and KIMINA_PYTHON and (Path(KIMINA_DIR)/'server'/'main.py').is_file()),
    reason='REAL KIMINA-LEAN-SERVER NOT AVAILABLE: its server is not on PyPI (only the client, kimina-client 0.2.1); set '
           'EI_KIMINA_DIR to a kimina-lean-server checkout and EI_KIMINA_PYTHON to a Python with its server dependencies '
           '(see this file) to run the server backend against the real server code')
KEY = 'k3y'

def _free_port():
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

def _shims(d:Path) -> dict:
    "bin/lake (`lake env CMD` -> CMD), bin/repl (the fake REPL, logging to repl.log), stub/prisma, an empty project."
    (d/'bin').mkdir(); (d/'stub'/'prisma').mkdir(parents=True); (d/'project').mkdir()
    (d/'bin'/'lake').write_text('#!/bin/sh\n[ "$1" = env ] || { echo "lake shim: only lake env" >&2; exit 2; }\nshift; exec "$@"\n')
    (d/'bin'/'repl').write_text(f'#!/bin/sh\nexec {sys.executable} {ROOT/"tests"/"fake_repl.py"} --log {d/"repl.log"}\n')
    for f in ('lake', 'repl'): (d/'bin'/f).chmod(0o755)
    (d/'stub'/'prisma'/'__init__.py').write_text(
        'class Prisma:\n    "inert: the server connects only when LEAN_SERVER_DATABASE_URL is set"\n'
        '    async def connect(self): raise RuntimeError("no database in this test")\n    async def disconnect(self): pass\n')
    return {'PATH': f"{d/'bin'}{os.pathsep}{os.environ['PATH']}",
            'PYTHONPATH': os.pathsep.join([str(d/'stub'), KIMINA_DIR, str(Path(KIMINA_DIR)/'client')]),
            'LEAN_SERVER_REPL_PATH': str(d/'bin'/'repl'), 'LEAN_SERVER_PROJECT_DIR': str(d/'project')}

@pytest.fixture(scope='module')
def kimina(tmp_path_factory):
    "The real server (`python -m server`) on a free port, one REPL at most, 1 s wait for a free one, an API key."
    d, port = tmp_path_factory.mktemp('kimina'), _free_port()
    env = {**os.environ, **_shims(d), 'LEAN_SERVER_HOST': '127.0.0.1', 'LEAN_SERVER_PORT': str(port), 'LEAN_SERVER_API_KEY': KEY,
           'LEAN_SERVER_MAX_REPLS': '1', 'LEAN_SERVER_MAX_WAIT': '1', 'LEAN_SERVER_LEAN_VERSION': 'v4.9.0-rc1'}
    with open(d/'server.log', 'wb') as log:   # cwd d: no .env of the checkout is read
        proc = subprocess.Popen([KIMINA_PYTHON, '-m', 'server'], cwd=d, env=env, stdout=log, stderr=subprocess.STDOUT)
    url, t0 = f'http://127.0.0.1:{port}', time.monotonic()
    try:
        while True:
            assert proc.poll() is None, f'kimina-lean-server exited: {(d/"server.log").read_text()[-3000:]}'
            try:
                with urllib.request.urlopen(f'{url}/health', timeout=2) as r:
                    if json.loads(r.read()) == {'status': 'ok'}: break
            except OSError: pass
            assert time.monotonic() - t0 < 90, f'kimina-lean-server not up in 90 s: {(d/"server.log").read_text()[-3000:]}'
            time.sleep(0.3)
        yield url, d
    finally:
        proc.terminate()
        try: proc.wait(20)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait()

def _problem_and_sample(extra=''):
    "mathd_algebra_182 with its known proof (bundled data), as a completion; `extra` is appended to the proof."
    few = {r['name']: r for r in map(json.loads, open(shared_data('minif2f_valid_few_shot_dsp15.jsonl'), encoding='utf-8'))}
    prob = {r['name']: r for r in map(json.loads, open(shared_data('minif2f_dsp15.jsonl'), encoding='utf-8'))}['mathd_algebra_182']
    code = prob['header'] + few['mathd_algebra_182']['formal_statement'] + few['mathd_algebra_182']['formal_proof'] + extra
    return prob, {'name': prob['name'], 'sample_idx': 0, 'round': 0, 'completion': f'```lean4\n{code}\n```\n', 'n_tokens': 9, 'capped': False}


def test_one_verify_round_trip_with_a_key(kimina):
    url, d = kimina
    with make_verifier('server', endpoints=[url], api_key=KEY, workers=1, timeout=20, statement_check=False) as v:
        r = v.verify_one(*_problem_and_sample())
    assert r['verdict'] == 'pass', r
    log = (d/'repl.log').read_text().split()
    assert log[0::2].count('start') == 1 and log[0::2].count('cmd') == 3     # one REPL: the header, the line probe, the proof


def test_the_real_server_counts_lines_from_the_top_of_the_file(kimina):
    "A Lean error on line k of the submitted file comes back on line k: the convention of kimina >= e2cdc1f, learnt by the probe."
    url, _ = kimina
    sent = 'theorem t : 2 + 2 = 5 := by\n  norm_num -- FAKE:error\n\n#print axioms t\n'
    sb = ServerBackend([url], KEY)
    reply = sb.run(CHECK_HEADER, sent, 10)
    assert sb.conventions == {0: 'file'}                                      # learnt from the line probe, not guessed by version
    full = CHECK_HEADER.rstrip('\n') + '\n\n' + sent                       # what ServerBackend submits
    line = full.split('\n').index('  norm_num -- FAKE:error') + 1
    assert [m['pos']['line'] for m in reply['messages'] if m['severity'] == 'error'] == [line]
    in_sent = sent.split('\n').index('  norm_num -- FAKE:error') + 1
    assert sb.line_offsets(CHECK_HEADER, sent) == {line - in_sent}


def test_the_verifier_reads_calibrated_lines_through_the_real_server(kimina):
    url, _ = kimina
    prob, bad = _problem_and_sample('\n  norm_num -- FAKE:error')
    with make_verifier('server', endpoints=[url], api_key=KEY, workers=1, timeout=20, statement_check=False) as v:
        r = v.verify_one(prob, bad)
    assert r['verdict'] == 'fail' and 'lean error' in r['reason'], r
    assert [m['line'] for m in r['messages'] if m['severity'] == 'error'] == [r['proof'].split('\n').index('  norm_num -- FAKE:error') + 1]


def test_a_wrong_key_stops_the_run_and_a_fractional_timeout_is_refused(kimina):
    "A 401 is a configuration error (`ServerRefused`, exit 3, naming EI_LEAN_SERVER_KEY), not a per-proof `error`."
    url, _ = kimina
    with pytest.raises(ServerRefused, match='HTTP 401.*EI_LEAN_SERVER_KEY'):
        ServerBackend([url], 'wrong').run(CHECK_HEADER, 'theorem t : True := trivial\n', 5)
    prob, good = _problem_and_sample()
    with make_verifier('server', endpoints=[url], api_key='wrong', workers=1, timeout=5, statement_check=False) as v:
        with pytest.raises(ServerRefused): v.verify_one(prob, good)
    body = json.dumps({'codes': [{'custom_id': 'x', 'proof': 'theorem t : True := trivial'}], 'timeout': 2.5}).encode()
    req = urllib.request.Request(f'{url}/verify', body, {'Content-Type': 'application/json', 'Authorization': f'Bearer {KEY}'})
    with pytest.raises(urllib.error.HTTPError) as e: urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 422 and 'int_from_float' in e.value.read().decode()   # why ServerBackend rounds timeouts up


def test_429_while_the_only_repl_is_busy_is_retried(kimina):
    url, _ = kimina
    slow = ServerBackend([url], KEY)
    t = threading.Thread(target=lambda: slow.run(CHECK_HEADER, 'theorem t : True := trivial -- FAKE:slow=4\n', 20))
    t.start(); time.sleep(0.5)
    waiting = ServerBackend([url], KEY, busy_retries=8, busy_backoff=0.5)
    reply = waiting.run(CHECK_HEADER, 'theorem u : True := trivial\n\n#print axioms u\n', 20)
    t.join()
    assert waiting.hits[0] >= 2 and any('depends on axioms' in m['data'] for m in reply['messages'])

"""From a bare node to a round: `ei setup-lean` (plan, idempotence, self-check through the REPL stand-in),
`ei doctor` (the demo config passes; missing pieces fail with their fix; the REPL rows against the stand-in),
`ei pool` (real statements, miniF2F removed), the `openai` sampler through the CLI and across a dying endpoint,
and the reference configs. No network, no Lean: the REPL is tests/fake_repl.py, the OpenAI server a local stand-in."""
import http.server, json, os, random, stat, subprocess, sys, threading
from pathlib import Path
import pytest

from ei_nb.core import read_problems, shared_data, statement_key, StageFailed

ROOT = Path(__file__).resolve().parent.parent
FAKE_REPL = ROOT / 'tests' / 'fake_repl.py'


def ei(*args, env=None, cwd=ROOT):
    "Run `ei ARGS`; return (exit code, the JSON of the last stdout line or None, stderr)."
    e = {**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1', **(env or {})}
    r = subprocess.run([sys.executable, '-c', 'from ei_nb.cli import _entry; _entry()', *map(str, args)],
                       capture_output=True, text=True, env=e, cwd=cwd, timeout=600)
    lines = r.stdout.strip().splitlines()
    return r.returncode, (json.loads(lines[-1]) if lines else None), r.stderr


def script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# A REPL built from the tag without commit 4fc1e6d: it answers, but into a block-buffered stdout it never flushes,
# so a reader on the pipe waits forever (the bug the cherry-pick fixes).
UNFLUSHED_REPL = """import json, os, sys
sys.stdout = os.fdopen(1, 'w', buffering=1 << 16)   # block-buffered whatever PYTHONUNBUFFERED says
block = []
for line in sys.stdin:
    if line.strip(): block.append(line); continue
    if block: sys.stdout.write(json.dumps({'env': 0}) + '\\n\\n'); block = []
"""


def unflushed_repl(path: Path) -> Path:
    (path.parent / 'unflushed_repl.py').write_text(UNFLUSHED_REPL)
    return script(path, f'#!/bin/sh\nexec {sys.executable} {path.parent / "unflushed_repl.py"}\n')


def git(*args, cwd):
    subprocess.run(['git', '-c', 'user.name=t', '-c', 'user.email=t@t', *args], cwd=cwd, check=True, capture_output=True)


# -- a machine where everything is already set up: fake elan + toolchain + lake, git checkouts, oleans, REPL

@pytest.fixture
def node(tmp_path):
    "ELAN_HOME with a fake elan/lake/lean and the toolchain folder, a Mathlib checkout with oleans, a built REPL."
    elan = tmp_path / 'elan'
    script(elan / 'bin' / 'elan', '#!/bin/sh\necho "fake elan $*"\n')
    # `lake env CMD...` runs CMD (what the real lake does, minus the Lean paths)
    script(elan / 'bin' / 'lake', '#!/bin/sh\nif [ "$1" = env ]; then shift; exec "$@"; fi\necho "fake lake $*"\n')
    script(elan / 'bin' / 'lean', '#!/bin/sh\necho "Lean (version 4.9.0-rc1, x86_64-unknown-linux-gnu, commit dcccfb73cb24, Release)"\n')
    (elan / 'toolchains' / 'leanprover--lean4---v4.9.0-rc1').mkdir(parents=True)
    project = tmp_path / 'lean' / 'mathlib4'
    project.mkdir(parents=True)
    (project / 'lean-toolchain').write_text('leanprover/lean4:v4.9.0-rc1\n')
    git('init', '-q', cwd=project); git('add', '-A', cwd=project); git('commit', '-q', '-m', 'mathlib', cwd=project)
    commit = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=project, capture_output=True, text=True).stdout.strip()
    (project / '.lake/build/lib').mkdir(parents=True); (project / '.lake/build/lib/Mathlib.olean').write_bytes(b'olean')
    repl = tmp_path / 'lean' / 'repl'
    (repl / 'REPL').mkdir(parents=True)
    (repl / 'REPL' / 'Main.lean').write_text('def loop := do\n  IO.println ""\n')
    git('init', '-q', cwd=repl); git('add', '-A', cwd=repl); git('commit', '-q', '-m', 'tag', cwd=repl); git('tag', 'v4.9.0-rc1', cwd=repl)
    (repl / 'REPL' / 'Main.lean').write_text('def loop := do\n  let out ← IO.getStdout\n  out.putStr "\\n"\n  out.flush\n')
    git('commit', '-q', '-am', 'flush', cwd=repl)
    script(repl / '.lake' / 'build' / 'bin' / 'repl', f'#!/bin/sh\nexec {sys.executable} {FAKE_REPL} "$@"\n')
    from ei_nb.lean_replay import REPLAY_FILES, replay_sources          # the kernel replay tool, built beside the REPL (issue 28)
    (tmp_path / 'lean' / 'ei-replay').mkdir()
    for f in REPLAY_FILES: (tmp_path / 'lean' / 'ei-replay' / f).write_bytes((replay_sources() / f).read_bytes())
    script(tmp_path / 'lean' / 'ei-replay' / '.lake' / 'build' / 'bin' / 'ei-replay', f'#!/bin/sh\nexec {sys.executable} {ROOT / "tests" / "fake_replay.py"} "$@"\n')
    env = {'ELAN_HOME': str(elan), 'PATH': f"{elan / 'bin'}{os.pathsep}{os.environ['PATH']}",
           'EI_REPL_BIN': str(repl / '.lake' / 'build' / 'bin' / 'repl')}
    return {'elan': elan, 'project': project, 'repl': repl, 'commit': commit, 'env': env}


def test_setup_lean_dry_run_lists_every_command(tmp_path):
    rc, out, err = ei('setup-lean', '--project', tmp_path / 'lean/mathlib4', '--dry-run', env={'ELAN_HOME': str(tmp_path / 'none')})
    assert rc == 0, err
    assert out['dry_run'] and set(out['steps']) == {'elan', 'toolchain', 'mathlib', 'oleans', 'repl', 'repl-flush', 'repl-build', 'replay-build'}
    assert set(out['steps'].values()) == {'planned'}
    for cmd in ('elan toolchain install leanprover/lean4:v4.9.0-rc1', 'clone https://github.com/xinhjBrant/mathlib4',
                'checkout 2f65ba7f1a9144b20c8e7358513548e317d26de1', 'lake exe cache get', 'checkout v4.9.0-rc1',
                'cherry-pick -x 4fc1e6d1dda170e8f0a6b698dd5f7e17a9cf52b4', 'lake build', 'theorem t : 2 + 2 = 4 := by norm_num'):
        assert cmd in err, cmd
    assert not (tmp_path / 'lean').exists()   # nothing was run


def test_setup_lean_checks_and_skips_then_proves_through_the_repl(node):
    args = ('setup-lean', '--project', node['project'], '--mathlib-commit', node['commit'])
    for _ in range(2):   # idempotent: the second run finds the same
        rc, out, err = ei(*args, env=node['env'])
        assert rc == 0, err
        assert set(out['steps'].values()) == {'present'}, out['steps']
        assert out['selfcheck']['verdict'] == 'pass'
        assert "'t' depends on axioms: [propext, Classical.choice, Quot.sound]" == out['selfcheck']['axioms']
        assert 'REPL reply: {' in err and 'axioms:' in err
    assert out['repl_bin'] == node['env']['EI_REPL_BIN']


def test_setup_lean_runs_only_missing_steps(node):
    from ei_nb.setup_lean import setup_lean
    import shutil
    shutil.rmtree(node['elan'] / 'toolchains')
    ran = []
    def run(argv, cwd, env, log):   # the toolchain install, done by hand
        ran.append(argv); (node['elan'] / 'toolchains' / 'leanprover--lean4---v4.9.0-rc1').mkdir(parents=True)
    old = os.environ.get('EI_REPL_BIN')
    out = setup_lean(node['project'], elan=node['elan'], run=run, mathlib_commit=node['commit'], timeout=60, log=lambda *a: None)
    assert ran == [['elan', 'toolchain', 'install', 'leanprover/lean4:v4.9.0-rc1']]
    assert out['steps']['toolchain'] == 'done' and out['steps']['mathlib'] == 'present'
    assert setup_lean(node['project'], elan=node['elan'], run=None, mathlib_commit=node['commit'], log=lambda *a: None)['steps']['toolchain'] == 'present'


def test_setup_lean_refuses_a_checkout_at_another_commit(node):
    rc, out, err = ei('setup-lean', '--project', node['project'], env=node['env'])   # the reference commit, not this one
    assert rc == 2 and out is None
    assert 'not 2f65ba7f1a91' in err


def test_setup_lean_fails_when_the_repl_does_not_flush(node):
    unflushed_repl(Path(node['env']['EI_REPL_BIN']))
    rc, out, err = ei('setup-lean', '--project', node['project'], '--mathlib-commit', node['commit'], '--timeout', '2', env=node['env'])
    assert rc == 3 and 'self-check failed' in err and '4fc1e6d' in err   # the verifier names the no-flush REPL and its fix


# -- ei doctor

def test_doctor_passes_on_the_demo_config(tmp_path):
    rc, out, err = ei('doctor', '--config', 'configs/demo.toml', '--run-dir', tmp_path / 'demo')
    assert rc == 0, err
    assert out['ok'] and out['counts']['FAIL'] == 0
    rows = {r['check']: r for r in out['rows']}
    assert 'written by the demo stage' in rows['pool']['detail'] and rows['lean']['status'] == 'WARN'
    assert all(r['status'] in ('OK', 'WARN', 'FAIL') for r in out['rows'])
    assert 'OK    jupyter kernel' in err


def test_doctor_fails_with_the_fix_on_the_reference_config_here(tmp_path):
    rc, out, err = ei('doctor', '--config', 'configs/goedel8b.toml', '--run-dir', tmp_path / 'g', '--no-lean',
                      '--set', f'paths.pool="{tmp_path}/pool.jsonl"')
    assert rc == 3 and out is not None and not out['ok']
    rows = {r['check']: r for r in out['rows']}
    assert rows['base model']['status'] == 'FAIL' and 'huggingface-cli download' in rows['base model']['fix']
    assert rows['pool']['status'] == 'FAIL' and 'ei pool' in rows['pool']['fix']
    assert rows['gpus']['status'] == 'FAIL'      # vllm with data parallel 4, no CUDA here
    assert rows['scored']['status'] == 'OK'       # miniF2F-valid, none of the test split
    assert 'not ready:' in err


def test_doctor_checks_the_pool_against_protected(tmp_path):
    from ei_nb.doctor import Context, check_problems
    from ei_nb.config import load_config
    from ei_nb.core import write_records
    mf = read_problems(shared_data('minif2f_dsp15.jsonl'))
    write_records(tmp_path / 'pool.jsonl', [{**mf[-1], 'name': 'renamed_copy', 'split': 'train'}], 'problem')
    cfg = load_config(ROOT / 'configs/goedel8b.toml', [f'paths.pool="{tmp_path}/pool.jsonl"'], warn=lambda *a: None)
    rows = {r['check']: r for r in check_problems(Context(cfg, tmp_path / 'run'))}
    assert rows['pool']['status'] == 'FAIL' and '1 are protected' in rows['pool']['detail']   # nothing left to train on


def test_doctor_lean_rows_against_the_repl_stand_in(node, tmp_path, monkeypatch):
    from ei_nb.doctor import preflight, check_lean, Context
    from ei_nb.config import load_config
    for k, v in node['env'].items(): monkeypatch.setenv(k, v)
    cfg = load_config(ROOT / 'configs/goedel8b.toml', [f'paths.lean_project="{node["project"]}"'], warn=lambda *a: None)
    rows = {r['check']: r for r in check_lean(Context(cfg, tmp_path / 'run'), timeout=30)}
    assert {k: r['status'] for k, r in rows.items()} == {'lean toolchain': 'OK', 'lean version': 'OK', 'mathlib oleans': 'OK',
                                                         'repl answers': 'OK', '#print axioms': 'OK'}
    unflushed_repl(Path(node['env']['EI_REPL_BIN']))
    rows = {r['check']: r for r in check_lean(Context(cfg, tmp_path / 'run'), timeout=2)}
    assert rows['repl answers']['status'] == 'FAIL' and 'did not answer the header' in rows['repl answers']['detail'] \
        and '4fc1e6d' in rows['repl answers']['detail'] and 'EI_REPL_BIN' in rows['repl answers']['fix']


# -- ei pool

def _statement_rows():
    "Real statements: the lean-workbook files (proofs cut off, `sorry` instead) and ten miniF2F problems."
    from ei_nb.demo import split_lean_file
    rows = []
    for line in open(shared_data('lean_workbook_goedel_proofs_kimina_verdicts.jsonl'), encoding='utf-8'):
        r = json.loads(line)
        s = split_lean_file(r['code'])
        if s and r['id'].startswith('lean_workbook'):
            rows.append({'name': r['id'], 'header': s['header'], 'informal_prefix': s['informal_prefix'],
                         'formal_statement': s['formal_statement'].rstrip() + ' sorry'})
    mf = read_problems(shared_data('minif2f_dsp15.jsonl'))
    rows += [{'name': f'renamed_{q["name"]}', 'header': q['header'], 'informal_prefix': q.get('informal_prefix', ''),
              'formal_statement': q['formal_statement']} for q in mf[::50]]
    rows.append({**rows[0], 'name': 'duplicate_of_first'})
    rows.append({'name': 'bad', 'header': '', 'informal_prefix': '', 'formal_statement': 'theorem bad : True := trivial'})
    rows.append({'name': 'cheat', 'header': '', 'informal_prefix': '', 'formal_statement': 'theorem cheat (h : 1 = 1 := by native_decide) : True := by'})
    return rows


def test_pool_from_a_parquet_file(tmp_path):
    import pyarrow as pa, pyarrow.parquet as pq
    rows = _statement_rows()
    src = tmp_path / 'statements.parquet'
    pq.write_table(pa.Table.from_pylist(rows), src)
    mf = shared_data('minif2f_dsp15.jsonl')
    rc, out, err = ei('pool', '--source', src, '--protected', mf, '--out', tmp_path / 'pool.jsonl', '--n', 50, '--seed', 3)
    assert rc == 0, err
    n_mf = len(read_problems(mf)[::50])
    assert out['read'] == len(rows) and out['normalised'] == len(rows) - 1           # `:= trivial` is not `:= by`
    assert out['statement_ok'] == out['normalised'] - 1                              # native_decide in the statement
    assert out['unique'] == out['statement_ok'] - 1                                  # the duplicate
    assert out['not_protected'] == out['unique'] - n_mf and out['sampled'] == 50
    for step in ('rows', 'normalised', 'statement parser', 'distinct', 'not protected', 'sampled'): assert step in err
    pool = read_problems(tmp_path / 'pool.jsonl')
    keys = {statement_key(q['formal_statement']) for q in read_problems(mf)}
    assert not any(statement_key(p['formal_statement']) in keys for p in pool)
    assert all(p['formal_statement'].rstrip().endswith(':= by') and p['header'].startswith('import Mathlib') for p in pool)
    # the same seed gives the same pool; another seed another one
    rc, _, _ = ei('pool', '--source', src, '--protected', mf, '--out', tmp_path / 'again.jsonl', '--n', 50, '--seed', 3)
    assert (tmp_path / 'again.jsonl').read_bytes() == (tmp_path / 'pool.jsonl').read_bytes()
    ei('pool', '--source', src, '--protected', mf, '--out', tmp_path / 'other.jsonl', '--n', 50, '--seed', 4)
    assert {p['name'] for p in read_problems(tmp_path / 'other.jsonl')} != {p['name'] for p in pool}


def test_pool_through_datasets_from_a_dataset_folder(tmp_path):
    pytest.importorskip('datasets')
    import pyarrow as pa, pyarrow.parquet as pq
    from ei_nb.pool import build_pool
    folder = tmp_path / 'Goedel-Pset-like'; folder.mkdir()
    rows = _statement_rows()[:30]
    pq.write_table(pa.Table.from_pylist(rows), folder / 'train-00000-of-00001.parquet')
    pool, counts = build_pool([str(folder)], log=lambda *a: None)
    assert counts['read'] == 30 and len(pool) == 30


def test_pool_refuses_an_unknown_file_type_and_an_empty_result(tmp_path):
    (tmp_path / 'x.csv').write_text('a,b\n')
    rc, out, err = ei('pool', '--source', tmp_path / 'x.csv', '--out', tmp_path / 'p.jsonl')
    assert rc == 2 and 'unknown file type' in err
    (tmp_path / 'e.jsonl').write_text(json.dumps({'name': 'x', 'formal_statement': 'theorem x : True := trivial'}) + '\n')
    rc, out, err = ei('pool', '--source', tmp_path / 'e.jsonl', '--out', tmp_path / 'p.jsonl')
    assert rc == 2 and 'no problem left' in err and not (tmp_path / 'p.jsonl').exists()


# -- the openai sampler against a local stand-in of `vllm serve`

class Standin(http.server.BaseHTTPRequestHandler):
    "GET /v1/models and POST /v1/completions in vLLM's reply format; text drawn from the request's seed."
    model, fail_after, served = '', None, 0
    def log_message(self, *a): pass
    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code); self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        self._send(200, {'object': 'list', 'data': [{'id': self.model, 'object': 'model', 'root': self.model}]})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        cls = type(self); cls.served += 1
        if cls.fail_after is not None and cls.served > cls.fail_after: return self._send(503, {'error': 'node lost'})
        if body['model'] != self.model: return self._send(404, {'error': 'no such model'})
        rng = random.Random(body['seed'])
        texts = [' '.join(rng.choice(['intro x', 'simp', 'nlinarith [sq_nonneg x]', 'norm_num']) for _ in range(rng.randint(1, 4)))
                 for _ in range(body['n'])]
        self._send(200, {'id': 'cmpl-1', 'object': 'text_completion', 'created': 0, 'model': self.model,
                         'choices': [{'index': j, 'text': t, 'logprobs': None, 'finish_reason': 'stop', 'stop_reason': None}
                                     for j, t in enumerate(texts)],
                         'usage': {'prompt_tokens': 1, 'completion_tokens': 1, 'total_tokens': 2}})


@pytest.fixture
def serve():
    servers = []
    def start(model, fail_after=None):
        cls = type('S', (Standin,), {'model': str(model), 'fail_after': fail_after, 'served': 0})
        srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), cls)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f'http://127.0.0.1:{srv.server_port}', cls
    yield start
    for s in servers: s.shutdown()


def test_ei_sample_with_the_openai_sampler(tiny_model_dir, serve, tmp_path):
    from ei_nb.core import write_records
    problems = [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'valid'][:4]
    write_records(tmp_path / 'problems.jsonl', problems, 'problem')
    (a, ca), (b, cb) = serve(tiny_model_dir), serve(tiny_model_dir)
    rc, out, err = ei('sample', '--backend', 'openai', '--problems', tmp_path / 'problems.jsonl', '--model', tiny_model_dir,
                      '--out', tmp_path / 's.jsonl', '--n', 3, '--max-new-tokens', 64, '--chunk-problems', 2,
                      env={'EI_OPENAI_ENDPOINTS': f'{a},{b}/v1'})
    assert rc == 0, err
    assert out['n_samples'] == 12 and ca.served == 2 and cb.served == 2      # round robin over the two endpoints
    rows = [json.loads(l) for l in (tmp_path / 's.jsonl').read_text().splitlines()]
    assert all(r['n_tokens'] > 1 and not r['capped'] for r in rows)


def test_a_dead_endpoint_costs_at_most_one_chunk(tiny_model_dir, serve, tmp_path):
    from ei_nb.sample import OpenAISampler, SampleParams, run_pipeline
    problems = [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'valid'][:6]
    url, cls = serve(tiny_model_dir, fail_after=3)     # the node dies during the second chunk of two problems
    smp = OpenAISampler(tiny_model_dir, [url], retries=2, backoff=0.01, log=lambda *a: None)
    params, path = SampleParams(n=2, max_new_tokens=32, seed=0), tmp_path / 'samples.jsonl'
    with pytest.raises(StageFailed, match='every endpoint failed'):
        run_pipeline(problems, smp, path, params, 1, chunk_problems=2)
    kept = [json.loads(l) for l in path.read_text().splitlines()]
    assert len(kept) == 4                               # the first chunk is on disk, the second is lost
    cls.fail_after = None                               # the node is back
    r = run_pipeline(problems, OpenAISampler(tiny_model_dir, [url], log=lambda *a: None), path, params, 1, chunk_problems=2)
    assert r['n_resumed'] == 4 and r['n_generated'] == 8 and r['n_samples'] == 12
    fresh = run_pipeline(problems, OpenAISampler(tiny_model_dir, [url], log=lambda *a: None), tmp_path / 'fresh.jsonl', params, 1, chunk_problems=2)
    assert (tmp_path / 'fresh.jsonl').read_text() == path.read_text()   # resumed = uninterrupted


# -- the reference configs and the CLI

@pytest.mark.parametrize('name', ['goedel8b.toml', 'goedel8b_two_node.toml'])
def test_reference_configs_load(name):
    from ei_nb.config import load_config
    cfg = load_config(ROOT / 'configs' / name, warn=lambda *a: None)
    assert cfg['paths']['pool'] == 'data/pool.jsonl' and cfg['paths']['lean_project'] == 'lean/mathlib4'
    if 'two_node' in name:
        assert cfg['stages']['01_sample_verify']['sampler'] == 'openai' and cfg['stages']['04_eval']['sampler'] == 'openai'
        assert cfg['run']['env']['EI_OPENAI_ENDPOINTS'].count('http') == 2


def test_new_commands_are_in_ei_help():
    r = subprocess.run([sys.executable, '-c', 'from ei_nb.cli import _entry; _entry()', '--help'], capture_output=True, text=True,
                       env={**os.environ, 'PYTHONPATH': str(ROOT)})
    for cmd in ('setup-lean', 'doctor', 'pool'): assert f'  {cmd}' in r.stderr


def test_doctor_rows_of_the_two_node_config(serve, tiny_model_dir, tmp_path, monkeypatch):
    from ei_nb.doctor import Context, check_samplers, check_lean, check_cpus
    from ei_nb.config import load_config
    import socket
    live, _ = serve(tiny_model_dir)
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); closed = f'http://127.0.0.1:{s.getsockname()[1]}'   # nothing listens there
    monkeypatch.setenv('EI_OPENAI_ENDPOINTS', f'{live}/v1,{closed}/v1')
    monkeypatch.setenv('EI_LEAN_SERVER_ENDPOINTS', f'{live},{closed}')
    cfg = load_config(ROOT / 'configs/goedel8b_two_node.toml', warn=lambda *a: None)
    rows = check_samplers(Context(cfg, tmp_path / 'run'))
    assert [r['status'] for r in rows] == ['WARN', 'FAIL']          # up, but not serving the base model of the config
    assert str(tiny_model_dir) in rows[0]['detail'] and 'vllm serve' in rows[1]['fix']
    ctx = Context(load_config(ROOT / 'configs/goedel8b_two_node.toml', [f'paths.base_model="{tiny_model_dir}"'], warn=lambda *a: None), tmp_path / 'run')
    assert [r['status'] for r in check_samplers(ctx)] == ['OK', 'FAIL']
    assert [r['status'] for r in check_lean(ctx)] == ['OK', 'FAIL']       # the checking servers accept connections?
    assert check_cpus(ctx)[0]['status'] == 'OK'                          # 32 checks in flight run on the servers

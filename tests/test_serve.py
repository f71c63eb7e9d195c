"""The managed `vllm serve` (ei_nb.vllm_server) against tests/fake_vllm.py, a stand-in written from vLLM 0.34.0's CLI and
OpenAI protocol models (see its docstring): the command and flags, the wait for `/v1/models`, failures with the log's
tail, no process left behind (normal exit, exception, SIGTERM or SIGKILL of the holder), one restart per chunk, and
the existing `openai` sampler sampling through it. No GPU, no network."""
import json, os, shutil, signal, subprocess, sys, time, urllib.request
from pathlib import Path
import pytest
from ei_nb.core import StageFailed, read_problems, shared_data
from ei_nb.vllm_server import (ManagedServer, ServeSettings, group_members, http_get, server_command, vllm_server, with_restart)

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / 'tests' / 'fake_vllm.py'
TEXTS = ['```lean4\ntheorem t : 1 = 1 := by\n  rfl\n```', 'intro x\nsimp', 'nlinarith [sq_nonneg (x - 1)]', 'norm_num\n```']


@pytest.fixture
def fake(tmp_path, monkeypatch):
    "A `vllm` on a tmp bin dir that runs the stand-in, its request log, and canned completions."
    exe = tmp_path / 'bin' / 'vllm'; exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n'); exe.chmod(0o755)
    (tmp_path / 'completions.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in TEXTS))
    monkeypatch.setenv('FAKE_VLLM_LOG', str(tmp_path / 'requests.jsonl'))
    monkeypatch.setenv('FAKE_VLLM_COMPLETIONS', str(tmp_path / 'completions.jsonl'))
    return exe

def records(tmp_path, event):
    path = tmp_path / 'requests.jsonl'
    return [r for r in map(json.loads, path.read_text().splitlines()) if r['event'] == event] if path.exists() else []

def model(tmp_path, name='model', generation=None) -> Path:
    d = tmp_path / name; d.mkdir()
    (d / 'config.json').write_text(json.dumps({'max_position_embeddings': 4096}))
    if generation: (d / 'generation_config.json').write_text(json.dumps(generation))
    return d

def alive(pid) -> bool:
    try: return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except (OSError, IndexError): return False

def gone(*pids, within=15.0) -> bool:
    end = time.monotonic() + within
    while any(map(alive, pids)):
        if time.monotonic() > end: return False
        time.sleep(0.1)
    return True

def settings(exe, **kw):
    return ServeSettings(**{'vllm_bin': str(exe), 'deadline': 60, 'grace': 5, **kw})


# -- the stand-in parses vLLM's flags as vLLM does

def test_standin_refuses_what_vllm_refuses(fake, tmp_path):
    m = model(tmp_path)
    r = subprocess.run([fake, 'serve', m, '--port', '1', '--no-such-flag'], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and 'unrecognized arguments: --no-such-flag' in r.stderr
    r = subprocess.run([fake, 'serve', m, '--data-parallel-backend', 'slurm'], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and 'can only be ray or mp' in r.stderr
    r = subprocess.run([fake, 'serve', tmp_path / 'nothing'], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and 'Invalid repository ID or local directory' in r.stderr


# -- start: flags, model folder, the wait

def test_server_starts_with_the_flags_and_the_model_folder(fake, tmp_path):
    m, log = model(tmp_path), tmp_path / 'round_00' / 'logs' / 'vllm_01_sample_verify.log'
    s = settings(fake, data_parallel_size=4, tensor_parallel_size=2, max_model_len=2048, seed=7)
    with vllm_server(m, s, log) as srv:
        start = records(tmp_path, 'start')
        assert len(start) == 1 and start[0]['argv'] == server_command(m, s, srv.port)[1:]
        f = start[0]['flags']
        assert (f['model_tag'], f['data_parallel_size'], f['tensor_parallel_size'], f['max_model_len'], f['seed']) == (str(m.absolute()), 4, 2, 2048, 7)
        assert f['generation_config'] == 'vllm' and f['data_parallel_backend'] == 'mp' and f['host'] == '127.0.0.1'
        status, models = http_get(f'{srv.url}/v1/models')
        assert status == 200 and [x['id'] for x in models['data']] == [str(m.absolute())]
        assert srv.endpoints == [f'http://127.0.0.1:{srv.port}/v1']
    assert 'starting: ' in log.read_text() and 'stopped (terminated)' in log.read_text()


def test_the_ray_backend_spans_the_cluster_with_engines_per_node(fake, tmp_path):
    s = settings(fake, backend='ray', data_parallel_size=8, data_parallel_size_local=4)
    with vllm_server(model(tmp_path), s, tmp_path / 'vllm.log'):
        f = records(tmp_path, 'start')[0]['flags']
        assert (f['data_parallel_backend'], f['data_parallel_size'], f['data_parallel_size_local']) == ('ray', 8, 4)


def test_the_wait_lasts_until_v1_models_names_the_folder(fake, tmp_path, monkeypatch):
    monkeypatch.setenv('FAKE_VLLM_START_DELAY', '2')
    with vllm_server(model(tmp_path), settings(fake), tmp_path / 'vllm.log') as srv:
        assert srv.started_s >= 2 and srv.healthy()
        assert any(r['path'] == '/v1/models' for r in records(tmp_path, 'request'))


def test_a_server_that_is_not_ready_by_the_deadline_is_stopped(fake, tmp_path, monkeypatch):
    monkeypatch.setenv('FAKE_VLLM_START_DELAY', '60')
    srv = ManagedServer(model(tmp_path), settings(fake, deadline=1.5), tmp_path / 'vllm.log')
    with pytest.raises(StageFailed, match=r'did not serve .* within 1.5 s'):
        srv.start()
    assert group_members(srv.proc.pid) == []


def test_a_server_dead_on_start_fails_with_the_end_of_its_log(fake, tmp_path):
    with pytest.raises(StageFailed, match='Invalid repository ID') as e:
        with vllm_server(tmp_path / 'not-a-model', settings(fake), tmp_path / 'vllm.log'): pass
    assert 'exited with status 1' in str(e.value) and str(tmp_path / 'vllm.log') in str(e.value)
    with pytest.raises(StageFailed, match='unrecognized arguments: --max-num-seqz'):
        with vllm_server(model(tmp_path), settings(fake, extra_args=('--max-num-seqz', '8')), tmp_path / 'vllm2.log'): pass


# -- no process left behind

def test_nothing_is_left_after_the_block_ends_or_raises(fake, tmp_path):
    with vllm_server(model(tmp_path), settings(fake), tmp_path / 'vllm.log') as srv:
        pids = [srv.proc.pid, records(tmp_path, 'start')[0]['engine_pid']]
        assert all(map(alive, pids))
    assert gone(*pids, within=0) and group_members(pids[0]) == []
    with pytest.raises(RuntimeError, match='a stage failed'):
        with vllm_server(model(tmp_path, 'model2'), settings(fake), tmp_path / 'vllm2.log') as srv:
            pids = [srv.proc.pid, records(tmp_path, 'start')[-1]['engine_pid']]
            raise RuntimeError('a stage failed')
    assert gone(*pids, within=0)


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(fake, tmp_path, monkeypatch):
    monkeypatch.setenv('FAKE_VLLM_IGNORE_TERM', '1')
    t0 = time.monotonic()
    with vllm_server(model(tmp_path), settings(fake, grace=1), tmp_path / 'vllm.log') as srv: pid = srv.proc.pid
    assert not alive(pid) and time.monotonic() - t0 < 30
    assert 'stopped (killed)' in (tmp_path / 'vllm.log').read_text()


HOLDER = '''
import json, sys, time
from ei_nb.vllm_server import ServeSettings, vllm_server
s = ServeSettings(vllm_bin=sys.argv[1], deadline=60, grace=5)
with vllm_server(sys.argv[2], s, sys.argv[3]) as srv:
    print(json.dumps({'pid': srv.proc.pid}), flush=True)
    time.sleep(600)
'''

@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGKILL])
def test_nothing_is_left_when_the_holder_gets_sigterm_or_sigkill(fake, tmp_path, sig):
    "SIGTERM: the holder unwinds and stops the server; SIGKILL: the server gets SIGTERM from the kernel (PR_SET_PDEATHSIG)."
    holder = subprocess.Popen([sys.executable, '-c', HOLDER, str(fake), str(model(tmp_path)), str(tmp_path / 'vllm.log')],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    pid = None
    try:
        pid = json.loads(holder.stdout.readline())['pid']
        engine = records(tmp_path, 'start')[0]['engine_pid']
        assert alive(pid) and alive(engine)
        holder.send_signal(sig); holder.wait(60)
        assert gone(pid, engine) and group_members(pid) == []
        stopped = 'stopped (terminated)' in (tmp_path / 'vllm.log').read_text()
        assert stopped == (sig == signal.SIGTERM)       # SIGTERM: the `with` block unwound and stopped it itself
    finally:
        holder.kill(); holder.wait()
        if pid and group_members(pid): os.killpg(pid, signal.SIGKILL)   # a failed test leaves no server behind


# -- a server that dies mid-stage

def test_one_restart_per_chunk_then_the_stage_fails(fake, tmp_path, monkeypatch):
    monkeypatch.setenv('FAKE_VLLM_DIE_AFTER', '1')
    m = model(tmp_path)
    def ask(srv):
        req = urllib.request.Request(f'{srv.url}/v1/completions', json.dumps({'prompt': 'x', 'n': 1, 'seed': 0}).encode(),
                                     {'Content-Type': 'application/json'})
        with urllib.request.urlopen(req, timeout=10) as r: return json.loads(r.read())
    with vllm_server(m, settings(fake), tmp_path / 'vllm.log') as srv:
        port, first = srv.port, srv.proc.pid
        with_restart(srv, lambda: ask(srv))                                  # answered
        assert with_restart(srv, lambda: ask(srv))['choices']                # died, restarted on the same port, answered
        assert (srv.restarts, srv.port) == (1, port) and srv.proc.pid != first and not alive(first)
        assert with_restart(srv, lambda: ask(srv))['choices']                # the second server: one answered, dies on the next
        with pytest.raises(StageFailed, match='died again') as e:
            monkeypatch.setenv('FAKE_VLLM_DIE_AFTER', '0')                   # from now on every new server dies at once
            with_restart(srv, lambda: ask(srv))
        assert 'fake: died after 0 completions requests' in str(e.value)     # the log's tail names why
    assert group_members(srv.proc.pid) == []


# -- the `served` sampler (ei_nb.remote_samplers): the managed server behind the `openai` client, each chunk through `with_restart`

def _problems(k):
    return [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'valid'][:k]


def test_a_server_killed_mid_stage_costs_one_chunk_and_the_files_equal_an_uninterrupted_run(fake, tiny_model_dir, tmp_path, monkeypatch):
    from ei_nb.samplers import SampleParams, run_pipeline
    from ei_nb.remote_samplers import ServedSampler
    params = SampleParams(n=2, max_new_tokens=32, seed=0)
    def run(out, log):
        with ServedSampler(tiny_model_dir, settings(fake), log, log=lambda *a: None, retries=1, backoff=0.01) as smp:
            return run_pipeline(_problems(6), smp, out, params, 1, chunk_problems=2), smp.server.restarts
    fresh, restarts = run(tmp_path / 'fresh.jsonl', tmp_path / 'fresh.log')
    assert restarts == 0 and fresh['n_samples'] == 12
    n_fresh = len(records(tmp_path, 'request'))
    monkeypatch.setenv('FAKE_VLLM_DIE_AFTER', '3'); monkeypatch.setenv('FAKE_VLLM_DIE_ONCE', str(tmp_path / 'died'))
    hit, restarts = run(tmp_path / 'hit.jsonl', tmp_path / 'hit.log')         # dies on the 4th prompt: the second chunk
    assert restarts == 1 and hit['n_samples'] == 12
    assert (tmp_path / 'hit.jsonl').read_text() == (tmp_path / 'fresh.jsonl').read_text()
    asked = [r for r in records(tmp_path, 'request')[n_fresh:] if r['path'] == '/v1/completions']
    assert len(asked) == 6 + 2     # 6 prompts, and the 2 of the interrupted chunk once more
    assert len(records(tmp_path, 'start')) == 3
    assert 'restarting' in (tmp_path / 'hit.log').read_text() or (tmp_path / 'hit.log').read_text().count('starting:') == 2


def test_a_second_death_in_one_chunk_fails_naming_the_log_and_keeps_the_finished_chunks(fake, tiny_model_dir, tmp_path, monkeypatch):
    from ei_nb.samplers import SampleParams, run_pipeline
    from ei_nb.remote_samplers import ServedSampler
    class KilledAfterTheFirstChunk(ServedSampler):
        "The server is killed after the first chunk, and every server started after that dies on its first request."
        chunks = 0
        def generate(self, *a):
            self.chunks += 1
            if self.chunks == 2: monkeypatch.setenv('FAKE_VLLM_DIE_AFTER', '0'); os.killpg(self.server.proc.pid, signal.SIGKILL)
            return super().generate(*a)
    with pytest.raises(StageFailed, match='died again') as e:
        with KilledAfterTheFirstChunk(tiny_model_dir, settings(fake), tmp_path / 'logs' / 'vllm.log', log=lambda *a: None, retries=1, backoff=0.01) as smp:
            run_pipeline(_problems(6), smp, tmp_path / 's.jsonl', SampleParams(n=2, max_new_tokens=16, seed=0), 1, chunk_problems=2)
    assert str(tmp_path / 'logs' / 'vllm.log') in str(e.value) and 'rerun the same command' in str(e.value)
    assert len((tmp_path / 's.jsonl').read_text().splitlines()) == 4          # the first chunk is on disk
    starts = records(tmp_path, 'start')
    assert len(starts) == 2 and gone(*[r['pid'] for r in starts], *[r['engine_pid'] for r in starts])   # one restart, nothing left


def test_the_openai_sampler_samples_through_the_standin_from_the_tiny_model(fake, tiny_model_dir, tmp_path, monkeypatch):
    from ei_nb.samplers import SampleParams, run_pipeline
    from ei_nb.remote_samplers import OpenAISampler
    monkeypatch.delenv('FAKE_VLLM_COMPLETIONS')                             # completions from the tiny model itself
    with vllm_server(tiny_model_dir, settings(fake, max_model_len=4096), tmp_path / 'vllm.log') as srv:
        smp = OpenAISampler(tiny_model_dir, srv.endpoints, retries=1, log=lambda *a: None)   # names the model by /v1/models
        assert smp.model == str(Path(tiny_model_dir).absolute())
        r = run_pipeline(_problems(2), smp, tmp_path / 's.jsonl', SampleParams(n=2, max_new_tokens=16, seed=3), 0, chunk_problems=2)
    assert r['n_samples'] == 4
    rows = [json.loads(l) for l in (tmp_path / 's.jsonl').read_text().splitlines()]
    assert all(1 <= x['n_tokens'] <= 17 for x in rows)
    asked = [x for x in records(tmp_path, 'request') if x['path'] == '/v1/completions']
    replies = [x for x in records(tmp_path, 'reply') if x['path'] == '/v1/completions']
    assert len(asked) == 2 and {x['body']['seed'] for x in asked} == {x['effective'][0]['seed'] for x in replies}
    assert all(x['body']['n'] == 2 for x in asked) and all(x['effective'][0]['max_tokens'] == 16 for x in replies)


QWEN3_GENERATION = {'do_sample': True, 'temperature': 0.6, 'top_k': 20, 'top_p': 0.95}   # what Qwen3 checkpoints ship

def test_explicit_fields_win_over_the_models_generation_config_even_under_auto(fake, tmp_path):
    "A request with only n, temperature, top_p, max_tokens, seed (the sampler before issue 27) gets top_k = 20 from a Qwen3"
    "generation_config.json under vLLM's default `--generation-config auto`; today's request sends every field, so it gets 0"
    "there too; and the managed server refuses `auto` anyway."
    from ei_nb.samplers import SampleParams
    from ei_nb.vllm_server import free_port, start_process, stop_process
    from ei_nb.remote_samplers import completion_request
    m, port = model(tmp_path, generation=QWEN3_GENERATION), free_port()
    proc = start_process([str(fake), 'serve', str(m), '--port', str(port), '--host', '127.0.0.1'], tmp_path / 'auto.log')   # vLLM's defaults
    try:
        while http_get(f'http://127.0.0.1:{port}/health')[0] != 200: time.sleep(0.2)
        new = completion_request('theorem t : 1 = 1 := by', SampleParams(n=2, max_new_tokens=8), 5, str(m))
        old = {k: new[k] for k in ('model', 'prompt', 'n', 'temperature', 'top_p', 'max_tokens', 'seed', 'skip_special_tokens')}
        for body in (old, new):
            req = urllib.request.Request(f'http://127.0.0.1:{port}/v1/completions', json.dumps(body).encode(), {'Content-Type': 'application/json'})
            with urllib.request.urlopen(req, timeout=10) as r: assert [c['index'] for c in json.loads(r.read())['choices']] == [0, 1]
    finally: stop_process(proc, 5)
    (old_eff,), (new_eff,) = [r['effective'] for r in records(tmp_path, 'reply')[-2:]]
    assert (old_eff['top_k'], old_eff['temperature']) == (20, 1.0)           # the server filled top_k in
    assert (new_eff['top_k'], new_eff['temperature'], new_eff['top_p'], new_eff['min_p']) == (0, 1.0, 0.95, 0.0)
    with pytest.raises(Exception, match='generation_config.json'): ServeSettings(generation_config='auto')


# -- requests in flight scale with the server's engines (issue 34)

def test_requests_in_flight_scale_with_the_data_parallel_size(fake, tiny_model_dir, tmp_path, monkeypatch):
    "At n = 2 and 4 sequences per engine, 2 engines get 4 requests at once and 4 engines 8: max_num_seqs x dp / n, not 32."
    from ei_nb.samplers import SampleParams, run_pipeline
    from ei_nb.remote_samplers import ServedSampler
    monkeypatch.setenv('FAKE_VLLM_DELAY', '1.0')   # each request is held, so the client's concurrency shows
    peaks = {}
    for dp in (2, 4):
        log = tmp_path / f'requests_{dp}.jsonl'; monkeypatch.setenv('FAKE_VLLM_LOG', str(log))
        with ServedSampler(tiny_model_dir, settings(fake, data_parallel_size=dp, max_num_seqs=4), tmp_path / f'v{dp}.log',
                           log=lambda *a: None) as smp:
            run_pipeline(_problems(12), smp, tmp_path / f's{dp}.jsonl', SampleParams(n=2, max_new_tokens=8, seed=0), 0,
                         chunk_problems=12)
            assert smp.record()['requests_in_flight'] == 2 * dp
        rows = [json.loads(l) for l in log.read_text().splitlines()]
        start = next(r for r in rows if r['event'] == 'start')
        assert start['flags']['max_num_seqs'] == 4 and start['flags']['data_parallel_size'] == dp   # the server was told
        peaks[dp] = max(r['n'] for r in rows if r['event'] == 'in_flight')
    # never past the cap, and 4 engines get more at once than 2 (the last request may start late on a loaded machine)
    assert peaks[2] == 4 and 4 < peaks[4] <= 8, peaks


# -- engines that live in Ray are removed through Ray, not by signals (issue 34)

def _fake_ray(monkeypatch, jobs, groups):
    "A stand-in of the Ray API `ray_leftovers` calls (ray 2.x: ray.init/shutdown, ray.util.get_node_ip_address,"
    "ray.util.state.list_jobs/list_placement_groups with their filters, ray.util.placement_group); what is removed."
    import types
    from types import SimpleNamespace as NS
    ray, util, st, pgm = (types.ModuleType(n) for n in ('ray', 'ray.util', 'ray.util.state', 'ray.util.placement_group'))
    removed, calls = [], []
    ray.init = lambda **kw: calls.append(('init', kw)); ray.shutdown = lambda: calls.append(('shutdown',))
    ray.PlacementGroupID = NS(from_hex=lambda h: ('id', h))
    util.get_node_ip_address = lambda: '127.0.0.1'
    st.list_jobs = lambda limit=100, **kw: [NS(job_id=j, driver_info=NS(pid=str(pid), node_ip_address=ip, id='d'))
                                            for j, pid, ip in jobs()]
    def list_placement_groups(filters=None, limit=100, **kw):
        ok = lambda g: all((getattr(g, k) != v) if op == '!=' else (getattr(g, k) == v) for k, op, v in filters or [])
        return [g for g in groups if ok(g)]
    st.list_placement_groups = list_placement_groups
    pgm.PlacementGroup = lambda pg_id: NS(id=pg_id)
    pgm.remove_placement_group = lambda pg: removed.append(pg.id[1])
    ray.util, util.state, util.placement_group = util, st, pgm
    for m in (ray, util, st, pgm): monkeypatch.setitem(sys.modules, m.__name__, m)
    return removed, calls


def test_a_ray_backed_server_has_its_placement_groups_removed_through_ray_when_stopped(fake, tmp_path, monkeypatch):
    from types import SimpleNamespace as NS
    pg = lambda i, job, state='CREATED', detached=False: NS(placement_group_id=f'pg{i}', name=f'dp_rank_{i % 2}',
                                                             creator_job_id=job, state=state, is_detached=detached)
    groups = [pg(0, '01000000'), pg(1, '01000000'), pg(2, '02000000'), pg(3, '01000000', 'REMOVED'), pg(5, '01000000', detached=True)]
    holder = {}
    jobs = lambda: [('01000000', holder['pid'], '127.0.0.1'), ('02000000', 999999, '127.0.0.1'), ('03000000', holder['pid'], '10.0.0.9')]
    removed, calls = _fake_ray(monkeypatch, jobs, groups)
    said = []
    s = settings(fake, backend='ray', data_parallel_size=2, data_parallel_size_local=2)
    with vllm_server(model(tmp_path), s, tmp_path / 'vllm.log', log=said.append) as srv: holder['pid'] = srv.proc.pid
    assert removed == ['pg0', 'pg1']                       # its job's live groups; not another job's, nor a detached one
    assert calls[0][0] == 'init' and calls[-1] == ('shutdown',) and not any(c[0] == 'init' for c in calls[1:])
    assert any('removed 2 Ray placement group(s)' in x for x in said) and not group_members(srv.proc.pid)
    srv.stop(); assert len([c for c in calls if c[0] == 'init']) == 1        # stopped once, looked for once


def test_without_ray_installed_the_stop_still_stops_and_says_ray_was_not_checked(fake, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'ray', None)          # `import ray` raises ImportError
    said = []
    s = settings(fake, backend='ray', data_parallel_size=2, data_parallel_size_local=2)
    with vllm_server(model(tmp_path), s, tmp_path / 'vllm.log', log=said.append) as srv: pid = srv.proc.pid
    assert gone(pid) and any("pip install -e '.[ray]'" in x for x in said)
    assert 'stopped (terminated, Ray not checked)' in (tmp_path / 'vllm.log').read_text()

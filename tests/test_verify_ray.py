"""The `ray` verifier back-end (ei_nb.lean_ray) on a REAL Ray cluster of two nodes on this machine, the head and one
more, each offering `lean_workers = 2`, started with `ray.cluster_utils.Cluster` inside a network and
PID namespace of this test's own (tests/ray_namespace.py: every Ray address is 127.0.0.1, nothing outlives it).

The REPL and the replay tool are the stand-ins tests/fake_repl.py and tests/fake_replay.py (no Lean here). This file,
run as a script inside the namespace, plays the scenarios once on one cluster and writes what it saw to a JSON file;
each test below asserts one named fact of it:
  (a) the verdicts of the Ray back-end equal the local REPL pool's on the same proofs;
  (b) a node removed mid-stage (`cluster.remove_node`) loses no proof, puts none twice in the verdict file, and leaves
      no REPL, replay tool or Ray process behind (the namespace's process table after the verifier closes, and after
      the cluster stops);
  (c) a resumed stage re-checks nothing already written.
"""
import json, sys, threading, time, traceback
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
from tests.ray_namespace import inside, namespace_refusal, processes, run_in_namespace, start_cluster

FAKE, FAKE_REPLAY = str(ROOT/'tests'/'fake_repl.py'), str(ROOT/'tests'/'fake_replay.py')
MIXED = ['', 'FAKE:error', 'FAKE:sorry', 'FAKE:crash', 'FAKE:addfalse', 'FAKE:retype', 'FAKE:axiom=sorryAx',
         'FAKE:slow=0.3', 'FAKE:leak']


# ---------------------------------------------------------------- what runs inside the namespace
def _rows(name):
    from ei_nb.core import shared_data
    return [json.loads(l) for l in open(shared_data(name), encoding='utf-8')]


def _problems(n):
    "`n` miniF2F-valid problems with their published proofs (the bundled few-shot file)."
    minif2f = {r['name']: r for r in _rows('minif2f_dsp15.jsonl')}
    few = [r for r in _rows('minif2f_valid_few_shot_dsp15.jsonl') if r['name'] in minif2f][:n]
    return [(minif2f[r['name']], r['formal_proof']) for r in few]


def _completion(problem, proof, directive=''):
    code = problem['header'] + problem['formal_statement'] + proof + (f'\n  -- {directive}' if directive else '')
    return f'Proof:\n\n```lean4\n{code}\n```\n'


def _settings(tmp, **kw):
    from ei_nb.verify import VerifierSettings
    (tmp/'project').mkdir(exist_ok=True)
    return VerifierSettings(project=str(tmp/'project'), timeout=20, mem_mb=2048,
                            repl_cmd=[sys.executable, FAKE, '--log', str(tmp/'repl.log')],
                            replay_cmd=[sys.executable, FAKE_REPLAY], **kw)


def _key(v): return (v['name'], v['sample_idx'])
def _plain(vs): return sorted([{k: x for k, x in v.items() if k != 'verify_s'} for v in vs], key=_key)


def scenario_equal(tmp, facts):
    "(a) the same proofs through the local pool and through the cluster."
    from ei_nb.verify import make_verifier
    pairs = [(p, {'name': p['name'], 'sample_idx': i, 'completion': _completion(p, proof, d)})
             for p, proof in _problems(3) for i, d in enumerate(MIXED)]
    pairs.append((pairs[0][0], {'name': pairs[0][0]['name'], 'sample_idx': 99, 'completion': 'no code block'}))
    with make_verifier(_settings(tmp, backend='repl', workers=2)) as v: local = list(v.verify_stream(pairs))
    with make_verifier(_settings(tmp, backend='ray')) as v:
        remote = list(v.verify_stream(pairs)); pool = v.backend
        facts['a_workers'] = pool.workers(); facts['a_identity'] = v.identity
    facts['a_local'], facts['a_ray'] = _plain(local), _plain(remote)


class StubTokenizer:
    "Enough of a tokenizer for `plan_prompts`: the chat template is the user turn itself, tokens are words."
    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=True): return msgs[-1]['content']
    def __call__(self, text, add_special_tokens=False): return {'input_ids': text.split()}


class StubSampler:
    "A sampler whose completions are the published proofs, each checked for `slow` seconds by the REPL stand-in."
    name, context = 'stub', 1 << 20
    def __init__(self, problems, slow):
        from ei_nb.prompts import render_prompt
        self.tokenizer, self.slow = StubTokenizer(), slow
        self.by_prompt = {render_prompt(p, self.tokenizer, 'chat'): (p, proof) for p, proof in problems}
    def generate(self, prompts, params, seeds):
        done = lambda pr, i: _completion(*self.by_prompt[pr], f'FAKE:slow={self.slow} #{i}')
        return [[{'completion': done(pr, i), 'n_tokens': 1, 'capped': False} for i in range(params.n)]
                for pr in prompts]


def _remove_when_busy(cluster, node, pool, facts, stop):
    "Remove `node` once its actor has proofs in flight and some verdicts are in (the stage is under way)."
    while not stop.is_set():
        busy = [w for w in pool.workers() if w['inflight'] and w['host'] == '127.0.0.1']
        if pool.stats['dispatched'] >= 6 and len(busy) == 2:
            facts['b_inflight_at_removal'] = {w['node']: w['inflight'] for w in pool.workers()}
            facts['b_removed_node'] = node.node_id
            cluster.remove_node(node, allow_graceful=False)
            facts['b_removed_at'] = time.monotonic(); return
        time.sleep(0.02)


def scenario_remove_and_resume(tmp, cluster, nodes, facts):
    """(b) a stage whose second node (not the head: the driver is connected there) is removed mid-stage;
    (c) the same stage resumed with half its verdicts."""
    from ei_nb.core import read_verdicts, write_records
    from ei_nb.samplers import SampleParams, run_pipeline
    from ei_nb.verify import make_verifier
    problems, P = _problems(6), SampleParams(n=4, max_new_tokens=8)
    sampler, out = StubSampler(problems, 0.4), tmp/'stage'
    args = lambda v: ([p for p, _ in problems], sampler, out/'samples.jsonl', P, 0, v, out/'verdicts.jsonl')
    with make_verifier(_settings(tmp, backend='ray')) as v:
        stop = threading.Event()
        t = threading.Thread(target=_remove_when_busy, args=(cluster, nodes[0], v.backend, facts, stop)); t.start()
        facts['b_summary'] = {k: x for k, x in run_pipeline(*args(v), chunk_problems=6).items() if k != 'timings'}
        stop.set(); t.join()
        facts['b_stats'] = dict(v.backend.stats); facts['b_workers_after'] = v.backend.workers()
    facts['b_lines'] = [json.loads(l) for l in open(out/'verdicts.jsonl', encoding='utf-8')]
    lean = lambda ps: [p for p in ps if 'fake_repl' in p['args'] or 'fake_replay' in p['args']]
    facts['b_processes_after_close'] = _settled(lambda ps: not lean(ps))
    whole = read_verdicts(out/'verdicts.jsonl')
    keep = whole[:len(whole) // 2]
    write_records(out/'verdicts.jsonl', keep, 'verdict')    # as if the stage died with half its verdicts written
    with make_verifier(_settings(tmp, backend='ray')) as v:
        r = run_pipeline(*args(v), chunk_problems=6)
        facts['c_dispatched'], facts['c_lean_runs'] = v.backend.stats['dispatched'], v.stats['lean_runs']
    facts['c_summary'] = {k: r[k] for k in ('n_generated', 'n_verdicts')}
    facts['c_n_kept'], facts['c_n_total'] = len(keep), len(whole)
    facts['c_equal_to_uninterrupted'] = _plain(read_verdicts(out/'verdicts.jsonl')) == _plain(whole)


def _settled(ok, wait_s=15):
    "The process table once `ok` holds of it, or as it is after `wait_s` seconds (a killed process takes a moment)."
    end = time.monotonic() + wait_s
    while not ok(ps := processes()) and time.monotonic() < end: time.sleep(0.2)
    return ps


def scenario_doctor(tmp, facts):
    "`ei doctor`'s rows for backend ray: the Lean workers per node, a known proof and `2 + 2 = 5` on each node."
    from ei_nb.lean_ray import lean_worker_rows
    facts['doctor_rows'] = lean_worker_rows(_settings(tmp, backend='ray'), {'workers_per_node': 1})


def scenario_cli(tmp, cluster, facts):
    "`ei verify --backend ray --ray-address ADDR` in a process of its own: it joins the cluster by that address."
    import shlex, subprocess
    from ei_nb.core import write_records
    pairs = [(p, {'name': p['name'], 'sample_idx': i, 'round': 0, 'completion': _completion(p, proof, d), 'n_tokens': 1,
                  'capped': False}) for p, proof in _problems(2) for i, d in enumerate(['', 'FAKE:error'])]
    write_records(tmp/'cli_problems.jsonl', list({p['name']: p for p, _ in pairs}.values()), 'problem')
    write_records(tmp/'cli_samples.jsonl', [s for _, s in pairs], 'sample')
    s = _settings(tmp)
    cmd = [sys.executable, '-c', 'from ei_nb.cli import _entry; _entry()', 'verify', '--backend', 'ray',
           '--ray-address', cluster.address, '--problems', tmp/'cli_problems.jsonl',
           '--samples', tmp/'cli_samples.jsonl',
           '--out', tmp/'cli_verdicts.jsonl', '--project', s.project, '--repl-cmd', shlex.join(s.repl_cmd),
           '--replay-cmd', shlex.join(s.replay_cmd), '--timeout', '20']
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    facts['cli_address'], facts['cli_rc'] = cluster.address, r.returncode
    facts['cli_result'] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else r.stderr[-2000:]


def main(out_path):
    "Inside the namespace: one cluster, the scenarios in order, the facts written after each."
    import tempfile
    import ray
    facts, tmp = {'pid': __import__('os').getpid()}, Path(tempfile.mkdtemp(prefix='ei-ray-test-'))
    write = lambda: Path(out_path).write_text(json.dumps(facts, default=str))
    try:
        t0 = time.monotonic()
        cluster, nodes = start_cluster((2,), head_lean=2)
        facts['cluster_start_s'] = round(time.monotonic() - t0, 1)
        facts['addresses'] = sorted({n['NodeManagerAddress'] for n in ray.nodes()}); write()
        scenario_equal(tmp, facts); write()
        scenario_cli(tmp, cluster, facts); write()
        scenario_doctor(tmp, facts); write()
        scenario_remove_and_resume(tmp, cluster, nodes, facts); write()
        ray.shutdown(); cluster.shutdown()
        facts['processes_after_shutdown'] = _settled(lambda ps: not ps)
        facts['total_s'] = round(time.monotonic() - t0, 1)
    except BaseException:
        facts['error'] = traceback.format_exc()
    write()


# ---------------------------------------------------------------- the tests (outside: they only read the facts)
@pytest.fixture(scope='module')
def facts(tmp_path_factory):
    if (why := namespace_refusal()): pytest.skip(f'no network/PID namespace of our own: {why}')
    pytest.importorskip('ray', reason='ray is not installed: pip install -e ".[ray]"')
    out = tmp_path_factory.mktemp('ray')/'facts.json'
    r = run_in_namespace(__file__, [out], timeout=300)
    got = json.loads(out.read_text()) if out.exists() else {}
    assert 'error' not in got and r.returncode == 0, f"inside the namespace: {got.get('error')}\n{r.stderr[-3000:]}"
    return got


def test_every_ray_address_is_loopback(facts):
    assert facts['addresses'] == ['127.0.0.1'], facts['addresses']
    assert facts['pid'] == 1, 'the scenarios ran as PID 1 of their own namespace'


def test_a_ray_verdicts_equal_the_local_pools(facts):
    assert [w['slots'] for w in facts['a_workers']] == [2, 2], 'one actor on each of the two Lean nodes'
    assert {v['verdict'] for v in facts['a_local']} >= {'pass', 'fail', 'error', 'no_code'}, 'they cover every verdict'
    assert facts['a_ray'] == facts['a_local']


def test_ei_verify_backend_ray_joins_the_cluster_by_its_address(facts):
    assert facts['cli_address'].startswith('127.0.0.1:') and facts['cli_rc'] == 0, facts['cli_result']
    got = {k: facts['cli_result'][k] for k in ('n', 'pass', 'fail', 'error')}
    assert got == {'n': 4, 'pass': 2, 'fail': 2, 'error': 0}


def test_doctor_lists_lean_workers_per_node_and_checks_a_proof_on_each(facts):
    rows = facts['doctor_rows']
    nodes = [r for r in rows if ':' not in r['check']]
    assert len(nodes) == 2, rows
    assert all(r['detail'].startswith('1 Lean workers') for r in nodes), rows   # workers_per_node = 1
    checks = sorted((r['check'].split(': ')[1], r['status']) for r in rows if ':' in r['check'])
    assert checks == [('2 + 2 = 5', 'OK')] * 2 + [('a known proof', 'OK')] * 2, rows


def test_without_ray_the_error_names_the_extra(monkeypatch):
    "No cluster needed: with `ray` not importable, asking for the back-end says how to install it."
    from ei_nb.core import BadInput
    from ei_nb.verify import make_verifier
    monkeypatch.setitem(sys.modules, 'ray', None)              # `import ray` raises ImportError
    with pytest.raises(BadInput, match=r'pip install -e "\.\[ray\]"'): make_verifier('ray')


def test_b_node_removed_mid_stage_loses_no_proof(facts):
    removed = facts['b_removed_node']
    assert removed and facts['b_inflight_at_removal'].get(removed), 'proofs were in flight there'
    assert facts['b_stats']['actors_lost'] == 1 and facts['b_stats']['requeued'] >= 1
    assert len(facts['b_workers_after']) == 1, 'the removed node is not used again'
    lines = facts['b_lines']
    assert len(lines) == 24 and facts['b_summary']['n_verdicts'] == 24
    assert all(v['verdict'] == 'pass' for v in lines), [v['reason'] for v in lines if v['verdict'] != 'pass']


def test_b_node_removed_mid_stage_writes_no_verdict_twice(facts):
    keys = [(v['name'], v['sample_idx']) for v in facts['b_lines']]
    assert len(keys) == len(set(keys)) == 24


def test_b_no_repl_or_replay_process_survives_the_removed_node(facts):
    left = [p for p in facts['b_processes_after_close'] if 'fake_repl' in p['args'] or 'fake_replay' in p['args']]
    assert left == [], left


def test_b_no_ray_process_survives_the_cluster(facts):
    assert facts['processes_after_shutdown'] == [], facts['processes_after_shutdown']


def test_c_resumed_stage_rechecks_nothing_already_written(facts):
    assert 0 < facts['c_n_kept'] < facts['c_n_total'] == 24
    assert facts['c_summary'] == {'n_generated': 0, 'n_verdicts': 24}
    assert facts['c_dispatched'] == facts['c_lean_runs'] == facts['c_n_total'] - facts['c_n_kept']
    assert facts['c_equal_to_uninterrupted']


if __name__ == '__main__':
    assert inside(), 'run by the tests through tests/ray_namespace.run_in_namespace, never outside a namespace'
    main(sys.argv[1])

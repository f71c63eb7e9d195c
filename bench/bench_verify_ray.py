#!/usr/bin/env python3
"""Benchmark of the `ray` verifier back-end (ei_nb.lean_ray) against the local REPL pool, on the same stand-in.

The same proofs (miniF2F-valid problems with their published proofs, each carrying `FAKE:slow=S`: tests/fake_repl.py
answers after S seconds, a stand-in Lean check of S = 1 s by default), the same number of REPLs (--workers), the same
kernel replay (tests/fake_replay.py) and statement probe, checked
  local: `make_verifier(backend='repl', workers=W)` in this process;
  ray:   `make_verifier(backend='ray')` on a real Ray cluster: one node (the head) offering `lean_workers = W`, its
         actor in a Ray worker process as on any node, started with ray.cluster_utils.Cluster in a network and PID
         namespace of this script's own (tests/ray_namespace.py: every Ray address is 127.0.0.1; Ray is never
         started outside it).
Each verifier is warmed first (REPLs started, header imported, the reference statement probed: W quick proofs), then
--n slow proofs are timed; the two alternate --reps times and the best time of each counts (the machine is shared).
overhead = time(ray) / time(local) - 1: the cost per proof of the queue, Ray's calls and the driver's threads, at a
check of S seconds. It must stay at most --max-overhead (default 0.10); exit 1 otherwise.

Usage: OMP_NUM_THREADS=1 python bench/bench_verify_ray.py [--n 24] [--workers 4] [--slow 1.0] [--reps 2]
Prints one JSON object per timed run, then the summary as one JSON object.
"""
import argparse, json, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.ray_namespace import inside, namespace_refusal, run_in_namespace, start_cluster

FAKE, FAKE_REPLAY = str(ROOT/'tests'/'fake_repl.py'), str(ROOT/'tests'/'fake_replay.py')


def pairs(n, slow, tag):
    "`n` (problem, sample) pairs over four real problems, each proof distinct (no cache could answer it)."
    from ei_nb.core import shared_data
    rows = lambda f: [json.loads(l) for l in open(shared_data(f), encoding='utf-8')]
    minif2f = {r['name']: r for r in rows('minif2f_dsp15.jsonl')}
    few = [r for r in rows('minif2f_valid_few_shot_dsp15.jsonl') if r['name'] in minif2f][:4]
    out = []
    for i in range(n):
        p, r = minif2f[few[i % 4]['name']], few[i % 4]
        code = p['header'] + p['formal_statement'] + r['formal_proof'] + f'\n  -- {tag} {i} FAKE:slow={slow}'
        out.append((p, {'name': p['name'], 'sample_idx': i, 'completion': f'```lean4\n{code}\n```\n'}))
    return out


def timed(v, items) -> float:
    t0 = time.perf_counter()
    got = list(v.verify_stream(items))
    dt = time.perf_counter() - t0
    bad = [g['reason'] for g in got if g['verdict'] != 'pass']
    assert len(got) == len(items) and not bad, bad[:3]
    return dt


def measure(a, tmp):
    from ei_nb.verify import make_verifier, VerifierSettings
    (tmp/'project').mkdir(exist_ok=True)
    common = dict(project=str(tmp/'project'), timeout=max(60, 10 * a.slow), mem_mb=2048,
                  repl_cmd=[sys.executable, FAKE], replay_cmd=[sys.executable, FAKE_REPLAY])
    made = {'local': lambda: make_verifier(VerifierSettings(backend='repl', workers=a.workers, **common)),
            'ray': lambda: make_verifier(VerifierSettings(backend='ray', **common))}
    best = {}
    for rep in range(a.reps):
        for kind in ('local', 'ray'):
            with made[kind]() as v:
                timed(v, pairs(a.workers, 0, f'warm {rep}'))          # REPLs up, header in, statement probed
                dt = timed(v, pairs(a.n, a.slow, f'{kind} {rep}'))
            print(json.dumps({'kind': kind, 'rep': rep, 'n': a.n, 'workers': a.workers, 'slow_s': a.slow,
                              'seconds': round(dt, 3), 'proofs_per_s': round(a.n / dt, 3)}), flush=True)
            best[kind] = min(best.get(kind, dt), dt)
    return best


def main(a):
    import ray
    t0 = time.monotonic()
    cluster, _ = start_cluster((), head_lean=a.workers)
    start_s = time.monotonic() - t0
    try: best = measure(a, Path(tempfile.mkdtemp(prefix='ei-ray-bench-')))
    finally: ray.shutdown(); cluster.shutdown()
    ideal = a.n * a.slow / a.workers
    summary = {'machine': 'this one (2 cores, shared)', 'n': a.n, 'workers': a.workers, 'slow_s': a.slow,
               'cluster_start_s': round(start_s, 1),
               'ideal_s': ideal, 'local_s': round(best['local'], 3), 'ray_s': round(best['ray'], 3),
               'local_proofs_per_s': round(a.n / best['local'], 3), 'ray_proofs_per_s': round(a.n / best['ray'], 3),
               'overhead': round(best['ray'] / best['local'] - 1, 4), 'max_overhead': a.max_overhead}
    print(json.dumps(summary), flush=True)
    return 0 if summary['overhead'] <= a.max_overhead else 1


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--n', type=int, default=24); p.add_argument('--workers', type=int, default=4)
    p.add_argument('--slow', type=float, default=1.0); p.add_argument('--reps', type=int, default=2)
    p.add_argument('--max-overhead', type=float, default=0.10)
    a = p.parse_args()
    if inside(): sys.exit(main(a))
    if (why := namespace_refusal()): sys.exit(f'bench_verify_ray: cannot run: {why}')
    sys.exit(run_in_namespace(__file__, sys.argv[1:], timeout=1800, capture=False).returncode)

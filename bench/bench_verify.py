#!/usr/bin/env python3
"""Benchmark of the verifier (`ei_nb.policy`, `ei_nb.lean_backends`, `ei_nb.verifier`) without Lean.

1. Extraction + pre-check throughput on real-length completions: each of DeepSeek-Prover-V2's 438
   miniF2F solutions wrapped as a Goedel-style completion (reasoning prose, a draft block, the final
   ```lean4 block) padded to about --chars characters (5,000 tokens is about 15,000 characters).
   With --before REF (default d868896, the pre-check before issue 36's allow-list; 03c78cb is the one before issue 28)
   the pre-check of that commit (ei_nb/policy.py read from git, on today's tokenizer) is measured on the same
   completions in the same run, so the two numbers share the machine's load. --precheck-only stops there.
2. Pool overhead per proof: the REPL pool against tests/fake_repl.py answering instantly (the cost
   of our process layer, JSON and pre-check per proof, not of Lean), for 1 and 2 workers; the same for
   a warm verdict cache and for the one-process-per-proof `lean` backend (fake `lean`).
3. The kernel replay's overhead per passing proof on the stand-ins: the same pool with the replay (the fake
   REPL's `pickleTo` + one request to tests/fake_replay.py) against the pool without it.

Usage: OMP_NUM_THREADS=1 python bench/bench_verify.py [--n 400] [--chars 15000] [--before REF] [--precheck-only]
Prints one JSON object per measurement, then a summary table.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time, types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ei_nb.core import shared_data
from ei_nb.policy import extract_code, precheck
from ei_nb.verify import make_verifier

FAKE = str(ROOT/'tests'/'fake_repl.py')
FAKE_REPLAY = str(ROOT/'tests'/'fake_replay.py')

def former_precheck(ref:str):
    "The `precheck` of ei_nb/policy.py at commit `ref` (read from git), or None when git does not hold it."
    try: src = subprocess.run(['git', '-C', str(ROOT), 'show', f'{ref}:ei_nb/policy.py'], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError): return None
    mod = types.ModuleType('ei_nb._policy_before'); mod.__package__ = 'ei_nb'
    exec(compile(src, f'{ref}:ei_nb/policy.py', 'exec'), mod.__dict__)
    return mod.precheck

def completion(r, problem, chars):
    "A Goedel-style completion around a real solution, about `chars` characters long."
    code = r['full_code']
    prose = (problem.get('informal_prefix', '') + '\n' +
             '\n'.join(f'Step: we use `{l.strip()}` because it simplifies the goal.' for l in code.splitlines() if l.strip()))
    sketch = code.replace(':= by', ':= by\n  sorry -- draft', 1)
    draft = f"First a draft:\n```lean4\n{sketch}\n```\n"
    body = '<think>\n' + draft
    while len(body) < chars - len(code) - 200: body += prose + '\n'
    return body[:max(len(draft) + 8, chars - len(code) - 200)] + '\n</think>\nThe complete proof:\n```lean4\n' + code + '\n```\n'

def _safe(check, code, p):
    try: return check(code, p)
    # the former pre-check raised IndexError on some honest proofs
    except Exception as e: return f'crash: {type(e).__name__}'

def bench_precheck(pairs, reps=3, check=precheck, label='extract+precheck'):
    # wall time on a shared machine counts other processes' time too; the CPU time of this (single-threaded)
    # process is the one-core cost. Both are reported; the best of `reps` runs.
    best = cpu = None
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        verdicts = [_safe(check, extract_code(c), p) is None for p, c in pairs]
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        best = dt if best is None else min(best, dt)
        cpu = dc if cpu is None else min(cpu, dc)
    t0 = time.perf_counter()
    for _, c in pairs: extract_code(c)
    ext = time.perf_counter() - t0
    return {'bench': label, 'completions': len(pairs), 'mean_chars': round(statistics.mean(len(c) for _, c in pairs)),
            'passed': sum(verdicts), 'completions_per_s': round(len(pairs) / best), 'ms_per_completion': round(1000 * best / len(pairs), 3),
            'completions_per_cpu_s': round(len(pairs) / cpu), 'load_avg_1min': round(os.getloadavg()[0], 2),
            'extract_only_ms': round(1000 * ext / len(pairs), 3)}

def bench_pool(pairs, backend, workers, project, cache_dir=None, **kw):
    samples = [(p, {'name': p['name'], 'sample_idx': i, 'round': 0, 'completion': c, 'n_tokens': 0, 'capped': False})
               for i, (p, c) in enumerate(pairs)]
    with make_verifier(backend, project=project, workers=workers, timeout=30, cache_dir=cache_dir, **kw) as v:
        list(v.verify_stream(samples[:workers]))            # start the processes and import the header
        t0 = time.perf_counter()
        res = list(v.verify_stream(samples))
        wall = time.perf_counter() - t0
        stats, replayed = dict(v.stats), v.replay is not None
    counts = {k: sum(r['verdict'] == k for r in res) for k in ('pass', 'fail', 'error')}
    return {'bench': f'{backend}' + (' + replay' if replayed else '') + (' (warm cache)' if cache_dir and stats['cache_hits'] else ''), 'workers': workers,
            'proofs': len(res), **counts, 'wall_s': round(wall, 3), 'ms_per_proof': round(1000 * wall / len(res), 3),
            'proofs_per_s': round(len(res) / wall), **stats}

def _report(results, before, replay=()):
    "Print the measurements (one JSON object each) and the pre-check's lines; return them."
    for r in results + before + list(replay): print(json.dumps(r))
    for r in before:
        print(f"{r['bench']}: {r['completions_per_s']} completions/s wall, {r['completions_per_cpu_s']} per CPU-second "
              f"({r['ms_per_completion']} ms each; {r['passed']} passed)", file=sys.stderr)
    r = results[0]
    print(f"\nextract+precheck: {r['completions_per_s']} completions/s wall, {r['completions_per_cpu_s']} per "
          f"CPU-second ({r['ms_per_completion']} ms each, mean {r['mean_chars']} chars; extraction alone "
          f"{r['extract_only_ms']} ms; load average {r['load_avg_1min']} on {os.cpu_count()} cores)", file=sys.stderr)
    return results + before + list(replay)

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--n', type=int, default=400, help='proofs through each pool configuration')
    ap.add_argument('--chars', type=int, default=15000, help='target completion length in characters')
    ap.add_argument('--before', default='d868896',
                    help='git commit whose pre-check is measured beside this one ("" for none)')
    ap.add_argument('--precheck-only', action='store_true', help='measure the pre-check only (no pools)')
    a = ap.parse_args(argv)
    minif2f = {r['name']: r for r in map(json.loads, open(shared_data('minif2f_dsp15.jsonl'), encoding='utf-8'))}
    sols = [json.loads(l) for l in open(shared_data('deepseek_prover_v2_minif2f_solutions.jsonl'), encoding='utf-8')]
    pairs = [(minif2f[r['name']], completion(r, minif2f[r['name']], a.chars)) for r in sols]
    old = former_precheck(a.before) if a.before else None
    results = [bench_precheck(pairs)]
    before = [bench_precheck(pairs, check=old, label=f'extract+precheck @ {a.before}')] if old else []
    if a.precheck_only: return _report(results, before)
    good = [(p, c) for p, c in pairs if precheck(extract_code(c), p) is None]
    pool_pairs = (good * (a.n // len(good) + 1))[:a.n]
    with tempfile.TemporaryDirectory() as proj:
        Path(proj, 'lean-toolchain').write_text('fake\n')
        for w in (1, 2):
            results.append(bench_pool(pool_pairs, 'repl', w, proj, repl_cmd=[sys.executable, FAKE], mem_mb=None, replay=False))
        cache = Path(proj)/'cache'
        bench_pool(pool_pairs, 'repl', 2, proj, cache_dir=cache, repl_cmd=[sys.executable, FAKE], mem_mb=None, replay=False)
        results.append(bench_pool(pool_pairs, 'repl', 2, proj, cache_dir=cache, repl_cmd=[sys.executable, FAKE], mem_mb=None, replay=False))
        results.append(bench_pool(pool_pairs[:max(20, a.n // 10)], 'lean', 2, proj, lean_cmd=[sys.executable, FAKE, '--lean'], mem_mb=None,
                                  replay=False))
        replay = [bench_pool(pool_pairs, 'repl', 1, proj, repl_cmd=[sys.executable, FAKE], mem_mb=None, replay=on, statement_check=False,
                             **({'replay_cmd': [sys.executable, FAKE_REPLAY]} if on else {})) for on in (False, True)]
    _report(results, before, replay)
    for r in results[1:]:
        print(f"{r['bench']:<18} workers={r['workers']}  {r['ms_per_proof']:>7.3f} ms/proof  ({r['proofs_per_s']} proofs/s, "
              f"{r['pass']} pass / {r['proofs']})", file=sys.stderr)
    off, on = replay
    print(f"kernel replay on the stand-ins: {on['ms_per_proof'] - off['ms_per_proof']:+.3f} ms per passing proof "
          f"({off['ms_per_proof']:.3f} -> {on['ms_per_proof']:.3f} ms; {on['replays']} replays)", file=sys.stderr)
    print(f'(cpu_count={os.cpu_count()}; fake checker answering instantly: these are overheads, not Lean times)', file=sys.stderr)
    return results + before + replay

if __name__ == '__main__': main()

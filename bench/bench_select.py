"""Benchmark: band selection + statistics on synthetic verdict files of 10k..100k problems x 32 samples.

Each size runs in a fresh subprocess (so peak RSS is that run's own): read the pool and a verdict file
with `ei_nb.core.read_frame` (pyarrow), select (`ei_nb.select.run_select`) and score (`ei_nb.eval.score`,
pass@1/8/32). Baseline in the same run: the same verdict file read with a stdlib `json.loads` loop.
Prints rows/s, peak RSS and how time grows with size (should be linear).

    python bench/bench_select.py [--sizes 10000,30000,100000] [--samples 32] [--workdir DIR]
"""
import argparse, json, os, resource, subprocess, sys, tempfile, time
from pathlib import Path

HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"


def make_files(d: Path, n_problems: int, n_samples: int, seed: int = 0):
    import numpy as np, pyarrow as pa, pyarrow.json  # noqa
    import pandas as pd
    rng = np.random.default_rng(seed)
    names = np.array([f'synthetic_{i:07d}' for i in range(n_problems)])
    with open(d / 'pool.jsonl', 'w') as f:
        for i, nm in enumerate(names):
            f.write(json.dumps({'name': str(nm), 'split': 'train', 'header': HEADER,
                                'formal_statement': f'theorem {nm} (x : ℕ) (h₀ : x = {i}) : x + 0 = {i} := by\n'}) + '\n')
    p = rng.beta(0.5, 0.8, n_problems)                     # a skewed pass-rate distribution
    passes = rng.random((n_problems, n_samples)) < p[:, None]
    verdict = np.where(passes, 'pass', np.where(rng.random(passes.shape) < 0.1, 'no_code', 'fail'))
    df = pd.DataFrame({'name': np.repeat(names, n_samples), 'sample_idx': np.tile(np.arange(n_samples), n_problems),
                       'verdict': verdict.ravel(), 'reason': None, 'verify_s': 0.0})
    df.to_json(d / 'verdicts.jsonl', orient='records', lines=True, force_ascii=False)
    return len(df)


def peak_rss_mib() -> float:
    "This process's peak RSS (VmHWM: unlike ru_maxrss it is not inherited from the forking parent)."
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'): return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(d: str, mode: str):
    d = Path(d)
    t0 = time.perf_counter()
    if mode == 'ei':
        from ei_nb.core import read_frame, read_problems, write_records, shared_data
        from ei_nb.select import select_problems
        from ei_nb.eval import score
        protected = [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'test']
        verdicts = read_frame(d / 'verdicts.jsonl', 'verdict', columns=['name', 'sample_idx', 'verdict'])
        t_read = time.perf_counter() - t0
        selected, summary, _ = select_problems(read_problems(d / 'pool.jsonl'), verdicts, protected,
                                               include_zero=True, max_problems=300)
        write_records(d / 'selected.jsonl', selected, 'problem')
        t_sel = time.perf_counter() - t0 - t_read
        stats = score(verdicts, ks=(1, 8, 32))
        extra = {'selected': summary['selected'], 'solved': stats['solved'], 'read_s': t_read, 'select_s': t_sel,
                 'stats_s': time.perf_counter() - t0 - t_read - t_sel}
    else:   # baseline: stdlib JSON loop, counting passes per problem
        counts = {}
        with open(d / 'verdicts.jsonl') as f:
            for line in f:
                r = json.loads(line)
                n, c = counts.get(r['name'], (0, 0))
                counts[r['name']] = (n + 1, c + (r['verdict'] == 'pass'))
        extra = {'problems': len(counts)}
    seconds = time.perf_counter() - t0
    print(json.dumps(dict(extra, seconds=seconds, peak_rss_mib=peak_rss_mib())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--sizes', default='10000,30000,100000')
    ap.add_argument('--samples', type=int, default=32)
    ap.add_argument('--workdir', default=None)
    ap.add_argument('--child', nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child: return child(*a.child)
    env = dict(os.environ, OMP_NUM_THREADS='1')
    rows_out = []
    for n in [int(s) for s in a.sizes.split(',')]:
        d = Path(tempfile.mkdtemp(dir=a.workdir, prefix=f'bench_select_{n}_'))
        n_rows = make_files(d, n, a.samples)
        res = {}
        for mode in ('ei', 'json-loop'):
            out = subprocess.run([sys.executable, __file__, '--child', str(d), mode], capture_output=True, text=True, env=env)
            if out.returncode: sys.exit(out.stderr)
            res[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        r = {'problems': n, 'rows': n_rows, 'ei_s': res['ei']['seconds'], 'ei_rows_per_s': n_rows / res['ei']['seconds'],
             'ei_peak_mib': res['ei']['peak_rss_mib'], 'read_s': res['ei']['read_s'], 'select_s': res['ei']['select_s'],
             'stats_s': res['ei']['stats_s'],
             'loop_s': res['json-loop']['seconds'], 'loop_rows_per_s': n_rows / res['json-loop']['seconds'],
             'speedup_vs_loop': res['json-loop']['seconds'] / res['ei']['seconds']}
        rows_out.append(r)
        print(json.dumps(r), flush=True)
        for f in d.iterdir(): f.unlink()
        d.rmdir()
    print('\n| problems | rows | ei_nb s (read / select / stats) | ei_nb M rows/s | peak RSS MiB | json loop M rows/s | speed-up | s per M rows |')
    print('|---|---|---|---|---|---|---|---|')
    for r in rows_out:
        print(f"| {r['problems']:,} | {r['rows']:,} | {r['ei_s']:.2f} ({r['read_s']:.2f} / {r['select_s']:.2f} / {r['stats_s']:.2f}) | {r['ei_rows_per_s']/1e6:.2f} | {r['ei_peak_mib']:.0f} | "
              f"{r['loop_rows_per_s']/1e6:.2f} | {r['speedup_vs_loop']:.1f}x | {r['ei_s']/r['rows']*1e6:.2f} |")


if __name__ == '__main__':
    main()

"""Benchmark: the read path at scale. `ei select` + `ei stats` on synthetic verdict files of 10k..100k problems x 32 samples
(100k x 32 = 3.2 M rows), end to end, against the raw pyarrow and stdlib paths in the same run.

Every measurement is its own process, started by this small process (Linux counts the RSS a child inherits at fork
in its peak) and waited with `os.wait4`, so its peak RSS and CPU seconds are its own:
- `ei`: the real commands, `ei select --pool --results --protected --out` then `ei stats --verified --k 1,8,32`
  (validated reading: `ei_nb.eval.verdict_counts` counts samples per (problem, verdict) in the counting mode of the
  C scanner of `ei_nb.jsonl_scan`, which checks JSON grammar, UTF-8, duplicate keys in every object at any depth,
  types, finite numbers, and that each problem's sample_idx increases (no duplicate (name, sample_idx) pair); the
  pool is read with `ei_nb.jsonl_scan.scan_problems` while the verdicts are counted; the candidates' statements are
  keyed with `statement_keys`, in C where they are plain, and their structural near-duplicate keys are read from the
  pool's cache (`ei_nb.near_dup.file_digests`); then selection; pass@k; no pandas). The pool is keyed once before the
  timed runs, as `ei pool` does when it writes it (`keying the pool once s`, in its own process; a run's hash cache
  is a folder of its own).
  rows/s = rows / (select s + stats s), each the median of `--repeat` runs. Each command also pays its start
  (the interpreter, numpy, the `ei` script: about 0.1 s). The `ei` beside this interpreter is run, as in an activated
  virtual environment; a version manager's shim in front of it (pyenv's) adds about 0.1 s a call on top.
- `pyarrow`: `pyarrow.json.read_json` of the three needed columns + a group-by, no validation (the floor of that path).
- `stdlib`: a `json.loads` loop counting passes per problem.
- `polars`: `scan_ndjson` of the three columns + a group-by, only when polars is installed (it keeps the first of
  two duplicate keys silently, so `ei_nb` does not use it; shown for scale).
Wall seconds depend on what else runs on the machine; CPU seconds (user + sys) are printed beside them.

    python bench/bench_select.py [--sizes 10000,30000,100000] [--samples 32] [--pool-size N] [--repeat 3] [--workdir DIR]
                                 [--check-cost]

`--pool-size N`: a pool of N statements of which the first `size` are measured (Goedel-Pset: 1.6 M statements).
`select time / pyarrow time`: `ei select` alone (the median run's wall seconds) over the pyarrow read of the same
verdicts (issue 34 asks for at most 0.8), with the same ratio in CPU seconds beside it.

The ratio `ei / pyarrow` (end-to-end rows/s of the two validated commands over one unvalidated pyarrow parse and
group-by, in the same run) is printed beside the absolute numbers: it moves less with the machine's load.

`--check-cost` also times, on the largest file, the C scanner alone (`scan_counts`, what the commands use, and
`scan_file` of the three columns, every check made) and the whole validated frame (`read_frame`), beside the
pyarrow path's UTF-8 scan and parses.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"
REPO = Path(__file__).resolve().parent.parent


def make_files(d: Path, n_problems: int, n_samples: int, pool_size: int = 0, seed: int = 0):
    "A pool of max(`pool_size`, `n_problems`) statements and verdicts of its first `n_problems`, `n_samples` each."
    import numpy as np, pandas as pd
    rng = np.random.default_rng(seed)
    names = np.array([f'synthetic_{i:07d}' for i in range(n_problems)])
    with open(d / 'pool.jsonl', 'w') as f:
        for i in range(max(pool_size, n_problems)):
            nm = f'synthetic_{i:07d}'
            f.write(json.dumps({'name': nm, 'split': 'train', 'header': HEADER,
                                'formal_statement': f'theorem {nm} (x : ℕ) (h₀ : x = {i}) : x + 0 = {i} := by\n'}) + '\n')
    p = rng.beta(0.5, 0.8, n_problems)                     # a skewed pass-rate distribution
    passes = rng.random((n_problems, n_samples)) < p[:, None]
    verdict = np.where(passes, 'pass', np.where(rng.random(passes.shape) < 0.1, 'no_code', 'fail'))
    df = pd.DataFrame({'name': np.repeat(names, n_samples), 'sample_idx': np.tile(np.arange(n_samples), n_problems),
                       'verdict': verdict.ravel(), 'reason': None, 'verify_s': 0.0})
    df.to_json(d / 'verdicts.jsonl', orient='records', lines=True, force_ascii=False)
    return len(df)


def measured(cmd, env) -> dict:
    "Run `cmd`; its wall seconds, CPU seconds, peak RSS (MiB) and last stdout line."
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.stdout.read(), p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode: sys.exit(f'{cmd[:3]} failed ({p.returncode}):\n{err[-3000:]}')
    return {'s': wall, 'cpu_s': ru.ru_utime + ru.ru_stime, 'peak_mib': ru.ru_maxrss / 1024,
            'out': (out.strip().splitlines() or [''])[-1]}


def median_run(cmd, env, repeat: int) -> dict:
    "`measured` `repeat` times: the run of median wall seconds (its CPU and peak are that run's; the peak is the largest seen)."
    runs = sorted((measured(cmd, env) for _ in range(max(1, repeat))), key=lambda m: m['s'])
    return dict(runs[len(runs) // 2], peak_mib=max(m['peak_mib'] for m in runs))


def child(d: str, mode: str):
    d = Path(d)
    if mode == 'pyarrow':
        import pyarrow as pa, pyarrow.json as paj, pyarrow.compute as pc
        s = pa.schema([('name', pa.string()), ('sample_idx', pa.int64()), ('verdict', pa.string())])
        t = paj.read_json(d / 'verdicts.jsonl', parse_options=paj.ParseOptions(explicit_schema=s, unexpected_field_behavior='ignore'))
        t = t.append_column('is_pass', pc.equal(t['verdict'], 'pass'))
        g = t.group_by('name').aggregate([('is_pass', 'sum'), ('is_pass', 'count')])
        print(json.dumps({'problems': g.num_rows}))
    elif mode == 'polars':
        import polars as pl
        g = (pl.scan_ndjson(d / 'verdicts.jsonl', schema={'name': pl.String, 'sample_idx': pl.Int64, 'verdict': pl.String})
             .group_by('name').agg(n=pl.len(), c=(pl.col('verdict') == 'pass').sum()).collect())
        print(json.dumps({'problems': g.height}))
    else:   # stdlib: a json.loads loop, counting passes per problem
        counts = {}
        with open(d / 'verdicts.jsonl') as f:
            for line in f:
                r = json.loads(line)
                n, c = counts.get(r['name'], (0, 0))
                counts[r['name']] = (n + 1, c + (r['verdict'] == 'pass'))
        print(json.dumps({'problems': len(counts)}))


def check_cost(path: Path):
    "CPU (and wall) seconds on one file: the C scanner, the validated frame, the pyarrow path's UTF-8 scan and parses."
    from ei_nb.frames import _utf8_ok, read_frame
    from ei_nb.jsonl_scan import scan_counts, scan_file, scanner
    import pyarrow as pa, pyarrow.json as paj
    cols = ['name', 'sample_idx', 'verdict']
    if scanner():
        for parts in (1, None):
            for label, scan in (('scan_counts', lambda: scan_counts(path, parts=parts)), ('scan_file', lambda: scan_file(path, 'verdict', cols, parts=parts))):
                t, w = time.process_time(), time.perf_counter(); scan()
                print(json.dumps({f'{label}_{parts or "auto"}_parts': {'cpu_s': round(time.process_time() - t, 3), 's': round(time.perf_counter() - w, 3)}}))
        t, w = time.process_time(), time.perf_counter(); read_frame(path, 'verdict', columns=cols)
        print(json.dumps({'read_frame': {'cpu_s': round(time.process_time() - t, 3), 's': round(time.perf_counter() - w, 3)}}))
    if scanner(): select_phases(path.parent)
    t = time.process_time(); _utf8_ok(path); utf8 = time.process_time() - t
    base = [('name', pa.string()), ('sample_idx', pa.int64()), ('verdict', pa.string())]
    cost = {}
    for label, fields in (('3 columns', base), ('+ verify_s', base + [('verify_s', pa.float64())])):
        t = time.process_time()
        paj.read_json(path, parse_options=paj.ParseOptions(explicit_schema=pa.schema(fields), unexpected_field_behavior='ignore'))
        cost[label] = time.process_time() - t
    print(json.dumps({'utf8_scan_cpu_s': round(utf8, 3), 'parse_cpu_s': {k: round(v, 3) for k, v in cost.items()}}))


def select_phases(d: Path):
    "CPU seconds of the parts of `ei select` in this process, one after the other: the pool, the verdict counts, keying the candidates, selecting."
    from ei_nb.core import read_problems, shared_data
    from ei_nb.eval import verdict_counts
    from ei_nb.jsonl_scan import scan_problems, statement_keys
    from ei_nb.select import select_problems
    cpu, t = {}, time.process_time()
    def lap(name):
        nonlocal t
        cpu[name] = round(time.process_time() - t, 3); t = time.process_time()
    pool = scan_problems(d / 'pool.jsonl'); lap('pool (scan_problems)')
    protected = read_problems(shared_data('minif2f_dsp15.jsonl')); lap('protected')
    counts = verdict_counts(d / 'verdicts.jsonl'); lap('verdict counts (verdict_counts)')
    band = {n for n, p in zip(counts.name.tolist(), counts.pass_rate.tolist()) if 0 < p <= 0.75}
    keys = statement_keys([p for p in pool if p['name'] in band]); lap(f'statement_keys ({len(keys)} candidates)')
    select_problems(pool, counts, protected, 0.0, 0.75, True, 100, 300, 0, table=False); lap('select_problems (keying again included)')
    print(json.dumps({'select_phases_cpu_s': cpu}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--sizes', default='10000,30000,100000')
    ap.add_argument('--samples', type=int, default=32)
    ap.add_argument('--repeat', type=int, default=3, help='runs of each ei command per size (the median is reported)')
    ap.add_argument('--workdir', default=None)
    ap.add_argument('--check-cost', action='store_true')
    ap.add_argument('--pool-size', type=int, default=0, help='statements in the pool (default: the problems measured)')
    ap.add_argument('--child', nargs=2, help=argparse.SUPPRESS)
    ap.add_argument('--make', nargs=4, help=argparse.SUPPRESS)
    ap.add_argument('--key-pool', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child: return child(*a.child)
    if a.make: return print(make_files(Path(a.make[0]), int(a.make[1]), int(a.make[2]), int(a.make[3])))
    if a.key_pool: return key_pool(a.key_pool)
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(REPO))
    beside = Path(sys.executable).parent / 'ei'   # the console script itself: a version manager's shim (pyenv's) adds ~0.1 s a call
    ei = str(beside) if beside.exists() else shutil.which('ei') or 'ei'
    print(json.dumps({'ei': ei}))
    from ei_nb.core import shared_data
    protected = shared_data('minif2f_dsp15.jsonl')
    modes = ['pyarrow', 'stdlib'] + (['polars'] if _has('polars') else [])
    rows_out = []
    if a.workdir: Path(a.workdir).mkdir(parents=True, exist_ok=True)
    for n in [int(s) for s in a.sizes.split(',')]:
        d = Path(tempfile.mkdtemp(dir=a.workdir, prefix=f'bench_select_{n}_'))
        made = subprocess.run([sys.executable, __file__, '--make', str(d), str(n), str(a.samples), str(a.pool_size)], env=env,
                              capture_output=True, text=True)
        if made.returncode: sys.exit(made.stderr)
        n_rows = int(made.stdout.split()[-1])   # made in a child: this process stays small, and a child's peak RSS is its own
        env['EI_HASH_CACHE'] = str(d / 'hash_cache')   # this file's keys: empty until `ei pool` (here: key_pool) keys it
        once = measured([sys.executable, __file__, '--key-pool', str(d / 'pool.jsonl')], env)
        sel = median_run([ei, 'select', '--pool', str(d/'pool.jsonl'), '--results', str(d/'verdicts.jsonl'), '--protected', str(protected),
                          '--out', str(d/'selected.jsonl'), '--include-zero', '--max-problems', '300'], env, a.repeat)
        ks = ','.join(str(k) for k in (1, 8, 32) if k <= a.samples)
        st = median_run([ei, 'stats', '--verified', str(d/'verdicts.jsonl'), '--k', ks], env, a.repeat)
        r = {'problems': n, 'rows': n_rows, 'select_s': sel['s'], 'stats_s': st['s'], 'ei_cpu_s': sel['cpu_s'] + st['cpu_s'],
             'ei_rows_per_s': n_rows / (sel['s'] + st['s']), 'ei_rows_per_cpu_s': n_rows / (sel['cpu_s'] + st['cpu_s']),
             'ei_peak_mib': max(sel['peak_mib'], st['peak_mib']), 'solved': json.loads(st['out'])['solved'],
             'pool': max(n, a.pool_size), 'keying_once_s': once['s'], 'select_cpu_s': sel['cpu_s']}
        for m in modes:
            res = measured([sys.executable, __file__, '--child', str(d), m], env)
            r |= {f'{m}_rows_per_s': n_rows / res['s'], f'{m}_rows_per_cpu_s': n_rows / res['cpu_s'], f'{m}_peak_mib': res['peak_mib']}
        r['ei_over_pyarrow'] = r['ei_rows_per_s'] / r['pyarrow_rows_per_s']
        r['select_time_over_pyarrow'] = r['select_s'] / (n_rows / r['pyarrow_rows_per_s'])   # <= 0.8: issue 34's bar
        r['select_cpu_over_pyarrow'] = r['select_cpu_s'] / (n_rows / r['pyarrow_rows_per_cpu_s'])
        rows_out.append(r)
        print(json.dumps(r), flush=True)
        if a.check_cost and n == max(int(s) for s in a.sizes.split(',')): check_cost(d/'verdicts.jsonl')
        shutil.rmtree(d)
    head = ' | '.join(f'{m} M rows/s (per CPU s)' for m in modes)
    print(f'\n| pool | problems | rows | ei select + stats s | ei M rows/s (per CPU s) | ei / pyarrow | select time / pyarrow '
          f'time (CPU) | keying the pool once s | ei peak MiB | {head} |')
    print('|---|---|---|---|---|---|---|---|---|' + '---|' * len(modes))
    for r in rows_out:
        other = ' | '.join(f"{r[f'{m}_rows_per_s']/1e6:.2f} ({r[f'{m}_rows_per_cpu_s']/1e6:.2f})" for m in modes)
        once = f"{r['keying_once_s']:.1f}"
        print(f"| {r['pool']:,} | {r['problems']:,} | {r['rows']:,} | {r['select_s']:.2f} + {r['stats_s']:.2f} | "
              f"{r['ei_rows_per_s']/1e6:.2f} ({r['ei_rows_per_cpu_s']/1e6:.2f}) | {r['ei_over_pyarrow']:.2f} | "
              f"{r['select_time_over_pyarrow']:.2f} ({r['select_cpu_over_pyarrow']:.2f}) | {once} | {r['ei_peak_mib']:.0f} | {other} |")


def key_pool(path):
    "What `ei pool` does after writing the pool (and `ei select` at its first read): key the pool file once."
    from ei_nb.select import read_pool
    print(json.dumps({'keyed': len(read_pool(path).digests)}))


def _has(mod):
    import importlib.util
    return importlib.util.find_spec(mod) is not None


if __name__ == '__main__':
    main()

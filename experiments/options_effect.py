#!/usr/bin/env python
"""Each option of the recipe on the learning demo, against the plain demo on the same seeds: S per round and McNemar.

    python experiments/options_effect.py                       # plain + corrections, dpo, unlikely, conjectures
    python experiments/options_effect.py --only dpo,unlikely   # a subset (plain is always run or reused)
    python experiments/options_effect.py --runs DIR --rounds 2   # shorter option runs, each against plain's round 2

Runs `ei run --config configs/demo_learn.toml` into RUNS/plain, then each option's config (configs/demo_learn_NAME.toml)
into RUNS/NAME, starting from a copy of plain's round 0 (the same demo set-up, warm-started base model, pool measurement
and baseline: the driver's markers match, so round 0 is not recomputed and every run starts from the identical base).
A finished run is reused (the driver skips finished steps): rerun after a code change with a fresh --runs folder.
Then, per run: S_0..S_R, the stop decision, McNemar of the last round against the base and against plain's round
of the same number (the same scored set, the same eval seed and settings), and the option's own counts (corrections verified, DPO
pairs, conjectures kept, uplift). Writes RUNS/options_effect.json and prints a markdown table.

Kept to rerun the comparison after method changes (measured numbers: experiments/results/phaseB.md).
"""
import argparse, json, os, shutil, subprocess, sys, time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPTIONS = ('corrections', 'dpo', 'unlikely', 'conjectures')
ROUND0 = ('demo', 'inputs', 'round_00')


def ei_run(config:Path, run_dir:Path, sets:list, log:Path, more:list=()) -> int:
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'TOKENIZERS_PARALLELISM': 'false', 'MPLBACKEND': 'Agg'}
    cmd = [sys.executable, '-c', 'import sys; from ei_nb.cli import _entry; sys.argv[0] = "ei"; _entry()', 'run', '--config', str(config),
           '--run-dir', str(run_dir), *more] + [x for s in sets for x in ('--set', s)]
    with open(log, 'w') as f: return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode


def solved(path:Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        v = json.loads(line); out[v['name']] = out.get(v['name'], False) or v['verdict'] == 'pass'
    return out


def mcnemar(a:dict, b:dict) -> dict:
    from ei_nb.report import mcnemar_p
    bb, cc = sum(a[k] and not b[k] for k in a), sum(b[k] and not a[k] for k in a)
    return {'b': bb, 'c': cc, 'p': round(mcnemar_p(bb, cc), 6)}


def headline(run_dir:Path, r:int, stage:str) -> dict:
    p = run_dir/f'round_{r:02d}'/'stages'/f'{stage}.json'
    return json.loads(p.read_text()) if p.exists() else {}


def option_counts(run_dir:Path, rounds:int) -> list[dict]:
    "Per round, what the option did (from the stages' own summaries)."
    out = []
    for r in range(1, rounds + 1):
        row, sft = {}, headline(run_dir, r, '02_sft')
        d = {**sft.get('headline', {}), **sft.get('detail', {})}
        row |= {k: d[k] for k in ('rows', 'correction_rows', 'conjecture_rows', 'pairs', 'dpo_pairs', 'objective') if k in d}
        if (c := headline(run_dir, r, '01c_correct')):
            n = {**c.get('headline', {}), **c.get('detail', {})}
            row |= {f'correct_{k}': n.get(k) for k in ('failures_tried', 'corrections_verified', 'failures_fixed', 'rows')}
        if (c := headline(run_dir, r, '00b_conjecture')):
            n = {**c.get('headline', {}), **c.get('detail', {})}
            row |= {f'conj_{k}': n.get(k) for k in ('seeds', 'prompts', 'generated', 'parsed', 'elaborated', 'proved', 'kept', 'candidates')}
        if (c := headline(run_dir, r, '03c_sharpen')):
            row['uplift'] = c.get('headline')
        out.append(row)
    return out


def summarize(run_dir:Path, plain:Path|None) -> dict:
    "S per round, the stop decision, McNemar of the last round against the base and against plain's SAME round."
    s = json.loads((run_dir/'run_summary.json').read_text())
    last = s['rounds']
    base = solved(run_dir/'round_00'/'eval'/'eval_verdicts.jsonl')
    final = solved(run_dir/f'round_{last:02d}'/'eval'/'eval_verdicts.jsonl')
    plain_same = solved(plain/f'round_{last:02d}'/'eval'/'eval_verdicts.jsonl') if plain else None
    return {'S': [s['S_0'], *s['scores']], 'decision': s['decision'], 'wall_s': s['wall_s'],
            'vs_base': mcnemar(base, final), 'vs_plain': mcnemar(plain_same, final) if plain else None,
            'option': option_counts(run_dir, last)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--runs', default=str(REPO/'runs'/'options'), help='folder of the runs (reused when finished)')
    ap.add_argument('--only', help=f'comma-separated options among {",".join(OPTIONS)}')
    ap.add_argument('--set', action='append', default=[], help='SECTION.KEY=VALUE passed to every `ei run`')
    ap.add_argument('--rounds', type=int, help="round budget of the option runs (compared with plain's same round)")
    a = ap.parse_args(argv)
    runs, names = Path(a.runs), [n.strip() for n in (a.only or ','.join(OPTIONS)).split(',') if n.strip()]
    if bad := set(names) - set(OPTIONS): sys.exit(f'unknown option(s) {sorted(bad)}: use {OPTIONS}')
    runs.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rc = ei_run(REPO/'configs'/'demo_learn.toml', runs/'plain', a.set, runs/'plain.log')
    if rc != 0: sys.exit(f'plain run failed (exit {rc}): see {runs/"plain.log"}')
    res = {'plain': summarize(runs/'plain', None)}
    more = ['--rounds', str(a.rounds)] if a.rounds else []
    for name in names:
        d = runs/name
        if not d.exists():
            d.mkdir()
            for sub in ROUND0: shutil.copytree(runs/'plain'/sub, d/sub, symlinks=True)
        rc = ei_run(REPO/'configs'/f'demo_learn_{name}.toml', d, a.set, runs/f'{name}.log', more)
        res[name] = summarize(d, runs/'plain') if rc == 0 else {'exit': rc, 'log': str(runs/f'{name}.log')}
        print(json.dumps({name: {k: res[name].get(k) for k in ('S', 'vs_base', 'vs_plain', 'exit')}}), flush=True)
        (runs/'options_effect.json').write_text(json.dumps(res, indent=1) + '\n')   # after each option: a partial comparison survives
    res['_'] = {'sets': a.set, 'wall_s': round(time.time() - t0, 1), 'loadavg_after': os.getloadavg()}
    (runs/'options_effect.json').write_text(json.dumps(res, indent=1) + '\n')
    print('\n| config | S_0..S_R | stop | McNemar last vs base (b/c/p) | last vs plain, same round (b/c/p) |\n|---|---|---|---|---|')
    for name, r in res.items():
        if name == '_' or 'S' not in r: continue
        vp = r['vs_plain']
        print(f"| {name} | {', '.join(map(str, r['S']))} | {r['decision'].get('reason')} | {r['vs_base']['b']}/{r['vs_base']['c']}/{r['vs_base']['p']:.2g} | "
              + (f"{vp['b']}/{vp['c']}/{vp['p']:.2g} |" if vp else '— |'))
    return 0


if __name__ == '__main__':
    sys.exit(main())

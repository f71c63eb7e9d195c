#!/usr/bin/env python
"""`ei run` with the wall AND CPU seconds of every step, and the load average around it.

    python experiments/time_run.py --out RESULT.json -- --config configs/demo_learn.toml [--run-dir DIR] [--set ...]

Runs the `ei run` command in this process (the same code path as the console script), with each step's execution
wrapped: CPU seconds are `resource.getrusage(RUSAGE_CHILDREN)` differences (a stage runs in a papermill child process
whose Jupyter kernel it reaps, so the child's CPU includes the kernel's), the driver's own CPU is `RUSAGE_SELF`. The
load average (1 min) is read before and after every step: on a shared machine it says how much the wall seconds are
inflated by other work. Writes RESULT.json: per step {round, stage, wall_s, cpu_s, load_before, load_after}, the totals
and the run summary. This is measurement only; nothing of the package is changed (the wrapper lives in this process).
"""
import argparse, json, os, resource, sys, time
from pathlib import Path


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN); return r.ru_utime + r.ru_stime


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', required=True, help='result JSON')
    ap.add_argument('run_args', nargs=argparse.REMAINDER, help='-- then the arguments of `ei run`')
    a = ap.parse_args(argv)
    args = [x for x in a.run_args if x != '--']
    os.environ.setdefault('OMP_NUM_THREADS', '1'); os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')
    from ei_nb import step as step_module
    from ei_nb.cli import main as ei_main
    steps, original = [], step_module.Steps.execute

    def execute(self, rnd, stage, params, chain):
        c0, l0, t0 = cpu_children(), os.getloadavg()[0], time.time()
        out = original(self, rnd, stage, params, chain)
        rec = {'round': rnd, 'stage': stage, 'wall_s': round(time.time() - t0, 2), 'cpu_s': round(cpu_children() - c0, 2),
               'load_before': round(l0, 2), 'load_after': round(os.getloadavg()[0], 2)}
        steps.append(rec); print('time_run: ' + json.dumps(rec), file=sys.stderr, flush=True)
        return out

    step_module.Steps.execute = execute
    t0, c0, s0, load0 = time.time(), cpu_children(), cpu_self(), os.getloadavg()
    rc = ei_main(['run', *args])
    res = {'argv': args, 'exit': rc, 'wall_s': round(time.time() - t0, 1), 'cpu_children_s': round(cpu_children() - c0, 1),
           'cpu_driver_s': round(cpu_self() - s0, 1), 'loadavg_before': load0, 'loadavg_after': os.getloadavg(), 'steps': steps,
           'cpu_by_stage': {}, 'wall_by_stage': {}}
    for s in steps:
        res['cpu_by_stage'][s['stage']] = round(res['cpu_by_stage'].get(s['stage'], 0) + s['cpu_s'], 1)
        res['wall_by_stage'][s['stage']] = round(res['wall_by_stage'].get(s['stage'], 0) + s['wall_s'], 1)
    res['cpu_total_s'] = round(res['cpu_children_s'] + res['cpu_driver_s'], 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + '\n')
    print(json.dumps({k: res[k] for k in ('exit', 'wall_s', 'cpu_total_s', 'cpu_by_stage', 'loadavg_before', 'loadavg_after')}))
    return rc


if __name__ == '__main__':
    sys.exit(main())

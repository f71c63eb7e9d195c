#!/usr/bin/env python
"""One line per prototype run: S per round, pool pass rate per round, McNemar b/c/p of the last round vs the base, CPU and wall seconds.

    python experiments/summarize.py /tmp/ei_arith/*/result.json
"""
import json, sys
from pathlib import Path

def line(path) -> str:
    r = json.loads(Path(path).read_text())
    mc, ph = r['mcnemar_last_vs_base'], {}
    for p in r['phases']:
        kind = p['phase'].split(' ', 1)[1] if p['phase'][:1] == 'r' and p['phase'][1:2].isdigit() else p['phase']
        ph[kind] = round(ph.get(kind, 0) + p['cpu_s'], 1)
    return (f"{Path(path).parent.name:18} seed {r['recipe']['seed']} mutant {str(r['mutant']):12} S {r['S']}  "
            f"pool p {[x['pool_pass_rate'] for x in r['rounds']]}  rows {[x['rows'] for x in r['rounds']]}  "
            f"b/c/p {mc['b']}/{mc['c']}/{mc['p_value']:.2g}  cpu {r['total_cpu_s']} s {ph}  wall {r['total_wall_s']} s  "
            f"load {r['uptime_after'].split('load average:')[1].strip()}")

if __name__ == '__main__':
    for p in sys.argv[1:]: print(line(p))

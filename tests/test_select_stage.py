"""The selection stage as the driver runs it (papermill, injected parameters), not only its library: pool problems
measured above the band are left out, those in the band and the unsolved ones (include_zero) are taken.

This is the runner's wiring, which the library's own tests cannot see: a runner that passed `lo = 0, hi = 1` (the
`learn-band-everything` mutant of tests/mutation_check.py) or the solved end (`learn-band-solved`) selects the wrong
problems here. Real problem records of the arith fragment, crafted verdicts."""
import json
from pathlib import Path
import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_stage_selects_the_band_and_the_unsolved_and_leaves_the_solved(tmp_path):
    import papermill as pm
    from ei_nb.arith import arith_sets
    from ei_nb.core import read_problems, write_records
    pool = arith_sets(5, {}, {'2+2': 12}, {})['pool']
    rate = {p['name']: [1.0, 0.875, 0.5, 0.25, 0.0, 0.0][i % 6] for i, p in enumerate(pool)}   # 8 samples each
    verdicts = [{'name': n, 'sample_idx': j, 'verdict': 'pass' if j < round(r * 8) else 'fail',
                 'reason': None if j < round(r * 8) else 'lean error: line 9: unsolved goals\n⊢ False', 'proof': 'x'}
                for n, r in rate.items() for j in range(8)]
    write_records(tmp_path/'pool.jsonl', pool, 'problem')
    (tmp_path/'verdicts.jsonl').write_text(''.join(json.dumps(v) + '\n' for v in verdicts))
    out = tmp_path/'round'
    pm.execute_notebook(str(REPO/'nbs'/'00_select.ipynb'), str(tmp_path/'00_select.ipynb'), kernel_name='python3',
                        parameters={'pool_path': str(tmp_path/'pool.jsonl'), 'results_path': str(tmp_path/'verdicts.jsonl'),
                                    'out_dir': str(out), 'lo': 0.0, 'hi': 0.75, 'include_zero': True, 'max_zero': 100,
                                    'max_problems': 100, 'seed': 0},
                        progress_bar=False, cwd=str(tmp_path))
    chosen = {p['name'] for p in read_problems(out/'selected.jsonl')}
    want = {n for n, r in rate.items() if r <= 0.75}
    assert chosen == want, (sorted(chosen - want), sorted(want - chosen))
    assert {n for n, r in rate.items() if r > 0.75} and not {n for n, r in rate.items() if r > 0.75} & chosen

"""The training stage as the driver runs it (papermill, injected parameters): the rows it trains on are verified
proofs only, the shortest of each problem first; the `unverified` control draws as many rows from every well-formed
sample instead. Real arith problem records; samples written as the completion-style sampler writes them; verdicts as
the arith checker gives them. A runner that fed the keep rules the unverified verdicts (the `learn-keep-every-sample`
mutant of tests/mutation_check.py) or ranked longest first (`learn-keep-longest`) trains on other rows here."""
import json
from pathlib import Path
import pytest

REPO = Path(__file__).resolve().parents[1]


def _inputs(tmp_path:Path):
    from ei_nb.arith import arith_proof, arith_sets, arith_verifier, parse_statement
    from ei_nb.core import write_records
    from ei_nb.prompts import verifiable_text
    problems = arith_sets(3, {}, {'2+2': 7}, {})['pool']
    samples, verdicts, v = [], [], arith_verifier()
    for k, p in enumerate(problems):
        value = parse_statement(p)[2]
        texts = [arith_proof(p, 'refine'), arith_proof(p, 'exact'), f'  use {value + 1}',   # the shortest is wrong
                 f'  exact ⟨{value + 2}, by norm_num⟩']
        if k == 6: texts = [arith_proof(p, 'refine'), arith_proof(p, 'exact')]   # solved by every sample
        for i, t in enumerate(texts):
            s = {'name': p['name'], 'sample_idx': i, 'round': 1, 'completion': t, 'n_tokens': len(t) // 2, 'capped': False}
            samples.append(s)   # the checker reads the whole file, as the pipeline gives it for completion prompts
            verdicts.append(v.verify_one(p, s | {'completion': verifiable_text(p, t, 'completion')}))
    for name, rows, kind in (('problems', problems, 'problem'), ('samples', samples, 'sample'), ('verdicts', verdicts, 'verdict')):
        write_records(tmp_path/f'{name}.jsonl', rows, kind)
    return problems, samples, verdicts


def _stage(tmp_path:Path, **params) -> list[dict]:
    import papermill as pm
    out = tmp_path/'round'
    pm.execute_notebook(str(REPO/'nbs'/'02_sft.ipynb'), str(tmp_path/'02_sft.ipynb'), kernel_name='python3',
                        parameters={'problems_path': str(tmp_path/'problems.jsonl'), 'samples_path': str(tmp_path/'samples.jsonl'),
                                    'verdicts_path': str(tmp_path/'verdicts.jsonl'), 'out_dir': str(out), 'style': 'completion',
                                    'max_per_problem': 1, 'min_rows': 1, 'epochs': 1, 'max_steps': 1, 'batch_tokens': 512,
                                    'save_every': 1000, **params},
                        progress_bar=False, cwd=str(tmp_path))
    return [json.loads(l) for l in (out/'sft.jsonl').read_text().splitlines()]


def test_the_stage_trains_on_the_shortest_verified_proof_of_each_problem(tmp_path):
    problems, samples, verdicts = _inputs(tmp_path)
    passed = {(v['name'], v['sample_idx']) for v in verdicts if v['verdict'] == 'pass'}
    assert len(passed) == 2 * len(problems)   # refine and exact pass, the wrong values fail
    assert all(v['reason'].startswith('lean error: ') for v in verdicts if v['verdict'] != 'pass')   # well-formed
    rows = _stage(tmp_path)
    assert sorted(r['name'] for r in rows) == sorted(p['name'] for p in problems[:6])   # the 7th: solved by every sample
    assert all((r['name'], r['sample_idx']) in passed for r in rows)
    assert {r['sample_idx'] for r in rows} == {1}   # `exact` is shorter than `refine` + `norm_num`; `use` is wrong


def test_the_unverified_control_trains_on_as_many_rows_from_every_well_formed_sample(tmp_path):
    problems, samples, verdicts = _inputs(tmp_path)
    rows = _stage(tmp_path, control='unverified')   # and a problem solved by every sample is left out, as in plain
    assert len(rows) == len(problems) - 1 and {r['control'] for r in rows} == {'unverified'}
    assert {r['sample_idx'] for r in rows} == {2}   # the shortest well-formed sample of each problem: the wrong `use`

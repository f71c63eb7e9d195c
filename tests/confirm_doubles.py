"""Test doubles of `ei confirm`: a synthetic model folder, a runner with `run_eval`'s contract that needs no model and
no Lean, and a whole synthetic confirmation. The protocol (hashes, lock, forced reruns, resumption, the report) does
not depend on what a model generates, so `nbs/tools/confirm.ipynb`, `nbs/tools/confirm_report.ipynb` and `tests/test_confirm.py`
exercise it with these. Each verdict is a seeded hash of (model fingerprint, problem, sample index, seed) compared with a
per-problem pass probability set by the model folder's `synthetic.json` skill; the runner resumes problem by problem,
and `_interrupt_after` simulates a crash after that many new problems. Its verdicts have `reason = 'synthetic'` and its
name (`tests.confirm_doubles:synthetic_runner`) is in the registration, so a synthetic confirmation cannot pass for a
real one."""
import hashlib, random
from pathlib import Path
from ei_nb.core import BadInput, atomic_write_bytes, atomic_write_json, iter_jsonl, jsonl_bytes, read_json
from ei_nb.layout import EvalLayout, RunLayout, write_stage_json
from ei_nb.confirm import ARMS, load_test_problems, model_fingerprint, register, run_confirmation

RUNNER = 'tests.confirm_doubles:synthetic_runner'


def synthetic_model(out_dir, # folder to create
                    skill:float=0.2, # how often `synthetic_runner` lets this model pass
                    seed:int=0) -> Path:
    "A stand-in model folder: random bytes as weights, a config, a skill."
    out = Path(out_dir); out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out/'model.safetensors', random.Random(seed).randbytes(4096))
    atomic_write_json(out/'config.json', {'model_type': 'synthetic'})
    atomic_write_json(out/'synthetic.json', {'skill': skill, 'seed': seed})
    return out


def _unit(*keys) -> float:
    return int.from_bytes(hashlib.sha256('\x1f'.join(map(str, keys)).encode()).digest()[:8], 'big') / 2**64


def _synthetic_rows(p:dict, fp:str, skill:float, n:int, seed:int) -> tuple[list, list]:
    rate = max(0.0, skill - 0.6 * _unit('difficulty', p['name'])) * 2
    passed = [_unit(fp, p['name'], i, seed) < rate for i in range(n)]
    samples = [{'name': p['name'], 'sample_idx': i, 'round': 0, 'completion': 'synthetic', 'n_tokens': 1, 'capped': False} for i in range(n)]
    verdicts = [{'name': p['name'], 'sample_idx': i, 'verdict': 'pass' if ok else 'fail', 'reason': 'synthetic',
                 'proof': None, 'verify_s': 0.0} for i, ok in enumerate(passed)]
    return samples, verdicts


def synthetic_runner(problems:list[dict], # problem records
                     model_dir, # a `synthetic_model` folder (any model folder works: skill 0.2)
                     out_dir, # an evaluation folder (`EvalLayout`): samples, verdicts and its stage.json go there
                     n:int=8, max_new_tokens:int=64, seed:int=0, verify_backend:str='synthetic',
                     allow_test_selection:bool=False, _interrupt_after:int|None=None) -> dict:
    "`run_eval`'s contract with seeded fake verdicts, resumable per problem."
    if not allow_test_selection and any(p.get('split') == 'test' for p in problems):
        raise BadInput('test-split problems need allow_test_selection=True')
    files, fp = EvalLayout(Path(out_dir)), model_fingerprint(model_dir)['fingerprint']
    skill = (read_json(Path(model_dir)/'synthetic.json') or {}).get('skill', 0.2)
    files.dir.mkdir(parents=True, exist_ok=True)
    samples = [r for _, r in iter_jsonl(files.samples)] if files.samples.exists() else []
    verdicts = [r for _, r in iter_jsonl(files.verdicts)] if files.verdicts.exists() else []
    done, new = {v['name'] for v in verdicts}, 0
    for p in problems:
        if p['name'] in done: continue
        if _interrupt_after is not None and new >= _interrupt_after: raise KeyboardInterrupt('synthetic interruption')
        s, v = _synthetic_rows(p, fp, skill, n, seed)
        samples += s; verdicts += v; new += 1
        atomic_write_bytes(files.samples, jsonl_bytes(samples)); atomic_write_bytes(files.verdicts, jsonl_bytes(verdicts))
    summary = {'solved': len({v['name'] for v in verdicts if v['verdict'] == 'pass'}), 'n_problems': len(problems), 'n_samples': len(samples)}
    write_stage_json(files.stage_json, '04_eval', {'model': model_dir}, {'samples': files.samples, 'verdicts': files.verdicts},
                     {'n': n, 'max_new_tokens': max_new_tokens, 'seed': seed, 'verify_backend': verify_backend}, summary, 0.0,
                     detail={'runner': 'synthetic'})
    return summary


def synthetic_confirmation(run_dir, # run folder to create
                           n_problems:int=24, n:int=8, skills=(0.45, 0.25), # (model, baseline)
                           report:bool=False) -> Path:
    "A finished confirmation of two synthetic models on the first `n_problems` test problems; returns `RUN/confirm`."
    run_dir = Path(run_dir)
    sub = run_dir/'test_subset.jsonl'
    atomic_write_bytes(sub, jsonl_bytes(load_test_problems()[0][:n_problems]))
    m, b = (synthetic_model(run_dir/'models'/k, s, seed=i) for i, (k, s) in enumerate(zip(ARMS, skills)))
    register(run_dir, model=m, baseline_model=b, n=n, max_new_tokens=64, problems=sub, runner=RUNNER)
    run_confirmation(run_dir, report=report)
    return RunLayout(run_dir).confirm.dir

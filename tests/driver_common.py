"""What the tests of `ei run` share: the small demo run, its session fixtures and the helpers that compare runs.

The runs are real: the demo config (tiny warm-started Qwen3, known-proof verifier) shrunk to one round on a
pool of 10 problems. One run to the end of round 0 is shared; the reference run continues it through round 1;
every other test works on a copy of one of them, so the tests are independent of each other.
"""
import hashlib, json, os, re, shutil, signal, subprocess, sys, time
from pathlib import Path
import pytest
from ei_nb.core import iter_jsonl, read_problems, statement_key, shared_data

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO/'configs'/'demo.toml'
SMALL = ['--rounds', '1', '--set', 'demo.pool_size=10', '--set', 'demo.warm_pool=6', '--set', 'demo.scored_size=6',
         '--set', 'demo.warm_scored=3', '--set', 'demo.epochs=40', '--set', 'eval.max_new_tokens=96']
ROUND1 = ['00_select', '01_sample_verify', '02_sft', '03_average', '04_eval', '05_stop_rule', '06_report']
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'TOKENIZERS_PARALLELISM': 'false'}
ENTRY = 'import sys; from ei_nb.cli import _entry; sys.argv[0] = "ei"; _entry()'


def ei_cmd(run_dir, *args, config=DEMO):
    return [sys.executable, '-c', ENTRY, 'run', '--config', str(config), '--run-dir', str(run_dir), *SMALL, *args]

def ei(run_dir, *args, config=DEMO, timeout=1200):
    "Run `ei run` on `run_dir` to the end; the CompletedProcess."
    return subprocess.run(ei_cmd(run_dir, *args, config=config), capture_output=True, text=True, env=ENV, timeout=timeout)

def executed(stderr:str) -> list[str]:
    "The steps a driver executed, from its progress lines."
    return re.findall(r'^ei run: (\S+) -> ', stderr, re.M)

def tagged(run_dir) -> list[int]:
    "Live processes started for this run (kernels, stage children)."
    from ei_nb.stage_process import tagged_pids
    return tagged_pids(str(Path(run_dir).resolve()))

def copy_run(src, dst) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return Path(dst)

def _h(path) -> str: return hashlib.sha256(Path(path).read_bytes()).hexdigest()

def _records(path, drop=('verify_s',)) -> str:
    rows = [{k: v for k, v in r.items() if k not in drop} for _, r in iter_jsonl(path)]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()

def artefacts(run_dir) -> dict:
    "What an uninterrupted run and a killed-and-resumed one must agree on (timings left out)."
    d, out = Path(run_dir)/'round_01', {}
    for name in ('samples.jsonl', 'verdicts.jsonl', 'eval/eval_samples.jsonl', 'eval/eval_verdicts.jsonl'):
        out[f'round_00/{name}'] = _records(Path(run_dir)/'round_00'/name)
    for name in ('selected.jsonl', 'samples.jsonl', 'verdicts.jsonl', 'sft.jsonl', 'eval/eval_samples.jsonl', 'eval/eval_verdicts.jsonl'):
        out[name] = _records(d/name)
    out['decision'] = json.loads((d/'stages'/'05_stop_rule.json').read_text())['headline']
    out['select'] = json.loads((d/'stages'/'00_select.json').read_text())['headline']
    for sub in ('merged', 'model'):
        for f in sorted((d/sub).glob('*.safetensors')): out[f'{sub}/{f.name}'] = _h(f)
    ev = json.loads((d/'stages'/'04_eval.json').read_text())['headline']
    out['eval'] = (ev['solved'], ev['pass_at_k'])
    for m in sorted(Path(run_dir).glob('**/stages/*.done')):
        if 'superseded' not in m.parts: out[str(m.relative_to(run_dir))] = json.loads(m.read_text())['chain']
    return out


@pytest.fixture(scope='session')
def round0(tmp_path_factory) -> Path:
    "The small demo run up to the end of round 0 (demo set-up, inputs, pool measurement, baseline)."
    run = tmp_path_factory.mktemp('ei_run')/'round0'
    p = ei(run, '--until', '0:04_eval')
    assert p.returncode == 0, p.stderr[-3000:]
    return run

@pytest.fixture(scope='session')
def reference(round0, tmp_path_factory) -> Path:
    "The uninterrupted reference: round 0 copied, then round 1 and the final report."
    run = copy_run(round0, tmp_path_factory.mktemp('ei_run')/'reference')
    p = ei(run)
    assert p.returncode == 0, p.stderr[-3000:]
    got = [f'1:{s}' for s in ROUND1]
    assert [x for x in executed(p.stderr) if x.startswith('1:')] == got, 'round 1 did not run all seven stages (data stop?): ' + p.stderr[-2000:]
    return run

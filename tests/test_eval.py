"""`ei eval` and the 04_eval runner end to end on a tiny model and real miniF2F-valid statements (CPU)."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from ei_nb import eval as E
from ei_nb.cli import main
from ei_nb.core import read_problems, read_samples, read_verdicts, sha256_file, shared_data, write_records
from ei_nb.layout import EvalLayout, read_stage_json, stage_numbers
from ei_nb.samplers import DelayVerifier, SampleParams
from ei_nb.sample_job import SamplerSetup
from ei_nb.verify import VerifierSettings


def run_eval(problems, model_dir, out_dir, n, max_new_tokens, seed=0, verify_backend='none', **kw):
    "`run_eval` with the sampling of a test: transformers, chat prompts, 4 problems a chunk."
    return E.run_eval(problems, model_dir, out_dir, SampleParams(n=n, max_new_tokens=max_new_tokens, seed=seed),
                      VerifierSettings(verify_backend), SamplerSetup('transformers', None, 'chat', 4, 0.5), 0, False, **kw)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def model_dir(tiny_model_dir):
    return tiny_model_dir


@pytest.fixture(scope='module')
def minif2f():
    return read_problems(shared_data('minif2f_dsp15.jsonl'))


@pytest.fixture(scope='module')
def valid_file(minif2f, tmp_path_factory):
    f = tmp_path_factory.mktemp('p') / 'valid8.jsonl'
    write_records(f, [p for p in minif2f if p['split'] == 'valid'][:8], 'problem')
    return f


def last_json(out): return json.loads(out.strip().splitlines()[-1])


def test_ei_eval_end_to_end(model_dir, valid_file, tmp_path, capsys):
    rc = main(['eval', '--problems', str(valid_file), '--model', str(model_dir), '--out-dir', str(tmp_path),
               '--n', '2', '--max-new-tokens', '16'])
    assert rc == 0
    printed = last_json(capsys.readouterr().out)
    rec = read_stage_json(EvalLayout(tmp_path).stage_json)                # its one summary, named by the layout
    assert stage_numbers(EvalLayout(tmp_path).stage_json) == json.loads(json.dumps(printed)) | {'work': 16}
    assert rec['stage'] == '04_eval' and rec["inputs"]["problems"]["sha256"] == sha256_file(valid_file)
    assert set(rec['outputs']) == {'samples', 'verdicts', 'plot'} and rec['params']['max_new_tokens'] == 16
    assert not (tmp_path / 'eval.json').exists()
    assert (printed['solved'], printed['n_problems'], set(printed['pass_at_k'])) == (0, 8, {'1', '2'})
    assert printed['n_samples'] == 16 and 0 <= printed['capped_frac'] <= 1 and printed['mean_tokens'] <= 16
    assert printed['sampler']['max_new_tokens'] == 16 and printed['verifier']['backend'] == 'none'
    assert len(read_samples(tmp_path / 'eval_samples.jsonl')) == len(read_verdicts(tmp_path / 'eval_verdicts.jsonl')) == 16
    assert (tmp_path / 'eval.png').stat().st_size > 0


def test_test_split_refused_unless_allowed(model_dir, minif2f, tmp_path, capsys):
    mixed = tmp_path / 'mixed.jsonl'
    write_records(mixed, [p for p in minif2f if p['split'] == 'valid'][:1] + [p for p in minif2f if p['split'] == 'test'][:1], 'problem')
    args = ['eval', '--problems', str(mixed), '--model', str(model_dir), '--n', '1', '--max-new-tokens', '4']
    assert main(args + ['--out-dir', str(tmp_path / 'refused')]) == 2
    assert 'test split' in capsys.readouterr().err and not (tmp_path / 'refused').exists()
    assert main(args + ['--out-dir', str(tmp_path / 'diag'), '--allow-test-selection']) == 0
    out = last_json(capsys.readouterr().out)
    assert out['n_problems'] == 2 and out['allow_test_selection'] and out['problems']['splits'] == ['test', 'valid']
    # --split keeps the shared file usable as it is
    assert main(['eval', '--problems', str(shared_data('minif2f_dsp15.jsonl')), '--split', 'nope', '--model', str(model_dir),
                 '--out-dir', str(tmp_path / 'x')]) == 2


def test_scores_passes_from_the_verifier(model_dir, valid_file, tmp_path, monkeypatch):
    "A verifier that passes sample 0 of the first two problems: S = 2, pass@1 and pass@n from the counts."
    first = [p['name'] for p in read_problems(valid_file)[:2]]
    fake = DelayVerifier(verdict_fn=lambda p, s: 'pass' if p['name'] in first and s['sample_idx'] == 0 else 'fail')
    import ei_nb.sample_job as SJ                                    # the evaluation samples and verifies through the one sampling job
    monkeypatch.setattr(SJ, 'open_verifier', lambda *a, **k: fake)
    r = run_eval(valid_file, model_dir, tmp_path, n=4, max_new_tokens=8, verify_backend='repl', log=lambda *a: None)
    assert (r['solved'], r['n_problems']) == (2, 8)
    assert r['pass_at_k'] == pytest.approx({'1': 2 / 32, '4': 2 / 8})
    assert r['code_frac'] == 1.0 and r['verdict_counts'] == {'fail': 30, 'pass': 2}


def test_rerun_resumes_and_reproduces(model_dir, valid_file, tmp_path):
    kw = dict(n=2, max_new_tokens=12, seed=5, log=lambda *a: None)
    a = run_eval(valid_file, model_dir, tmp_path / 'a', **kw)
    again = run_eval(valid_file, model_dir, tmp_path / 'a', **kw)
    b = run_eval(valid_file, model_dir, tmp_path / 'b', **kw)
    assert again['timings']['generation_s'] == 0
    assert (tmp_path / 'a' / 'eval_samples.jsonl').read_bytes() == (tmp_path / 'b' / 'eval_samples.jsonl').read_bytes()
    drop = lambda r: {k: v for k, v in r.items() if k not in ('timings', 'tokens_per_s')}
    assert drop(a) == drop(again) == drop(b)


def test_stats_does_not_import_torch(tmp_path):
    v = tmp_path / 'v.jsonl'
    write_records(v, [{'name': 'a', 'sample_idx': i, 'verdict': 'pass' if i else 'fail'} for i in range(2)], 'verdict')
    code = ('import sys; from ei_nb.cli import main; rc = main(["stats", "--verified", sys.argv[1]]); '
            'assert "torch" not in sys.modules and "transformers" not in sys.modules, "torch imported"; sys.exit(rc)')
    r = subprocess.run([sys.executable, '-c', code, str(v)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert last_json(r.stdout)['solved'] == 1


@pytest.mark.slow
def test_stage_notebook_runs_under_papermill(model_dir, valid_file, tmp_path):
    "The driver's route: 04_eval executed by papermill with injected parameters."
    pm = pytest.importorskip('papermill')
    pm.execute_notebook(str(ROOT / 'nbs' / '04_eval.ipynb'), str(tmp_path / 'executed.ipynb'), kernel_name='python3', language='python',
                        parameters=dict(problems_path=str(valid_file), model_dir=str(model_dir), out_dir=str(tmp_path / 'eval'),
                                        sampling=dict(n=2, max_new_tokens=8), round_idx=3),   # a group: one dict
                        progress_bar=False, cwd=str(ROOT / 'nbs'))
    r = stage_numbers(tmp_path / 'eval' / 'stage.json')                   # no stage_json given: beside the records
    assert (r['n_problems'], r['n_samples'], r['round']) == (8, 16, 3)
    assert {s['round'] for s in read_samples(tmp_path / 'eval' / 'eval_samples.jsonl')} == {3}

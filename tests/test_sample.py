"""Sampling and the generation/verification pipeline on a tiny Qwen3 model (CPU, no downloads)."""
import json, os, shutil, signal, subprocess, sys, time
from pathlib import Path
import pytest
ROOT = Path(__file__).resolve().parents[1]
from ei_nb import samplers as S
from ei_nb.core import BadInput, read_problems, read_samples, read_verdicts, shared_data, write_records
from ei_nb.samplers import DelayVerifier, SampleParams, TransformersSampler, run_pipeline



@pytest.fixture(scope='module')
def model_dir(tiny_model_dir):
    return tiny_model_dir


@pytest.fixture(scope='module')
def sampler(model_dir):
    return TransformersSampler(model_dir)


@pytest.fixture(scope='module')
def problems():
    return [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'valid'][:6]


P = SampleParams(n=2, max_new_tokens=12, seed=3)


def no_time(rows): return [{k: v for k, v in r.items() if k != 'verify_s'} for r in rows]


class Interrupting:
    "Delegates to a sampler, raising KeyboardInterrupt on generate call number `at`."
    def __init__(self, inner, at): self.inner, self.at, self.calls = inner, at, 0
    def __getattr__(self, k): return getattr(self.inner, k)
    def generate(self, *a):
        self.calls += 1
        if self.calls == self.at: raise KeyboardInterrupt
        return self.inner.generate(*a)


class SleepSampler:
    "A sampler whose generate call sleeps `per_chunk` seconds: exact generation time for overlap checks."
    name = 'sleep'
    def __init__(self, tokenizer, per_chunk): self.tokenizer, self.context, self.per_chunk = tokenizer, 8192, per_chunk
    def generate(self, prompts, params, seeds):
        time.sleep(self.per_chunk)
        return [[{'completion': f'{s}:{i}', 'n_tokens': 1, 'capped': False} for i in range(params.n)] for s in seeds]


def test_reproducible_with_seed(sampler, problems, tmp_path):
    a = run_pipeline(problems[:4], sampler, tmp_path / 'a.jsonl', P, chunk_problems=2)
    run_pipeline(problems[:4], sampler, tmp_path / 'b.jsonl', P, chunk_problems=2)
    run_pipeline(problems[:4], sampler, tmp_path / 'c.jsonl', SampleParams(n=2, max_new_tokens=12, seed=4), chunk_problems=2)
    assert a['n_samples'] == 8
    assert (tmp_path / 'a.jsonl').read_bytes() == (tmp_path / 'b.jsonl').read_bytes()
    assert [s['completion'] for s in read_samples(tmp_path / 'a.jsonl')] != [s['completion'] for s in read_samples(tmp_path / 'c.jsonl')]


def test_capped_and_n_tokens(model_dir, sampler, problems, tmp_path, monkeypatch):
    "A sample stops at the first EOS (n_tokens counts it, capped is False); without EOS it is capped at the cap."
    seen = []
    real = S.trim_generated
    monkeypatch.setattr(S, 'trim_generated', lambda ids, eos, cap: (seen.append(ids), real(ids, eos, cap))[1])
    prompt = [S.render_prompt(problems[0], sampler.tokenizer)]
    out = sampler.generate(prompt, P, [5])[0]
    ids = seen[0]
    assert all(t not in sampler.eos_ids for t in ids), 'the random model stopped by itself: pick another seed'
    assert out[0] == {'completion': sampler.tokenizer.decode(ids, skip_special_tokens=True), 'n_tokens': 12, 'capped': True}
    # make the token generated at position j an EOS: the same random stream then stops there
    j = next(j for j in range(1, len(ids)) if ids[j] not in ids[:j])
    d = tmp_path / 'eos_model'; shutil.copytree(model_dir, d)
    gc = json.loads((d / 'generation_config.json').read_text()); gc['eos_token_id'] = [gc['eos_token_id'], ids[j]]
    (d / 'generation_config.json').write_text(json.dumps(gc))
    stopped = TransformersSampler(d).generate(prompt, P, [5])[0][0]
    assert stopped == {'completion': sampler.tokenizer.decode(ids[:j], skip_special_tokens=True), 'n_tokens': j + 1, 'capped': False}


def test_resume_after_interrupt_matches_uninterrupted(sampler, problems, tmp_path):
    whole, part = tmp_path / 'whole', tmp_path / 'part'
    with DelayVerifier(0.01) as v:
        run_pipeline(problems, sampler, whole / 's.jsonl', P, 1, v, whole / 'v.jsonl', chunk_problems=2)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(problems, Interrupting(sampler, 3), part / 's.jsonl', P, 1, DelayVerifier(0.01), part / 'v.jsonl', chunk_problems=2)
    assert len(read_samples(part / 's.jsonl')) == 8          # two chunks of 2 problems x 2 samples survived
    r = run_pipeline(problems, sampler, part / 's.jsonl', P, 1, DelayVerifier(0.01), part / 'v.jsonl', chunk_problems=2)
    assert (r['n_resumed'], r['n_generated']) == (8, 4)
    assert (part / 's.jsonl').read_bytes() == (whole / 's.jsonl').read_bytes()
    assert no_time(read_verdicts(part / 'v.jsonl')) == no_time(read_verdicts(whole / 'v.jsonl'))


def test_samples_without_verdicts_are_verified_on_resume(sampler, problems, tmp_path):
    run_pipeline(problems[:2], sampler, tmp_path / 's.jsonl', P, 1, DelayVerifier(), tmp_path / 'v.jsonl', chunk_problems=2)
    rows = read_verdicts(tmp_path / 'v.jsonl')
    write_records(tmp_path / 'v.jsonl', rows[:1], 'verdict')           # as if the run died before the verdicts were in
    r = run_pipeline(problems[:2], sampler, tmp_path / 's.jsonl', P, 1, DelayVerifier(), tmp_path / 'v.jsonl', chunk_problems=2)
    assert (r['n_generated'], r['n_verdicts']) == (0, 4)
    assert no_time(read_verdicts(tmp_path / 'v.jsonl')) == no_time(rows)


def test_resume_refuses_other_settings_and_other_rounds(sampler, problems, tmp_path):
    run_pipeline(problems[:2], sampler, tmp_path / 's.jsonl', P, 1, chunk_problems=2)
    with pytest.raises(BadInput, match=r'other settings \(max_new_tokens\)'):
        run_pipeline(problems[:2], sampler, tmp_path / 's.jsonl', SampleParams(n=2, max_new_tokens=13, seed=3), 1, chunk_problems=2)
    with pytest.raises(BadInput, match='problems'):
        run_pipeline(problems[:3], sampler, tmp_path / 's.jsonl', P, 1, chunk_problems=2)


def test_long_prompts_dropped_and_counted(sampler, problems, tmp_path):
    lens = [len(sampler.tokenizer(S.render_prompt(p, sampler.tokenizer))['input_ids']) for p in problems]
    frac = sorted(lens)[-3] / sampler.context                             # the two longest are over the limit
    r = run_pipeline(problems, sampler, tmp_path / 's.jsonl', P, chunk_problems=4, max_prompt_frac=frac)
    longest = {problems[i]['name'] for i in sorted(range(len(lens)), key=lens.__getitem__)[-2:]}
    assert (r['n_dropped'], r['n_sampled_problems']) == (2, 4)
    assert {d['name'] for d in r['dropped']} == longest
    assert not longest & {s['name'] for s in read_samples(tmp_path / 's.jsonl')}


def test_completion_style_verifier_reads_the_whole_file(sampler, problems, tmp_path):
    seen = []
    ver = DelayVerifier(verdict_fn=lambda p, s: (seen.append(s['completion']), 'unchecked')[1])
    run_pipeline(problems[:1], sampler, tmp_path / 's.jsonl', P, 0, ver, tmp_path / 'v.jsonl', style='completion')
    assert len(seen) == 2 and all(t.startswith('```lean4\nimport Mathlib') and problems[0]['formal_statement'].strip() in t for t in seen)
    assert not read_samples(tmp_path / 's.jsonl')[0]['completion'].startswith('```lean4')   # samples keep the raw completion


def test_prefill_supplies_whole_problems(sampler, problems, tmp_path):
    run_pipeline(problems[:2], sampler, tmp_path / 'seed_s.jsonl', P, 0, DelayVerifier(), tmp_path / 'seed_v.jsonl', chunk_problems=1)
    seed = (read_samples(tmp_path / 'seed_s.jsonl'), read_verdicts(tmp_path / 'seed_v.jsonl'))
    r = run_pipeline(problems[:3], sampler, tmp_path / 's.jsonl', P, 1, DelayVerifier(), tmp_path / 'v.jsonl', chunk_problems=1, prefill=seed)
    assert (r['n_prefilled_problems'], r['n_generated'], r['n_samples']) == (2, 2, 6)
    got = read_samples(tmp_path / 's.jsonl')
    assert [s['completion'] for s in got[:4]] == [s['completion'] for s in seed[0]] and {s['round'] for s in got} == {1}


def test_verdicts_arrive_while_generating_and_overlap(sampler, problems, tmp_path):
    "Real tiny model + a slow fake verifier: verification hides behind generation (wall well under the sum)."
    base = run_pipeline(problems, sampler, tmp_path / 'g.jsonl', SampleParams(n=4, max_new_tokens=24), chunk_problems=1)
    per_sample = base['timings']['generation_s'] / base['n_samples']
    r = run_pipeline(problems, sampler, tmp_path / 's.jsonl', SampleParams(n=4, max_new_tokens=24), 0,
                     DelayVerifier(0.7 * per_sample), tmp_path / 'v.jsonl', chunk_problems=1)
    t = r['timings']
    assert r['verified_during_generation'] >= 12
    assert t['wall_s'] < 0.85 * (t['generation_s'] + t['verify_work_s'])


def test_overlap_wall_is_max_not_sum(sampler, problems, tmp_path):
    "Exact timings (sleeping sampler and verifier): wall ~ max(gen, ver) + one chunk of verification."
    probs = (problems * 2)[:10]
    probs = [dict(p, name=f'{p["name"]}_{i}') for i, p in enumerate(probs)]
    r = run_pipeline(probs, SleepSampler(sampler.tokenizer, 0.2), tmp_path / 's.jsonl', SampleParams(n=2), 0,
                     DelayVerifier(0.08), tmp_path / 'v.jsonl', chunk_problems=1)
    t = r['timings']
    assert t['generation_s'] == pytest.approx(2.0, abs=0.2) and t['verify_work_s'] == pytest.approx(1.6, abs=0.01)
    print(t)
    assert t['wall_s'] < max(t['generation_s'], t['verification_s']) + 0.16 + 0.6     # the last chunk's checks + slack
    assert t['wall_s'] < 0.8 * (t['generation_s'] + t['verify_work_s'])


def test_verify_backend_none_consumes_while_generating(sampler, problems, tmp_path):
    "The real verifier (backend none: pre-check only) gets the samples while later chunks are generated."
    from ei_nb.verify import make_verifier
    with make_verifier('none') as v:
        r = run_pipeline(problems, sampler, tmp_path / 's.jsonl', P, 0, v, tmp_path / 'v.jsonl', chunk_problems=1)
    assert r['verified_during_generation'] >= 10 and r['n_verdicts'] == 12
    assert {x['verdict'] for x in read_verdicts(tmp_path / 'v.jsonl')} <= {'no_code', 'fail', 'unchecked'}
    assert 'verify_one' not in v.__dict__                                   # the timing wrapper is removed


@pytest.mark.slow
def test_cli_sigterm_then_resume(model_dir, sampler, problems, tmp_path):
    "`ei sample` killed by SIGTERM between chunks resumes to the same file as an uninterrupted run."
    pf = tmp_path / 'p.jsonl'; write_records(pf, problems, 'problem')
    run_pipeline(problems, sampler, tmp_path / 'whole.jsonl', SampleParams(n=4, max_new_tokens=48), chunk_problems=1)
    out = tmp_path / 'part.jsonl'
    args = [sys.executable, '-c', 'from ei_nb.cli import _entry; _entry()', 'sample', '--problems', str(pf),
            '--model', str(model_dir), '--out', str(out), '--n', '4', '--max-new-tokens', '48', '--chunk-problems', '1', '--round', '0']
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 4) and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM); proc.communicate()
    assert proc.returncode in (143, 0)
    if proc.returncode == 143: assert len(read_samples(out, required=False)) < 24
    again = subprocess.run(args, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])['n_samples'] == 24
    assert out.read_bytes() == (tmp_path / 'whole.jsonl').read_bytes()


def test_stage_function_reuses_seed_sampling(model_dir, problems, tmp_path):
    "run_sample_verify: a second round-1 run seeded with the first one's files samples nothing again."
    from ei_nb.sample_verify import run_sample_verify
    from ei_nb.sample_job import SamplerSetup
    from ei_nb.verify import VerifierSettings
    pf = tmp_path / 'selected.jsonl'; write_records(pf, problems[:3], 'problem')
    job = (SampleParams(n=2, max_new_tokens=8), VerifierSettings('none'), SamplerSetup('transformers', None, 'chat', 4, 0.5))
    a = run_sample_verify(pf, model_dir, tmp_path / 'r0', 0, *job, log=lambda *a: None)
    b = run_sample_verify(pf, model_dir, tmp_path / 'r1', 1, *job, tmp_path / 'r0' / 'samples.jsonl',
                          tmp_path / 'r0' / 'verdicts.jsonl', log=lambda *a: None)
    assert (a['n_generated'], b['n_generated'], b['n_prefilled_problems']) == (6, 0, 3)
    assert [s['completion'] for s in read_samples(tmp_path / 'r1' / 'samples.jsonl')] == [s['completion'] for s in read_samples(tmp_path / 'r0' / 'samples.jsonl')]
    assert {'wall_s', 'generation_s', 'verification_s', 'overlap_efficiency'} <= set(b['timings'])   # what the stage's stage.json records
    assert not (tmp_path / 'r1' / 'sample_verify.json').exists()
    assert (tmp_path / 'r1' / 'sample_verify.png').stat().st_size > 0


@pytest.mark.slow
def test_stage_notebook_runs_under_papermill(model_dir, problems, tmp_path):
    "The driver's route: 01_sample_verify executed by papermill with injected parameters."
    pm = pytest.importorskip('papermill')
    pf = tmp_path / 'selected.jsonl'; write_records(pf, problems[:4], 'problem')
    pm.execute_notebook(str(ROOT / 'nbs' / '01_sample_verify.ipynb'), str(tmp_path / 'executed.ipynb'), kernel_name='python3',
                        language='python', progress_bar=False, cwd=str(ROOT / 'nbs'),
                        parameters=dict(problems_path=str(pf), model_dir=str(model_dir), out_dir=str(tmp_path / 'round_02'),
                                        round_idx=2, sampling=dict(n=3, max_new_tokens=8)))   # a group: one dict
    out = tmp_path / 'round_02'
    assert {s['round'] for s in read_samples(out / 'samples.jsonl')} == {2} and len(read_verdicts(out / 'verdicts.jsonl')) == 12
    from ei_nb.layout import read_stage_json
    rec = read_stage_json(out / 'stage.json')                         # no stage_json given: the one summary in out_dir
    assert rec['headline']['n_samples'] == 12 and rec['detail']['n'] == 3 and set(rec['outputs']) == {'samples', 'verdicts', 'plot'}

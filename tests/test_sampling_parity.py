"""Issue 27, part 2: the transformers sampler, the in-process vLLM sampler (a stand-in `vllm` module: vLLM needs a GPU)
and the `served` sampler (tests/fake_vllm.py, written from vLLM 0.34.0's OpenAI protocol) are given the same effective
sampling parameters; the served ones are read from what the stand-in server says it USED (vLLM accepts unknown request
fields silently, so a field sent proves nothing), and the stage job records them for stage.json."""
import json, sys, types
from pathlib import Path
import pytest
from ei_nb.core import BadInput, read_problems, shared_data
from ei_nb.samplers import SampleParams, TransformersSampler, VllmSampler, sampling_fields, transformers_generate_kwargs

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ('n', 'temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty', 'presence_penalty', 'frequency_penalty', 'stop', 'max_tokens')
PARAMS = SampleParams(n=2, temperature=0.8, top_p=0.9, max_new_tokens=12, seed=5, top_k=7, min_p=0.05, repetition_penalty=1.1)


def _problems(k=2):
    return [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'valid'][:k]


def from_transformers(kw:dict) -> dict:
    "generate()'s keyword arguments in vLLM's names (transformers has no presence/frequency penalty and no stop strings: 0 and [])."
    return {'n': kw['num_return_sequences'], 'temperature': kw['temperature'], 'top_p': kw['top_p'], 'top_k': kw['top_k'],
            'min_p': kw['min_p'] or 0.0, 'repetition_penalty': kw['repetition_penalty'], 'presence_penalty': 0.0,
            'frequency_penalty': 0.0, 'stop': [], 'max_tokens': kw['max_new_tokens']}


def transformers_effective(model_dir, monkeypatch) -> dict:
    smp, seen = TransformersSampler(model_dir), []
    real = smp.model.generate
    monkeypatch.setattr(smp.model, 'generate', lambda **kw: (seen.append(kw), real(**kw))[1])
    from ei_nb.prompts import render_prompt
    smp.generate([render_prompt(_problems(1)[0], smp.tokenizer)], PARAMS, [11])
    assert len(seen) == 1 and seen[0]['do_sample'] is True
    return from_transformers(seen[0])


def vllm_effective(model_dir, monkeypatch) -> dict:
    "The in-process sampler against a stand-in `vllm` module that records the SamplingParams it is given."
    made = []
    class SamplingParams:                       # vllm/sampling_params.py keeps what it is given; the rest at its defaults
        def __init__(self, **kw): made.append(kw)
    class LLM:
        def __init__(self, **kw): self.kw = kw
        def generate(self, prompts, sps, use_tqdm=True):
            out = types.SimpleNamespace(text='x', token_ids=[1], finish_reason='stop')
            return [types.SimpleNamespace(outputs=[out] * PARAMS.n) for _ in prompts]
    monkeypatch.setitem(sys.modules, 'vllm', types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    VllmSampler(model_dir).generate(['p'], PARAMS, [11])
    assert len(made) == 1 and made[0]['seed'] == 11
    return {k: made[0][k] for k in FIELDS}


def served_effective(model_dir, tmp_path, monkeypatch) -> tuple[dict, dict]:
    "The stand-in server's record of the parameters it used for the request, and the stage job's record for stage.json."
    from ei_nb.sample_job import sample_and_verify
    monkeypatch.setenv('FAKE_VLLM_LOG', str(tmp_path / 'requests.jsonl'))
    serve = {'vllm_bin': f'{sys.executable} {ROOT / "tests" / "fake_vllm.py"}', 'deadline': 120, 'grace': 5}
    stats = sample_and_verify(_problems(1), model_dir, tmp_path / 's.jsonl', None, PARAMS, 0, 'served',
                              {'serve': serve, 'log_path': str(tmp_path / 'logs' / 'vllm.log')}, log=lambda *a: None, progress=False)
    recs = [json.loads(l) for l in (tmp_path / 'requests.jsonl').read_text().splitlines()]
    (eff,) = [e for r in recs if r['event'] == 'reply' for e in r.get('effective', [])]
    assert [r['flags']['generation_config'] for r in recs if r['event'] == 'start'] == ['vllm']
    return {k: eff[k] for k in FIELDS}, stats


def test_the_three_samplers_are_given_the_same_effective_parameters(tiny_model_dir, tmp_path, monkeypatch):
    want = {k: sampling_fields(PARAMS)[k] for k in FIELDS}
    assert want['top_k'] == 7 and want['min_p'] == 0.05          # not the defaults: a sampler dropping a field would show
    got_t = transformers_effective(tiny_model_dir, monkeypatch)
    got_v = vllm_effective(tiny_model_dir, monkeypatch)
    got_s, stats = served_effective(tiny_model_dir, tmp_path, monkeypatch)
    assert got_t == want and got_v == want and got_s == want
    assert {k: stats['sampling'][k] for k in FIELDS} == want and stats['sampling']['sampler'] == 'served'   # what stage.json records
    assert '--generation-config vllm' in stats['server']['command'] and stats['server']['restarts'] == 0


def test_what_transformers_cannot_do_alike_is_refused():
    with pytest.raises(BadInput, match='presence/frequency'): transformers_generate_kwargs(SampleParams(frequency_penalty=0.2))
    with pytest.raises(BadInput, match='stop on strings'): transformers_generate_kwargs(SampleParams(stop=('```',)))


def test_the_in_process_vllm_sampler_refuses_data_parallel_naming_the_fix(tiny_model_dir):
    with pytest.raises(BadInput, match=r'sampler = "served" with \[serve\] data_parallel_size'):
        VllmSampler(tiny_model_dir, data_parallel_size=4)

"""training/dpo across files, processes and a peer implementation: pairs from verdicts written by the real verifier
(fake Lean), protected problems, curriculum order, the loss against trl's DPOTrainer, the adapter-disabled
reference against a separately loaded base model, a SIGKILL mid-training and resume, and the export round trip.
Tiny models built in code, no downloads."""
import json, math, os, random, signal, subprocess, sys, time
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ei_nb.core import DataStop, read_problems, read_samples, read_verdicts, shared_data, write_records
from ei_nb.dpo import (assign_bands, build_pairs, curriculum, demo_dpo_inputs, dpo_data_cli, dpo_loss, is_lean_failure, read_pairs,
                       reference_logps, sequence_logp, tokenize_pairs, train_dpo)
from ei_nb.sft import build_sft_rows, read_protected
from ei_nb.train import load_for_training

ENV = dict(os.environ, OMP_NUM_THREADS='1', TOKENIZERS_PARALLELISM='false')
FAKE = str(Path(__file__).with_name('fake_repl.py'))


@pytest.fixture(scope='module')
def tiny(tiny_model_dir): return tiny_model_dir   # read-only: tests write elsewhere


@pytest.fixture(scope='module')
def tok(tiny_tokenizer): return tiny_tokenizer


@pytest.fixture(scope='module')
def records(tmp_path_factory, tok):
    paths = demo_dpo_inputs(tmp_path_factory.mktemp('round'), tok, n_problems=24)
    return read_problems(paths['problems']), read_samples(paths['samples']), read_verdicts(paths['verdicts'])


@pytest.fixture(scope='module')
def ordered(records, tok):
    return curriculum(build_pairs(*records, tok, 1, pairs_per_problem=2)[0], 3)


def perturbed_lora(tiny, seed=0):
    "A fresh LoRA model whose adapter changes the outputs (B is zero at init)."
    model, *_ = load_for_training(tiny, torch.device('cpu'), lora_r=4, lora_alpha=8)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if 'lora_B' in n and '.default' in n: p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


# ---------------------------------------------------------------- pairs
def test_pairs_invariants(records, tok):
    problems, samples, verdicts = records
    pairs, st = build_pairs(problems, samples, verdicts, tok, 1, pairs_per_problem=3)
    by_key = {(v['name'], v['sample_idx']): v for v in verdicts}
    kept = {(r['name'], r['sample_idx']) for r in build_sft_rows(problems, samples, verdicts, tok, 1)[0]}
    assert pairs and st['pairs'] == len(pairs)
    assert all(is_lean_failure(by_key[p['name'], p['rejected_idx']]) for p in pairs)
    assert all(by_key[p['name'], p['rejected_idx']]['reason'].startswith('lean error: ') for p in pairs)
    assert {(p['name'], p['chosen_idx']) for p in pairs} <= kept            # winners are SFT's kept proofs
    assert max(Counter(p['name'] for p in pairs).values()) == 3
    assert len({(p['name'], p['chosen_idx'], p['rejected_idx']) for p in pairs}) == len(pairs)
    assert st['excluded_fails'].get('sorry', 0) > 0                          # the pre-check cheats were there, and left out
    assert all(p['chosen'] != p['rejected'] for p in pairs)


def test_pairs_deterministic_across_runs_and_input_order(records, tok):
    a = build_pairs(*records, tok, 1, pairs_per_problem=2, seed=5)[0]
    assert build_pairs(*records, tok, 1, pairs_per_problem=2, seed=5)[0] == a
    rng = random.Random(0)
    shuffled = [rng.sample(x, len(x)) for x in records]
    assert build_pairs(*shuffled, tok, 1, pairs_per_problem=2, seed=5)[0] == a
    others = [build_pairs(*records, tok, 1, pairs_per_problem=2, seed=s)[0] for s in range(6)]
    assert any(o != a for o in others)                                       # the seed does choose


def test_protected_problems_never_pair(records, tok, tmp_path):
    problems, samples, verdicts = records
    names = sorted({p['name'] for p in build_pairs(*records, tok, 1)[0]})
    by_stmt = next(p for p in problems if p['name'] == names[1])
    path = tmp_path / 'protected.jsonl'
    write_records(path, [{'name': names[0]}, {'name': 'renamed_elsewhere', 'formal_statement': by_stmt['formal_statement']}])
    pairs, st = build_pairs(*records, tok, 1, protected=read_protected([path, shared_data('minif2f_test_goedel_v2.jsonl')]))
    assert not {names[0], names[1]} & {p['name'] for p in pairs} and st['dropped_protected'] == 2


def test_verdicts_of_the_real_verifier(tok, tmp_path):
    """Verdicts written by `ei_nb.verify` (plain `lean` backend, fake Lean): only Lean's error rejections are losers;
    Lean-caught sorries and axioms, pre-check cheats, timeouts and no-code samples never are."""
    from ei_nb.verify import make_verifier
    (tmp_path / 'lean-toolchain').write_text('leanprover/lean4:v4.9.0-rc1\n')
    few = {r['name']: r for r in map(json.loads, open(shared_data('minif2f_valid_few_shot_dsp15.jsonl')))}
    prob = next(p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['name'] == 'mathd_algebra_182')
    good = prob['header'] + few[prob['name']]['formal_statement'] + few[prob['name']]['formal_proof']
    fence = lambda code: f'The proof.\n\n```lean4\n{code}\n```\n'
    texts = [fence(good), fence(good + '\n  -- second'), fence(good + '  -- FAKE:error'), fence(good + '  -- FAKE:sorry'),
             fence(good + '  -- FAKE:axiom=sorryAx'), fence(good + '  -- FAKE:hang'),
             fence(prob['header'] + prob['formal_statement'] + '  sorry'), 'no code here',
             fence(good + '\n  -- another try  -- FAKE:error')]
    samples = [{'name': prob['name'], 'sample_idx': i, 'round': 1, 'completion': t, 'n_tokens': len(t) // 3, 'capped': False}
               for i, t in enumerate(texts)]
    v = make_verifier('lean', project=tmp_path, timeout=1, mem_mb=256, lean_cmd=[sys.executable, FAKE, '--lean'],
                      replay_cmd=[sys.executable, str(Path(__file__).with_name('fake_replay.py'))])   # the stand-in kernel replay (issue 28)
    with v: verdicts = [v.verify_one(prob, s) for s in samples]
    # the hang is a `fail` with reason `timeout` (issue 34): never a loser either
    assert [x['verdict'] for x in verdicts] == ['pass', 'pass', 'fail', 'fail', 'fail', 'fail', 'fail', 'no_code', 'fail']
    pairs, st = build_pairs([prob], samples, verdicts, tok, 1, pairs_per_problem=10)
    assert {p['rejected_idx'] for p in pairs} == {2, 8} and {p['chosen_idx'] for p in pairs} == {0, 1} and len(pairs) == 4
    assert st['excluded_fails'] == {'lean sorry': 1, 'axioms': 1, 'timeout': 1, 'sorry': 1}


def test_no_loser_is_a_data_stop(records, tok, tiny, tmp_path):
    problems, samples, verdicts = records
    only_cheats = [dict(v, reason='sorry: x') if is_lean_failure(v) else v for v in verdicts]
    assert build_pairs(problems, samples, only_cheats, tok, 1)[0] == []
    for name, rows in (('problems', problems), ('samples', samples), ('verdicts', only_cheats)):
        write_records(tmp_path / f'{name}.jsonl', rows)
    with pytest.raises(DataStop):
        dpo_data_cli(['--problems', str(tmp_path / 'problems.jsonl'), '--samples', str(tmp_path / 'samples.jsonl'),
                      '--verdicts', str(tmp_path / 'verdicts.jsonl'), '--tokenizer', str(tiny), '--out', str(tmp_path / 'p.jsonl')])
    assert not (tmp_path / 'p.jsonl').exists()


# ---------------------------------------------------------------- curriculum
def test_curriculum_order(ordered):
    rates = {f'p{i}': i / 8 for i in range(9)}
    bands = assign_bands(rates, 3)
    assert [bands[f'p{i}'] for i in range(8, -1, -1)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]   # easy (high pass rate) first
    assert len(set(assign_bands({**rates, 'q': 4 / 8}, 3)[n] for n in ('p4', 'q'))) == 1   # a pass rate is never split
    assert [p['band'] for p in ordered] == sorted(p['band'] for p in ordered) and len({p['band'] for p in ordered}) > 1
    band_rates = {}
    for p in ordered: band_rates.setdefault(p['band'], set()).add(p['pass_rate'])
    assert all(min(band_rates[b]) > max(band_rates[b + 1]) for b in sorted(band_rates)[:-1])


# ---------------------------------------------------------------- the objective against a peer
def test_loss_equals_trl_dpo_trainer(tiny, tok, ordered, tmp_path):
    """trl's DPOTrainer.compute_loss (its own log-probs, its reference = the adapter as it was at construction, i.e.
    the base) on the same token batch equals ours within 1e-5."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer
    pairs = ordered[::5][:4]
    model, *_ = load_for_training(tiny, torch.device('cpu'), lora_r=4, lora_alpha=8)
    ds = Dataset.from_list([{k: p[k] for k in ('prompt', 'chosen', 'rejected')} for p in pairs])
    args = DPOConfig(output_dir=str(tmp_path / 'trl'), beta=0.1, report_to=[], use_cpu=True, max_length=None)
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():   # move the policy away from the reference after trl took its copy
        for n, p in model.named_parameters():
            if 'lora_B' in n and '.default' in n: p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    chosen, rejected = tokenize_pairs(pairs, tok)
    ref = reference_logps(model, chosen, rejected)
    with torch.no_grad():
        pc = torch.stack([sequence_logp(model, e) for e in chosen]); pr = torch.stack([sequence_logp(model, e) for e in rejected])
        ours = dpo_loss(pc, pr, torch.tensor(ref['chosen']), torch.tensor(ref['rejected']), 0.1)[0].mean().item()
        width = max(len(e['ids']) for e in chosen + rejected)
        ids = torch.full((2 * len(pairs), width), tok.pad_token_id); att = torch.zeros_like(ids); comp = torch.zeros_like(ids)
        for k, e in enumerate(chosen + rejected):   # trl's batch layout: all chosen, then all rejected, right-padded
            n = len(e['ids']); ids[k, :n] = torch.tensor(e['ids']); att[k, :n] = 1; comp[k, e['n_prompt']:n] = 1
        theirs = trainer.compute_loss(model, {'input_ids': ids, 'attention_mask': att, 'completion_mask': comp}).item()
    assert abs(ours - 0.6931) > 1e-3                 # policy != reference: the check is not log 2 against log 2
    assert abs(ours - theirs) < 1e-5, (ours, theirs)


def test_reference_is_the_base_model(tiny, tok, ordered):
    "The adapter-disabled reference equals a separately loaded copy of the input model within 1e-5."
    from transformers import AutoModelForCausalLM
    chosen, rejected = tokenize_pairs(ordered[:3], tok)
    model = perturbed_lora(tiny)
    ref = reference_logps(model, chosen, rejected)
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with torch.no_grad():
        plain = [sequence_logp(base, e).item() for e in chosen + rejected]
        adapted = [sequence_logp(model, e).item() for e in chosen]
    assert max(abs(a - b) for a, b in zip(ref['chosen'] + ref['rejected'], plain)) < 1e-5
    assert max(abs(a - b) for a, b in zip(adapted, plain)) > 1e-2   # the adapter does change the model


# ---------------------------------------------------------------- training: resume, export
TRAIN = ['--lr', '5e-3', '--lora-r', '8', '--lora-alpha', '16', '--batch-pairs', '2', '--max-steps', '6', '--save-every', '2']


def run_train(model, data, out):
    code = 'import json,sys; from ei_nb.dpo import dpo_train_cli; print(json.dumps(dpo_train_cli(sys.argv[1:])))'
    return subprocess.Popen([sys.executable, '-c', code, '--model', str(model), '--data', str(data), '--out-dir', str(out), *TRAIN],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def test_sigkill_and_resume_equals_uninterrupted(tiny, ordered, tmp_path):
    """Kill -9 the trainer after its second checkpoint; the rerun resumes (reference log-probs read back, not
    recomputed) and ends bit-identical to a run never killed."""
    data = tmp_path / 'pairs.jsonl'
    write_records(data, ordered[::2][:12])
    crashed = tmp_path / 'crashed'
    p = run_train(tiny, data, crashed)
    t0 = time.time()
    while not (crashed / 'checkpoints' / 'step-000004' / 'state.json').exists():
        assert p.poll() is None and time.time() - t0 < 300, 'training ended before it could be killed'
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL); p.wait()
    assert p.returncode == -signal.SIGKILL and not (crashed / 'merged').exists()
    assert list((crashed / 'checkpoints').glob('reference_band*.json'))            # each band's reference, kept for the resume
    out, err = (r := run_train(tiny, data, crashed)).communicate()
    assert r.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])['resumed_from'] >= 4
    whole = tmp_path / 'whole'
    out2, err2 = (r2 := run_train(tiny, data, whole)).communicate()
    assert r2.returncode == 0 and json.loads(out2.strip().splitlines()[-1])['resumed_from'] == 0, err2
    a, b = load_file(crashed / 'merged' / 'model.safetensors'), load_file(whole / 'merged' / 'model.safetensors')
    assert all(torch.equal(a[k], b[k]) for k in b)
    ha, hb = (json.loads((d / 'train.json').read_text())['history'] for d in (crashed, whole))
    assert all(ha[k] == hb[k] for k in hb if k != 'seconds')
    assert not (crashed / 'checkpoints').exists() and not list(crashed.glob('.*'))


def test_each_band_is_its_own_run(tiny, ordered, tmp_path):
    """Issue 30, point 10 (CuDIP's Algorithm 1: one DPO per curriculum set, the previous set's policy as reference): at the first
    step of every band the loss is log 2 for each pair (policy = reference) and the LR is its warm-up's first value; a resume at a
    band's first step and one inside a band both give the weights of an uninterrupted run. `per_band=False` is the old single run."""
    import math
    from ei_nb.dpo import band_bounds
    from ei_nb.train import lr_factor
    pairs = [p for p in ordered if p['band'] == 0][:4] + [p for p in ordered if p['band'] == 1][:4]
    assert {p['band'] for p in pairs} == {0, 1}
    kw = dict(lr=5e-3, lora_r=8, lora_alpha=16, batch_pairs=1, warmup_ratio=0.5, seed=0)
    whole = train_dpo(tiny, pairs, tmp_path / 'whole', save_every=0, **kw)
    h = whole['history']
    for b, first, n in band_bounds(h['band']):
        assert abs(h['loss'][first] - math.log(2)) < 1e-6 and h['accuracy'][first] == 0
        assert h['lr'][first] == pytest.approx(5e-3 * lr_factor(0, n, math.ceil(0.5 * n), 'cosine'))
    one = train_dpo(tiny, pairs, tmp_path / 'one', save_every=0, per_band=False, **kw)['history']
    second = band_bounds(h['band'])[1][1]
    assert one['loss'][second] < math.log(2) - 1e-4                              # the old run: the input model stays the reference,
    assert one['lr'][second] == pytest.approx(5e-3 * lr_factor(second, len(h['lr']), math.ceil(0.5 * len(h['lr'])), 'cosine'))
    assert sum(one['lr'][second:]) < sum(h['lr'][second:])                        # and the last band trains on the decayed tail
    class Stop(Exception): pass
    def halt(at):
        def on_step(done, loss):
            if done == at: raise Stop   # after the checkpoint of step `at`
        return on_step
    for stop in (second, second + 1):   # resume at a band's first step, and inside the band
        d = tmp_path / f'stop{stop}'
        with pytest.raises(Stop): train_dpo(tiny, pairs, d, save_every=1, on_step=halt(stop), **kw)
        again = train_dpo(tiny, pairs, d, save_every=1, **kw)
        assert again['resumed_from'] == stop and again['history']['loss'] == h['loss']
        a, b = load_file(d / 'merged' / 'model.safetensors'), load_file(tmp_path / 'whole' / 'merged' / 'model.safetensors')
        assert all(torch.equal(a[k], b[k]) for k in b)
    assert whole['pairs_per_band'] == {0: sum(p['band'] == 0 for p in pairs), 1: sum(p['band'] == 1 for p in pairs)}


def test_export_round_trip(tiny, tok, ordered, tmp_path):
    "The merged model reloads with `from_pretrained` and computes what base + saved adapter compute; training moved it."
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    pairs = ordered[::3][:6]
    m = train_dpo(tiny, pairs, tmp_path / 'out', lr=5e-3, lora_r=8, lora_alpha=16, batch_pairs=2, save_every=0)
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == ['adapter', 'merged', 'train.json']
    assert m['history']['margin'][-1] > 0 and m['final_loss'] < m['first_loss'] and m['pairs_per_band']
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / 'out' / 'merged', dtype=torch.float32)
    assert AutoTokenizer.from_pretrained(tmp_path / 'out' / 'merged')('theorem').input_ids == tok('theorem').input_ids
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), tmp_path / 'out' / 'adapter')
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    chosen, _ = tokenize_pairs(pairs[:2], tok)
    with torch.no_grad():
        lm, la, lb = ([sequence_logp(x, e).item() for e in chosen] for x in (merged, adapted, base))
    assert max(abs(a - b) for a, b in zip(lm, la)) < 1e-3
    assert max(abs(a - b) for a, b in zip(lm, lb)) > 1e-2


def test_pairs_over_max_tokens_are_dropped(tiny, ordered, tmp_path):
    lengths = sorted(max(p['chosen_tokens'], p['rejected_tokens']) for p in ordered[:8])
    m = train_dpo(tiny, ordered[:8], tmp_path / 'out', lr=1e-3, lora_r=4, lora_alpha=8, batch_pairs=8, save_every=0,
                  max_tokens=lengths[3], max_steps=1)
    assert m['dropped_too_long'] == sum(n > lengths[3] for n in lengths) > 0 and m['pairs'] == 8 - m['dropped_too_long']


def test_loser_prefixes_widen_the_allow_list_explicitly(records, tok):
    "A non-Lean verifier's rejections (here relabelled `demo reject:`) are losers only when asked for by prefix."
    problems, samples, verdicts = records
    demo = [dict(v, reason='demo reject: ' + v['reason']) if is_lean_failure(v) else v for v in verdicts]
    assert build_pairs(problems, samples, demo, tok, 1)[0] == []
    wide = build_pairs(problems, samples, demo, tok, 1, loser_prefixes=('lean error: ', 'demo reject: '))[0]
    assert [{k: p[k] for k in ('name', 'chosen_idx', 'rejected_idx')} for p in wide] == \
           [{k: p[k] for k in ('name', 'chosen_idx', 'rejected_idx')} for p in build_pairs(*records, tok, 1)[0]]


# ---------------------------------------------------------------- the demo verifier's rejections
def test_known_verifier_rejections_are_losers_only_when_named(tok, tmp_path):
    "The real known-proof verifier: a wrong proof is `unchecked` with `DEMO_LOSER`; a `sorry` stays a pre-check cheat."
    from ei_nb.demo import build_demo_data
    from ei_nb.known_proofs import known_proof_verifier
    from ei_nb.dpo import DEMO_LOSER, LEAN_ERROR
    demo = build_demo_data(tmp_path / 'demo')
    problems = demo['scored'][:4]
    kv = known_proof_verifier(demo['paths']['known_proofs'])
    samples, verdicts = [], []
    for p in problems:
        proof = demo['proofs'][p['name']].rstrip()
        code = lambda body: f"```lean4\n{p['header']}{p['formal_statement'].rstrip()}\n{body}\n```"
        for i, body in enumerate((proof, proof.rsplit('\n', 1)[0] + '\n  linarith', '  sorry', proof)):
            samples.append({'name': p['name'], 'sample_idx': i, 'round': 1, 'completion': code(body), 'n_tokens': 50, 'capped': False})
            verdicts.append(kv.verify_one(p, samples[-1]) if i < 3 else
                            {'name': p['name'], 'sample_idx': 3, 'verdict': 'error', 'reason': DEMO_LOSER + 'x', 'proof': proof, 'verify_s': 0.0})
    assert Counter(v['verdict'] for v in verdicts) == {'pass': 4, 'unchecked': 4, 'fail': 4, 'error': 4}
    assert build_pairs(problems, samples, verdicts, tok, 1)[0] == []
    pairs, st = build_pairs(problems, samples, verdicts, tok, 1, loser_prefixes=(LEAN_ERROR, DEMO_LOSER))
    assert [(p['name'], p['chosen_idx'], p['rejected_idx']) for p in pairs] == [(p['name'], 0, 1) for p in sorted(problems, key=lambda p: p['name'])]
    assert st['excluded_fails'] == {'sorry': 4}


# ---------------------------------------------------------------- the shared training options
def _options(argv):
    from ei_nb.cli import main
    import contextlib, io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()): assert main(argv) == 0
    return {w.strip('[],').split('=')[0] for w in buf.getvalue().split() if w.strip('[],').startswith('--')}


def test_train_and_dpo_train_share_their_options():
    sft, dpo = _options(['train', '--help']), _options(['dpo-train', '--help'])
    assert sft - dpo == {'--batch-tokens', '--pack-tokens', '--full-finetune'} and dpo - sft == {'--beta', '--batch-pairs'}
    assert {'--lr', '--epochs', '--lora-r', '--schedule', '--no-resume', '--save-every', '--max-tokens'} <= sft & dpo


# ---------------------------------------------------------------- 02 runs the objectives
ROOT = Path(__file__).resolve().parents[1]
PRELUDE = ('import json, math, shutil\nfrom pathlib import Path\nfrom collections import Counter\nfrom fastcore.test import *\n'
           'from ei_nb.core import DataStop, StageFailed\nfrom ei_nb.sft import *\n')
STAGE = dict(min_rows=2, min_pairs=2, max_steps=6, save_every=2, lr=1e-3, dpo_lr=1e-3, lora_r=4, lora_alpha=8, batch_tokens=2048,
             batch_pairs=2, pairs_per_problem=2, n_stages=2, epochs=1)


def run_stage(params: dict) -> dict:
    "Execute the runner section of nbs/02_sft.ipynb (from `## Run the stage`) in this process, `params` injected."
    import matplotlib; matplotlib.use('Agg')
    from ei_nb.audit_html import runner_index
    nb = json.loads((ROOT / 'nbs' / '02_sft.ipynb').read_text())
    ns = {}
    exec(PRELUDE, ns)
    for c in nb['cells'][runner_index(nb):]:
        if c['cell_type'] != 'code': continue
        exec(''.join(c['source']), ns)
        if 'parameters' in c['metadata'].get('tags', []): ns.update(params)
    return ns


@pytest.fixture(scope='module')
def small_round(tmp_path_factory, tok):
    "A crafted round of 8 problems (the stage's own twin has 32): the stage tests stay at seconds."
    paths = demo_dpo_inputs(tmp_path_factory.mktemp('small'), tok, n_problems=8)
    return {f'{k}_path': str(paths[k]) for k in ('problems', 'samples', 'verdicts')}


def stage_args(tiny, out, objective, inputs, **kw):
    return dict(STAGE, model_dir=str(tiny), out_dir=str(out), objective=objective, **inputs, **kw)


def merged(d): return load_file(Path(d) / 'merged' / 'model.safetensors')


def test_stage_sft_objective_is_plain_train_lora(tiny, small_round, tmp_path):
    "objective = 'sft': no DPO file, and merged/ is bit-identical to `train_lora` on the stage's own rows."
    from ei_nb.train import train_lora
    run_stage(stage_args(tiny, tmp_path / 'st', 'sft', small_round))
    out = tmp_path / 'st'
    stage = json.loads((out / 'stage.json').read_text())
    assert not (out / 'dpo_pairs.jsonl').exists() and 'objective' not in stage['headline'] and not (out / 'sft.json').exists()
    assert stage['detail']['data']['rows'] == stage['headline']['rows'] and len(stage['detail']['losses']) == stage['headline']['steps']
    train_lora(tiny, out / 'sft.jsonl', tmp_path / 'direct', lr=1e-3, epochs=1, lora_r=4, lora_alpha=8, batch_tokens=2048,
               max_steps=6, save_every=2, warmup_ratio=0.03, schedule='cosine', seed=0)
    a, b = merged(out), merged(tmp_path / 'direct')
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize('objective', ['dpo', 'sft_then_dpo'])
def test_stage_dpo_objectives(tiny, tok, small_round, tmp_path, objective):
    "The stage trains DPO on its pairs, exports like SFT, and records objective, pairs per band, margins and accuracies."
    from transformers import AutoModelForCausalLM
    out = tmp_path / 'st'
    run_stage(stage_args(tiny, out, objective, small_round))
    stage = json.loads((out / 'stage.json').read_text())   # the stage's one summary: no sft.json
    head, summary = stage['headline'], stage['detail']
    pairs = read_pairs(out / 'dpo_pairs.jsonl')
    assert head['objective'] == stage['params']['objective'] == objective and not (out / 'sft.json').exists()
    assert sum(head['pairs_per_band'].values()) == len(pairs) == summary['pair_data']['pairs'] >= 2
    assert [p['band'] for p in pairs] == sorted(p['band'] for p in pairs)
    assert len(summary['margins']) == len(summary['accuracies']) == len(summary['losses']) == summary['steps'] == 6
    assert abs(summary['losses'][0] - math.log(2)) < 1e-3          # the policy starts at its reference
    assert summary['reference'] == str(out / 'sft_model' / 'merged' if objective == 'sft_then_dpo' else tiny)
    assert (out / 'sft.jsonl').exists() == (out / 'sft_model' / 'merged').exists() == (objective == 'sft_then_dpo')
    assert {'adapter', 'merged', 'train.json'} <= {p.name for p in out.iterdir()} and not (out / 'checkpoints').exists()
    m = AutoModelForCausalLM.from_pretrained(out / 'merged', dtype=torch.float32)   # what 03 reads
    base = load_file(Path(tiny) / 'model.safetensors')
    assert any(not torch.equal(merged(out)[k], base[k]) for k in base) and m.config.vocab_size == tok.vocab_size


def test_stage_rejects_an_unknown_objective(tiny, small_round, tmp_path):
    from ei_nb.core import BadInput
    with pytest.raises(BadInput, match='objective'): run_stage(stage_args(tiny, tmp_path / 'st', 'ppo', small_round))


def test_stage_data_stop_on_too_few_pairs(tiny, small_round, tmp_path):
    out = tmp_path / 'st'
    with pytest.raises(DataStop, match='min_pairs'): run_stage(stage_args(tiny, out, 'dpo', small_round, min_pairs=10_000))
    stage = json.loads((out / 'stage.json').read_text())
    assert stage['status'] == 'data_stop' and stage['headline']['min_pairs'] == 10_000 and not (out / 'merged').exists()
    assert stage['detail']['pair_data']['pairs'] == stage['headline']['pairs'] and stage['detail']['data']['rows'] == stage['headline']['rows']


def stage_process(params: dict):
    code = f'import json,sys; sys.path.insert(0, {str(ROOT)!r}); from tests.test_dpo import run_stage; run_stage(json.loads(sys.argv[1]))'
    return subprocess.Popen([sys.executable, '-c', code, json.dumps(params)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(ENV, MPLBACKEND='Agg'), cwd=ROOT)


@pytest.mark.slow   # three processes of the stage, ~60 s each on 2 shared cores
def test_stage_sigkill_during_dpo_and_resume(tiny, small_round, tmp_path):
    """sft_then_dpo killed -9 after DPO's second checkpoint: the rerun keeps the SFT merge (not retrained), resumes
    DPO, and ends with files identical to a run never killed."""
    crashed, whole = tmp_path / 'crashed', tmp_path / 'whole'
    p = stage_process(stage_args(tiny, crashed, 'sft_then_dpo', small_round, max_steps=8))
    t0 = time.time()
    while not (crashed / 'checkpoints' / 'step-000004' / 'state.json').exists():
        assert p.poll() is None and time.time() - t0 < 300, p.stderr.read()[-3000:] if p.poll() is not None else 'timeout'
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL); p.wait()
    assert not (crashed / 'merged').exists() and not (crashed / 'stage.json').exists()
    sft_file = crashed / 'sft_model' / 'merged' / 'model.safetensors'
    before = sft_file.stat().st_mtime_ns
    for out in (crashed, whole):
        r = stage_process(stage_args(tiny, out, 'sft_then_dpo', small_round, max_steps=8))
        assert r.wait() == 0, r.stderr.read()[-3000:]
    assert sft_file.stat().st_mtime_ns == before                     # SFT was not trained again
    for rel in ('merged/model.safetensors', 'adapter/adapter_model.safetensors', 'sft_model/merged/model.safetensors', 'dpo_pairs.jsonl', 'sft.jsonl'):
        assert (crashed / rel).read_bytes() == (whole / rel).read_bytes(), rel
    ha, hb = (json.loads((d / 'stage.json').read_text())['detail'] for d in (crashed, whole))
    assert (ha['losses'], ha['margins'], ha['accuracies']) == (hb['losses'], hb['margins'], hb['accuracies'])


# ---------------------------------------------------------------- the demo config
def test_demo_dpo_config_is_demo_plus_dpo_keys_and_plans(tmp_path, capsys):
    import tomllib
    from ei_nb.cli import main
    demo, dpo = (tomllib.loads((ROOT / 'configs' / f).read_text()) for f in ('demo.toml', 'demo_dpo.toml'))
    assert {k: v for k, v in dpo.items() if k not in ('run', 'sft')} == {k: v for k, v in demo.items() if k not in ('run', 'sft')}
    assert {k: v for k, v in dpo['run'].items() if k != 'name'} == {k: v for k, v in demo['run'].items() if k != 'name'}
    dpo_keys = {'objective', 'beta', 'dpo_lr', 'dpo_epochs', 'batch_pairs', 'pairs_per_problem', 'n_stages', 'min_pairs', 'loser_prefixes'}
    assert dpo_keys <= set(demo['sft']) and dpo_keys <= set(dpo['sft'])   # demo.toml sets them too, at the recipe's values
    assert {k: v for k, v in dpo['sft'].items() if k not in dpo_keys} == {k: v for k, v in demo['sft'].items() if k not in dpo_keys}
    assert dpo['sft']['objective'] in ('dpo', 'sft_then_dpo') and demo['sft']['objective'] == 'sft'
    assert main(['run', '--config', str(ROOT / 'configs' / 'demo_dpo.toml'), '--run-dir', str(tmp_path / 'run'), '--dry-run']) == 0
    out = capsys.readouterr()
    assert f"objective={dpo['sft']['objective']!r}" in ' '.join((out.out + out.err).split())
    assert json.loads(out.out.strip().splitlines()[-1])['dry_run'] is True

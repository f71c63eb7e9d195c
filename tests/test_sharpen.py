"""03c_sharpen against outside references: teacher-forced log-probs against `generate`'s own logits and
scores (batched, left-padded, real miniF2F prompts), packing, 02_sft's weighted loss and its gradients through
a LoRA model, the `unlikely` keep rule and row weights of 02_sft, the ranking and uplift on hand-worked and
random inputs, and the stage itself (papermill, tiny model). Tiny models built in code, no downloads."""
import math, random, warnings

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ei_nb.core import read_problems, read_samples, read_verdicts, shared_data
from ei_nb.eval import pass_at_k
from ei_nb.prompts import render_prompt
from ei_nb.rows import collate, join_passes, proof_text, read_logprobs, tokenize_rows
from ei_nb.sft import (build_sft_rows, demo_sft_inputs, group_logprobs, lever_fields, logprob_table, rank_factor, rank_logprob, select_proofs,
                       with_logprobs)
from ei_nb.train import completion_loss, train_lora
from ei_nb.sharpen import (correct_rows, distinct_correct, example_logprobs, group_rows, kept_change, pass_at_n_curve, rank_by_logprob,
                           score_groups, score_passes, score_rows, subsample_problems, uplift_report, uplift_summary, uplift_table)


@pytest.fixture(scope='module')
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope='module')
def tok(tiny_tokenizer): return tiny_tokenizer


@pytest.fixture(scope='module')
def records(tmp_path_factory, tok):
    d = demo_sft_inputs(tmp_path_factory.mktemp('demo'), tok, n_problems=24)
    return read_problems(d['problems']), read_samples(d['samples']), read_verdicts(d['verdicts'])


def generated(model, tok, n_prompts=4, max_new_tokens=40, seed=0, **sampling):
    "Batched, left-padded sampling from real miniF2F chat prompts: per prompt (prompt ids, drawn ids up to and with eos, logits, scores)."
    problems = [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'valid'][:n_prompts]
    enc = tok([render_prompt(p, tok) for p in problems], add_special_tokens=False, return_tensors='pt', padding=True)
    torch.manual_seed(seed)
    out = model.generate(**enc, max_new_tokens=max_new_tokens, output_logits=True, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=tok.pad_token_id, **sampling)
    width = enc['input_ids'].shape[1]
    res = []
    for b in range(len(problems)):
        prompt = enc['input_ids'][b][enc['attention_mask'][b].bool()].tolist()
        drawn = out.sequences[b, width:].tolist()
        if tok.eos_token_id in drawn: drawn = drawn[:drawn.index(tok.eos_token_id) + 1]
        res.append((prompt, drawn, [l[b] for l in out.logits[:len(drawn)]], [s[b] for s in out.scores[:len(drawn)]]))
    return res


def test_logprobs_equal_generate_raw_logits(model, tok):
    "Sampling as the recipe does (T 1, top-p 0.95): log-softmax of `output_logits` at the drawn tokens equals teacher forcing."
    gens = generated(model, tok, do_sample=True, temperature=1.0, top_p=0.95)
    forced = example_logprobs(model, [{'ids': p + d, 'n_prompt': len(p)} for p, d, _, _ in gens])
    for (p, d, logits, _), f in zip(gens, forced):
        ref = np.array([torch.log_softmax(l.float(), -1)[t].item() for l, t in zip(logits, d)])
        assert len(f) == len(d) > 0
        np.testing.assert_allclose(f, ref, atol=1e-4, rtol=0)


def test_logprobs_equal_generate_scores_without_warpers(model, tok):
    "`output_scores` equals the raw log-probs only at T 1 with top-p and top-k off; with top-p 0.95 it does not."
    gens = generated(model, tok, seed=1, do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
    forced = example_logprobs(model, [{'ids': p + d, 'n_prompt': len(p)} for p, d, _, _ in gens])
    for (p, d, _, scores), f in zip(gens, forced):
        ref = np.array([torch.log_softmax(s.float(), -1)[t].item() for s, t in zip(scores, d)])
        np.testing.assert_allclose(f, ref, atol=1e-4, rtol=0)
    nucleus = generated(model, tok, seed=2, do_sample=True, temperature=1.0, top_p=0.95)
    forced = example_logprobs(model, [{'ids': p + d, 'n_prompt': len(p)} for p, d, _, _ in nucleus])
    from_scores = [sum(torch.log_softmax(s.float(), -1)[t].item() for s, t in zip(sc, d)) for _, d, _, sc in nucleus]
    assert all(fs > f.sum() + 1e-3 for fs, f in zip(from_scores, forced))   # renormalised over the nucleus: higher


def test_score_rows_text_path(model, tok, records):
    """Through the text (`correct_rows`, `tokenize_rows`): transformers' plain full-logits forward on prompt + completion
    (+ end-of-turn unless capped) gives the same sums. A random model's draws rarely re-encode to their own ids,
    so the generate comparison above runs on ids; this one covers the row building."""
    problems, samples, verdicts = records
    samples = [s | {'completion': s['completion'] + tok.eos_token} if s['sample_idx'] == 0 else s | {'capped': s['sample_idx'] == 1}
               for s in samples]   # a sampler that leaves the end-of-turn text in; a capped sample (no end-of-turn)
    rows = correct_rows(problems, samples, verdicts, tok)[:12]
    assert {r['eos'] for r in rows} == {True, False}
    for r, s in zip(rows, score_rows(model, tok, rows)):
        assert not r['completion'].endswith(tok.eos_token)
        p = tok(r['prompt'], add_special_tokens=False)['input_ids']
        ids = p + tok(r['completion'], add_special_tokens=False)['input_ids'] + ([tok.eos_token_id] if r['eos'] else [])
        with torch.no_grad(): logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        ref = torch.log_softmax(logits[len(p) - 1:-1], -1).gather(-1, torch.tensor(ids[len(p):])[:, None]).sum().item()
        assert s['n_tokens'] == len(ids) - len(p) and s['logprob'] == pytest.approx(ref, rel=1e-5)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), min_size=1, max_size=6), st.integers(1, 90))
def test_packing_changes_nothing(model, rows, pack_tokens):
    rng = random.Random(len(rows) * 97 + pack_tokens)
    exs = [{'ids': [rng.randrange(3, 1000) for _ in range(p + c)], 'n_prompt': p} for p, c in rows]
    packed, alone = example_logprobs(model, exs, pack_tokens), example_logprobs(model, exs)
    for e, a, b in zip(exs, packed, alone):
        assert len(a) == len(e['ids']) - e['n_prompt']
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)


def test_weighted_loss_and_gradients_through_lora(tiny_model_dir, tok, records):
    "Weighted loss of a packed batch = hand-computed weighted sum of the rows' losses, and so are the LoRA gradients."
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                          LoraConfig(r=4, lora_alpha=8, target_modules='all-linear', init_lora_weights=False, task_type='CAUSAL_LM'))
    exs, _ = tokenize_rows(correct_rows(*records, tok)[:3], tok)
    ws = [0.75, 0.9375, 0.4]
    plain, exs = exs, [e | {'weight': w} for e, w in zip(exs, ws)]
    params = [p for p in lora.parameters() if p.requires_grad]
    def grads(loss):
        g = torch.autograd.grad(loss, params)
        return torch.cat([x.flatten() for x in g])
    losses = [completion_loss(lora, **collate(plain, [i])) for i in range(3)]
    assert [completion_loss(lora, **collate(exs, [i])).item() for i in range(3)] == pytest.approx([w * l.item() for w, l in zip(ws, losses)], rel=1e-6)
    hand = sum(w * l for w, l in zip(ws, losses))
    weighted = completion_loss(lora, **collate(exs, [0, 1, 2]), chunk=64)
    assert weighted.item() == pytest.approx(hand.item(), rel=1e-5)
    g_hand, g_w = grads(hand), grads(weighted)
    assert torch.allclose(g_w, g_hand, rtol=1e-3, atol=1e-6 * g_hand.abs().max().item())
    unweighted = completion_loss(lora, **collate(plain, [0, 1, 2]))
    assert unweighted.item() == pytest.approx(sum(l.item() for l in losses), rel=1e-5)


def test_weighted_loss_by_hand_from_logits(model, tok, records):
    "The weighted loss of a packed batch = sum over rows of weight x (minus the log-softmax of full logits at each completion token)."
    rows = correct_rows(*records, tok)[:4]
    ws = [0.75, 0.8125, 1.0, 0.9375]
    exs, _ = tokenize_rows([r | {'weight': w} for r, w in zip(rows, ws)], tok)
    hand = 0.0
    with torch.no_grad():
        for e, w in zip(exs, ws):
            logits = model(input_ids=torch.tensor([e['ids']])).logits[0].float()
            lp = torch.log_softmax(logits[e['n_prompt'] - 1:-1], -1).gather(-1, torch.tensor(e['ids'][e['n_prompt']:])[:, None])
            hand += w * -lp.sum().item()
        got = completion_loss(model, **collate(exs, [0, 1, 2, 3]), chunk=16).item()
    assert got == pytest.approx(hand, rel=1e-5)


def test_unlikely_with_length_as_logprob_is_shortest(records, tok):
    "With `rank_logprob = n_tokens` the least likely is the shortest: `unlikely` must label exactly as `shortest`."
    problems, samples, verdicts = records
    passes, n = join_passes([s | {'rank_logprob': s['n_tokens']} for s in samples], verdicts)
    for name, ps in passes.items():
        lengths = {s['sample_idx']: 40 * s['n_tokens'] % 997 for s, _ in ps}
        for cap, max_tokens in ((1, 18432), (2, 18432), (4, 500)):
            assert select_proofs(ps, lengths, cap, 'unlikely', max_tokens) == select_proofs(ps, lengths, cap, 'shortest', max_tokens)


def test_unlikely_keeps_the_lowest_logprob_distinct_proofs(records):
    problems, samples, verdicts = records
    rng = random.Random(0)
    lp = {(s['name'], s['sample_idx']): (rng.uniform(-50, -1), rng.randint(1, 40)) for s in samples}
    passes, _ = join_passes(samples, verdicts)
    for name, ps in passes.items():
        for rank_by in ('mean', 'sum'):
            ps_ = with_logprobs(ps, {i: lp[n, i] for n, i in lp if n == name}, rank_by)
            labels = dict(select_proofs(ps_, {s['sample_idx']: 1 for s, _ in ps_}, 2, 'unlikely'))
            key = lambda i: lp[name, i][0] / lp[name, i][1] if rank_by == 'mean' else lp[name, i][0]
            best = {}   # least likely sample of each distinct proof
            for s, v in ps_:
                t = proof_text(s, v)
                if t not in best or (key(s['sample_idx']), s['sample_idx']) < best[t]: best[t] = (key(s['sample_idx']), s['sample_idx'])
            want = {i for _, i in sorted(best.values())[:2]}
            assert {i for i, status in labels.items() if status == 'kept'} == want


def test_distinct_correct_matches_keep_rules(records, tok):
    "Distinct correct proofs = what the keep rules would keep with no cap and no length limit."
    problems, samples, verdicts = records
    _, st_ = build_sft_rows(problems, samples, verdicts, tok, 1, max_per_problem=10**6, max_tokens=10**9)
    dc = distinct_correct(samples, verdicts)
    kept = pd.DataFrame(st_['candidates']).query("status == 'kept'").groupby('name').size()
    for name, k in kept.items(): assert dc[name] == k
    assert set(dc) >= set(kept.index) and len(dc) == len({v['name'] for v in verdicts if v['verdict'] == 'pass'})


def test_rank_and_uplift_second_hand_example():
    """Three problems. p: G=4, initial -4,-1,-3,-2 (ranks 3,0,2,1), final -3,-2,-3.5,-1.5: up at ranks 3, 1; down at 0, 2.
    q: G=1, -7 -> -6 up (rank 0). r: G=2, -1, -9 -> -1, -8 (rank 0 equal: not up; rank 1 up).
    rank 0: 1/3 (q); rank 1: 2/2; rank 2: 0/1; rank 3: 1/1."""
    df = pd.DataFrame({'name': list('pppp') + ['q'] + list('rr'), 'sample_idx': [0, 1, 2, 3, 5, 0, 1],
                       'logprob0': [-4, -1, -3, -2, -7, -1, -9.], 'logprob1': [-3, -2, -3.5, -1.5, -6, -1, -8.]})
    r = rank_by_logprob(df.sample(frac=1, random_state=3))   # input order does not matter
    assert r['rank'].tolist() == [3, 0, 2, 1, 0, 0, 1] and r['n_correct'].tolist() == [4] * 4 + [1] + [2] * 2
    t = uplift_table(r)
    assert t['count'].tolist() == [3, 2, 1, 1] and t['uplifted'].tolist() == [1, 2, 0, 1]
    assert t['rate'].tolist() == pytest.approx([1 / 3, 1, 0, 1])
    s = uplift_summary(r)   # likely halves (G >= 2): p ranks 0,1 (down, up), r rank 0 (not up); unlikely: p ranks 2,3 (down, up), r rank 1 (up)
    assert (s['likely_half_rate'], s['unlikely_half_rate']) == pytest.approx((1 / 3, 2 / 3))
    assert s['sharpening'] == pytest.approx(-1 / 3) and s['uplift_rate'] == pytest.approx(4 / 7)
    k = kept_change(r, {('p', 0), ('r', 1)})
    assert k['kept'] == {'count': 2, 'mean_change': pytest.approx(1.0)}
    assert k['not_kept']['mean_change'] == pytest.approx((-1 - 0.5 + 0.5 + 1 + 0) / 5)
    fields = {}
    for name, g in df.groupby('name'):   # 02_sft's rank of each sample (by the sum, the diagnostic's order) agrees with the ranking here
        grp = {int(i): (lp, 7) for i, lp in zip(g['sample_idx'], g['logprob0'])}
        fields |= {(name, i): f for i, f in lever_fields(grp, set(grp), list(grp), 'unlikely', 'sum', 0.25).items()}
    assert [fields[n, i]['logprob_rank'] for n, i in zip(r['name'], r['sample_idx'])] == r['rank'].tolist()
    assert [fields[k]['weight'] for k in (('p', 0), ('p', 1), ('q', 5))] == pytest.approx([1.0, 1.0, 1.0])   # all correct: no contrast


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from('abcde'), st.floats(-60, 0), st.floats(-60, 0)), min_size=1, max_size=40))
def test_uplift_invariants(entries):
    df = pd.DataFrame([{'name': n, 'sample_idx': i, 'logprob0': a, 'logprob1': b} for i, (n, a, b) in enumerate(entries)])
    r = rank_by_logprob(df)
    for _, g in r.groupby('name'):
        assert sorted(g['rank']) == list(range(len(g)))
        assert (g.sort_values('rank')['logprob0'].diff().dropna() <= 0).all()   # rank 0 most likely
    t = uplift_table(r)
    assert t['count'].sum() == len(df) and t['uplifted'].sum() == int((df['logprob1'] > df['logprob0']).sum())
    assert list(t.index) == list(range(len(t))) and (t['count'].diff().dropna() <= 0).all()   # fewer problems reach higher ranks
    fs = [rank_factor(int(x.group_size - 1 - x.rank), int(x.group_size)) for x in r.itertuples()]
    assert all(0.75 < f <= 1 for f in fs)


def test_same_model_twice_uplifts_nothing(model, tok, records):
    rows = correct_rows(*records, tok)
    a, b = score_rows(model, tok, rows), score_rows(model, tok, rows, pack_tokens=1024)
    r = rank_by_logprob(pd.DataFrame(a).rename(columns={'logprob': 'logprob0'}).assign(logprob1=[x['logprob'] for x in b]))
    assert (r['logprob1'] - r['logprob0']).abs().max() < 1e-3
    s = uplift_summary(r.assign(logprob1=r['logprob0']))
    assert s['uplift_rate'] == 0 and s['mean_change'] == 0


def test_subsample_whole_problems_seeded(records, tok):
    rows = correct_rows(*records, tok)
    size = pd.Series([r['name'] for r in rows]).value_counts()
    subs = {seed: subsample_problems(rows, 25, seed) for seed in range(4)}
    for seed, sub in subs.items():
        assert 0 < len(sub) <= 25 and sub == subsample_problems(rows, 25, seed)
        got = pd.Series([r['name'] for r in sub]).value_counts()
        assert all(got[n] == size[n] for n in got.index)
    assert len({tuple(sorted({r['name'] for r in s})) for s in subs.values()}) > 1


def test_pass_at_n_curve_matches_estimator(records):
    _, _, verdicts = records
    curve = pass_at_n_curve(verdicts)
    c = pd.DataFrame(verdicts).assign(p=lambda d: d['verdict'].eq('pass')).groupby('name')['p'].agg(['size', 'sum'])
    assert list(curve) == [1, 2, 4]
    for N, v in curve.items():
        assert v == pytest.approx(np.mean([pass_at_k(int(n), int(k), N) for n, k in c.itertuples(index=False)]))


def test_cli_refuses_mismatched_files(tmp_path, tiny_model_dir, records, tok):
    "`--only` naming a sample that is not a pass, and `ei uplift` on files of different samples, are bad input (exit 2)."
    from ei_nb.core import BadInput, write_records
    from ei_nb.sharpen import logprobs_cli, uplift_cli
    problems, samples, verdicts = records
    paths = {k: tmp_path / f'{k}.jsonl' for k in ('problems', 'samples', 'verdicts')}
    write_records(paths['problems'], problems); write_records(paths['samples'], samples); write_records(paths['verdicts'], verdicts)
    files = [x for k, p in paths.items() for x in (f'--{k}', str(p))]
    a = logprobs_cli(['--model', str(tiny_model_dir), '--out', str(tmp_path / 'a.jsonl'), '--max-samples', '10', '--seed', '2'] + files)
    b = logprobs_cli(['--model', str(tiny_model_dir), '--out', str(tmp_path / 'b.jsonl'), '--only', str(tmp_path / 'a.jsonl')] + files)
    assert a['samples'] == b['samples'] <= 10
    assert read_logprobs(tmp_path / 'a.jsonl')['logprob'].tolist() == pytest.approx(read_logprobs(tmp_path / 'b.jsonl')['logprob'].tolist(), abs=1e-4)
    fail = next(v for v in verdicts if v['verdict'] != 'pass')
    write_records(tmp_path / 'odd.jsonl', [{'name': fail['name'], 'sample_idx': fail['sample_idx'], 'logprob': -1.0, 'n_tokens': 3}])
    with pytest.raises(BadInput, match='not pass samples'):
        logprobs_cli(['--model', str(tiny_model_dir), '--out', str(tmp_path / 'c.jsonl'), '--only', str(tmp_path / 'odd.jsonl')] + files)
    with pytest.raises(BadInput, match='different correct samples'):
        uplift_cli(['--before', str(tmp_path / 'a.jsonl'), '--after', str(tmp_path / 'odd.jsonl'), '--out-dir', str(tmp_path)])
    assert not (tmp_path / 'c.jsonl').exists() and not (tmp_path / 'uplift.json').exists()
    res = uplift_cli(['--before', str(tmp_path / 'a.jsonl'), '--after', str(tmp_path / 'b.jsonl'), '--out-dir', str(tmp_path)])
    assert res['samples'] == a['samples'] and res['uplift_rate'] <= 1 and (tmp_path / 'uplift.png').exists()


# -- the lever in 02_sft's rows and training --------------------------------------------------------------

def _lp(samples, seed=0):
    "Random (summed log-prob, tokens) of every sample."
    rng = random.Random(seed)
    return {(s['name'], s['sample_idx']): (rng.uniform(-50, -1), rng.randint(1, 60)) for s in samples}


def rtu_advantages(correct, logprob_mean, rank_penalty, epsilon=1e-6):
    """The paper's trainer for one group, transcribed: AndreHe02/rewarding-unlikely-release @ ca1cff0,
    verl/trainer/ppo/ray_lean_trainer.py, `_compute_advantages` (l. 630-684): rank all G samples by their per-token
    mean old log-prob, scores * (1 - rank/G * rank_penalty), then (s - mean) / (std + eps), mean 0 / std 1 for G = 1."""
    scores = torch.tensor([1.0 if c else 0.0 for c in correct], dtype=torch.float64)
    ranks = torch.argsort(torch.argsort(torch.tensor(logprob_mean, dtype=torch.float64))) / len(correct)
    scores = scores * (1 - ranks * rank_penalty)
    if len(correct) == 1: return (scores / (1.0 + epsilon)).tolist()
    return ((scores - scores.mean()) / (scores.std() + epsilon)).tolist()


def test_advantages_are_the_trainers(records):
    "Random groups without ties: `lever_fields`' advantages equal the transcribed trainer's, at several beta_rank."
    rng = random.Random(5)
    for trial in range(200):
        G = rng.randint(1, 9)
        grp = {i: (rng.uniform(-80, -1), rng.randint(1, 90)) for i in range(G)}
        correct = {i for i in grp if rng.random() < 0.5} or {0}
        beta = rng.choice([0.1, 0.25, 0.5, 1.0])
        f = lever_fields(grp, correct, sorted(grp), 'unlikely', 'mean', beta)
        ref = rtu_advantages([i in correct for i in range(G)], [grp[i][0] / grp[i][1] for i in range(G)], beta)
        assert [f[i]['advantage'] for i in range(G)] == pytest.approx(ref, abs=1e-6)   # upstream's ranks/G is a float32 tensor


def test_weights_average_one_per_problem(records, tok):
    "Seeded rounds of n = 8 with 1..7 correct: every problem's rows average weight 1 (issue 30, point 3), whatever beta_rank and cap."
    problems, samples, verdicts = records
    by_name = {}
    for s in samples: by_name.setdefault(s['name'], []).append(s)
    for seed in range(3):
        rng = random.Random(seed)
        vs = [v | {'verdict': 'pass' if rng.random() < 0.5 else 'fail'} for v in verdicts]
        for beta, cap in ((0.1, 1), (0.25, 4), (0.5, 4), (1.0, 2)):
            rows, st_ = build_sft_rows(problems, samples, vs, tok, 1, max_per_problem=cap, logprobs=_lp(samples, seed), beta_rank=beta)
            per = pd.DataFrame(rows).groupby('name')['weight'].mean()
            assert len(per) and (per - 1).abs().max() < 1e-12, per
            assert all(r['weight'] > 0 for r in rows) and st_['dropped_zero_weight'] >= 0


def test_summed_and_mean_ranking_disagree_on_a_crafted_problem(tok):
    """Issue 30's crafted problem: s0 10 tokens -20, s1 100 -50, s2 40 -30 pass; s3-s5 fail. `unlikely` with a cap of 1
    keeps s0 (lowest mean, the shortest) by default and s1 (lowest sum, the longest) with rank_by = 'sum'."""
    p = read_problems(shared_data('minif2f_dsp15.jsonl'))[0]
    toks, sums = [10, 100, 40, 50, 20, 200], [-20, -50, -30, -30, -60, -80]
    samples = [{'name': p['name'], 'sample_idx': i, 'round': 1, 'completion': f'```lean4\n{p["formal_statement"]}\n  tac{i}\n```',
                'n_tokens': toks[i], 'capped': False} for i in range(6)]
    verdicts = [{'name': p['name'], 'sample_idx': i, 'verdict': 'pass' if i < 3 else 'fail', 'proof': f'tac{i}'} for i in range(6)]
    lp = {(p['name'], i): (float(sums[i]), toks[i]) for i in range(6)}
    kept = lambda **kw: [r['sample_idx'] for r in build_sft_rows([p], samples, verdicts, tok, 1, max_per_problem=1, rank='unlikely', logprobs=lp, **kw)[0]]
    assert kept() == [0] and kept(rank_by='mean') == [0] and kept(rank_by='sum') == [1]
    rows, _ = build_sft_rows([p], samples, verdicts, tok, 1, max_per_problem=3, rank='unlikely', logprobs=lp, beta_rank=0.25)
    assert {r['sample_idx']: r['weight'] for r in rows} == pytest.approx({0: 73 / 65, 2: 67 / 65, 1: 55 / 65})
    one = [v | {'verdict': 'pass' if v['sample_idx'] == 0 else 'fail'} for v in verdicts]   # solved once: weight 1, whatever beta
    for beta in (0.1, 0.25, 0.5):
        assert [r['weight'] for r in build_sft_rows([p], samples, one, tok, 1, logprobs=lp, beta_rank=beta)[0]] == [1.0]


def test_unlikely_rows_are_the_lowest_logprob_distinct_proofs_with_their_weights(records, tok):
    "Rows of `rank = 'unlikely'`: per problem with a contrast, the k least likely distinct proofs, with the group's rank and the trainer's advantage."
    problems, samples, verdicts = records
    lp = _lp(samples)
    rows, _ = build_sft_rows(problems, samples, verdicts, tok, 1, max_per_problem=2, rank='unlikely', logprobs=lp, beta_rank=0.25)
    passes, n = join_passes(samples, verdicts)
    mean = lambda name, i: lp[name, i][0] / lp[name, i][1]
    want = {}
    for name, ps in passes.items():
        if len(ps) == n[name]: continue   # solved by every sample: no contrast, no row
        best = {}
        for s, v in ps:
            t = proof_text(s, v)
            best[t] = min(best.get(t, (math.inf, 0)), (mean(name, s['sample_idx']), s['sample_idx']))
        group = sorted(i for nm, i in lp if nm == name)
        ok = {s['sample_idx'] for s, _ in ps}
        adv = dict(zip(group, rtu_advantages([i in ok for i in group], [mean(name, i) for i in group], 0.25)))
        kept = [i for _, i in sorted(best.values())[:2]]
        pos = {i: max(adv[i], 0) for i in kept}
        for i in kept: want[name, i] = (len(group), len(ok), len(kept) * pos[i] / sum(pos.values()) if len(kept) > 1 else 1.0)
    assert rows and {(r['name'], r['sample_idx']) for r in rows} == set(want)
    for r in rows:
        assert (r['group_size'], r['n_correct']) == want[r['name'], r['sample_idx']][:2]
        assert r['weight'] == pytest.approx(want[r['name'], r['sample_idx']][2])
        assert (r['rank_rule'], r['rank_by'], r['beta_rank'], r['logprob0']) == ('unlikely', 'mean', 0.25, lp[r['name'], r['sample_idx']][0])


def test_uplift_is_the_papers_compute_uplift_rate():
    """Issue 30, point 2: our uplift table equals the paper's `compute_uplift_rate` (AndreHe02/rewarding-unlikely-release
    @ ca1cff0, misc/paper_figures.ipynb, transcribed below with its hard-coded 32 as n): rank all n samples of a problem
    by initial log-prob (descending), mask the incorrect ones, average `after > before` per rank. Two problems, n = 4."""
    correct = np.array([[True, False, True, True], [False, True, True, False]])
    lp0 = np.array([[-3., -1., -7., -2.], [-4., -9., -2., -1.]])
    lp1 = np.array([[-2., -1., -8., -1.], [-5., -8., -3., -0.5]])
    ref = np.zeros_like(lp0)
    for k in range(len(lp0)):   # compute_uplift_rate, positives=True, incr=True
        order = np.argsort(lp0[k])[::-1]
        ref[k] = lp1[k][order] > lp0[k][order]
        ref[k][~correct[k][order]] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter('ignore'); avg_per_rank = np.nanmean(ref, axis=0)
    before = pd.DataFrame([{'name': f'p{k}', 'sample_idx': i, 'logprob': lp0[k, i], 'n_tokens': 5, 'correct': bool(correct[k, i])}
                           for k in range(2) for i in range(4)])
    after = pd.DataFrame([{'name': f'p{k}', 'sample_idx': i, 'logprob': lp1[k, i], 'n_tokens': 5}
                          for k in range(2) for i in range(4) if correct[k, i]])
    ranked, report = uplift_report(before, after)
    rate = {t['rank']: t['rate'] for t in report['table']}
    for j, want in enumerate(avg_per_rank):
        assert (j not in rate) if np.isnan(want) else rate[j] == pytest.approx(want)
    assert report['summary']['samples'] == int(correct.sum())


def test_the_averaged_after_model_mixes_in_a_pull_to_the_base(tiny_model_dir, tok, records):
    """Issue 30, point 4: base A, round 1's output B = A + noise; round 2 trains nothing (merged = B) and averages with the
    base (0.3 A + 0.7 B). The update curve (input B -> merged) moves nothing; the averaged curve moves every sample."""
    from transformers import AutoModelForCausalLM
    A = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    B = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    avg = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for (_, a), (_, b), (_, m) in zip(A.named_parameters(), B.named_parameters(), avg.named_parameters()):
            b.add_(0.05 * torch.randn(b.shape, generator=g)); m.copy_(0.3 * a + 0.7 * b)
    rows = correct_rows(*records, tok)[:12]
    frame = lambda m: pd.DataFrame(score_rows(m, tok, rows))
    before = frame(B)
    update, rnd = uplift_report(before, frame(B))[1]['summary'], uplift_report(before, frame(avg))[1]['summary']
    assert update['mean_change'] == 0 and update['uplift_rate'] == 0
    assert rnd['mean_change'] != 0 and abs(rnd['mean_change']) > 1e-3


def test_default_rows_are_unchanged(records, tok, tmp_path):
    "The defaults (shortest, beta_rank 0) write the same bytes whether or not log-probs are at hand, and no lever field."
    from ei_nb.core import write_records
    problems, samples, verdicts = records
    plain, _ = build_sft_rows(problems, samples, verdicts, tok, 1)
    given, _ = build_sft_rows(problems, samples, verdicts, tok, 1, logprobs=_lp(samples))
    write_records(tmp_path / 'a.jsonl', plain); write_records(tmp_path / 'b.jsonl', given)
    assert (tmp_path / 'a.jsonl').read_bytes() == (tmp_path / 'b.jsonl').read_bytes()
    assert set().union(*plain) == {'name', 'sample_idx', 'round', 'prompt', 'completion', 'eos', 'n_tokens', 'n_prompt_tokens', 'completion_tokens'}
    shortest_w, st_ = build_sft_rows(problems, samples, verdicts, tok, 1, logprobs=_lp(samples), beta_rank=0.5)
    zero = {(c['name'], c['sample_idx']) for c in st_['candidates'] if c['status'] == 'zero_weight'}
    assert len(zero) == st_['dropped_zero_weight'] and {(r['name'], r['sample_idx']) for r in shortest_w}.isdisjoint(zero)
    assert [(r['name'], r['sample_idx']) for r in shortest_w] == [(r['name'], r['sample_idx']) for r in plain if (r['name'], r['sample_idx']) not in zero]
    assert {r['rank_rule'] for r in shortest_w} == {'shortest'} and (pd.DataFrame(shortest_w).groupby('name')['weight'].mean() - 1).abs().max() < 1e-12


def test_weights_reach_the_training_loss(tiny_model_dir, tok, records, tmp_path):
    "One full-fine-tune step: the first logged loss is the weighted completion loss of the step over its token count."
    from transformers import AutoModelForCausalLM
    problems, samples, verdicts = records
    rows, _ = build_sft_rows(problems, samples, verdicts, tok, 1, max_per_problem=2, rank='unlikely', logprobs=_lp(samples), beta_rank=0.25)
    rows = rows[:3]
    m = train_lora(tiny_model_dir, rows, tmp_path / 'w', lr=1e-3, full_finetune=True, batch_tokens=10**6, max_steps=1, save_every=0, epochs=1)
    exs, _ = tokenize_rows(rows, tok)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        hand = sum(e['weight'] * completion_loss(model, **collate([{k: e[k] for k in ('ids', 'n_prompt')}], [0])).item() for e in exs)
    n_tgt = sum(len(e['ids']) - e['n_prompt'] for e in exs)
    assert m['first_loss'] == pytest.approx(hand / n_tgt, rel=1e-4)
    assert {e['weight'] for e in exs} != {1.0}


def test_score_passes_only_and_cap(records, tiny_model_dir, tok):
    problems, samples, verdicts = records
    allp = score_passes(tiny_model_dir, problems, samples, verdicts, device='cpu')
    assert len(allp) == sum(v['verdict'] == 'pass' for v in verdicts)
    capped = score_passes(tiny_model_dir, problems, samples, verdicts, max_samples=10, seed=3, device='cpu')
    assert 0 < len(capped) <= 10
    again = score_passes(tiny_model_dir, problems, samples, verdicts, only=[(x['name'], x['sample_idx']) for x in capped], device='cpu')
    assert [(x['name'], x['sample_idx']) for x in again] == [(x['name'], x['sample_idx']) for x in capped]
    assert [x['logprob'] for x in again] == pytest.approx([x['logprob'] for x in capped], abs=1e-4)


@pytest.mark.slow
def test_stage_runs_under_papermill_on_a_tiny_model(records, tiny_model_dir, tok, tmp_path):
    """The stage as the driver runs it (papermill, injected paths, a cap): its files, and the diagnostic of a model
    against itself (no sample's log-prob rises; every rank present with its count)."""
    import json
    from pathlib import Path
    import papermill as pm
    from ei_nb.core import write_records
    from ei_nb.layout import RunLayout, read_stage_json
    problems, samples, verdicts = records
    R = RunLayout(tmp_path / 'run').round(1)
    R.dir.mkdir(parents=True)
    write_records(R.selected, problems); write_records(R.samples, samples); write_records(R.verdicts, verdicts)
    rows, _ = build_sft_rows(problems, samples, verdicts, tok, 1)
    write_records(R.sft_rows, rows)
    nb = Path(__file__).resolve().parents[1] / 'nbs' / '03c_sharpen.ipynb'
    pm.execute_notebook(str(nb), str(R.notebook('03c_sharpen')), kernel_name='python3', progress_bar=False, cwd=str(nb.parent),
                        parameters={'problems_path': str(R.selected), 'samples_path': str(R.samples), 'verdicts_path': str(R.verdicts),
                                    'model_in': str(tiny_model_dir), 'model_out': str(tiny_model_dir), 'sft_path': str(R.sft_rows),
                                    'logprobs_in_path': str(R.sft_logprobs), 'out_dir': str(R.dir), 'max_samples': 30,
                                    'stage_json': str(R.stage_json('03c_sharpen')), 'style': 'chat'})
    rec = read_stage_json(R.stage_json('03c_sharpen'))
    up = json.loads(R.uplift_json.read_text())
    assert 0 < rec['headline']['samples'] <= 30 and rec['headline']['uplift_rate'] == 0
    assert sum(t['count'] for t in up['table']) == rec['headline']['samples'] == len(list(open(R.logprobs_out)))
    kept = {(r['name'], r['sample_idx']) for r in rows}
    scored = {(json.loads(l)['name'], json.loads(l)['sample_idx']) for l in open(R.logprobs_in)}
    assert up['kept_change']['kept']['count'] == len(kept & scored)
    assert R.uplift_png.read_bytes()[:4] == b'\x89PNG' and not up['reused_input_logprobs']


def test_sft_data_cli_takes_the_lever_from_a_logprobs_file(tmp_path, tiny_model_dir, records):
    "`ei sft-data --rank unlikely --beta-rank 0.25 --logprobs F` (F from `ei logprobs`); without F it is bad input, nothing written."
    import json
    from ei_nb.core import BadInput, write_records
    from ei_nb.sft import sft_data_cli
    from ei_nb.sharpen import logprobs_cli
    problems, samples, verdicts = records
    paths = {k: tmp_path / f'{k}.jsonl' for k in ('problems', 'samples', 'verdicts')}
    for k, recs in zip(paths, records): write_records(paths[k], recs)
    files = [x for k, p in paths.items() for x in (f'--{k}', str(p))]
    logprobs_cli(['--model', str(tiny_model_dir), '--out', str(tmp_path / 'pass.jsonl')] + files)
    logprobs_cli(['--model', str(tiny_model_dir), '--out', str(tmp_path / 'lp.jsonl'), '--groups'] + files)
    common = files + ['--tokenizer', str(tiny_model_dir), '--min-rows', '1', '--rank', 'unlikely']
    with pytest.raises(BadInput, match='needs the log-prob'): sft_data_cli(common + ['--out', str(tmp_path / 'x.jsonl')])
    with pytest.raises(BadInput, match='no log-prob for sample'):   # a file of passes lacks the failures the group ranking needs
        sft_data_cli(common + ['--out', str(tmp_path / 'x.jsonl'), '--logprobs', str(tmp_path / 'pass.jsonl')])
    assert not (tmp_path / 'x.jsonl').exists()
    sft_data_cli(common + ['--out', str(tmp_path / 'rows.jsonl'), '--logprobs', str(tmp_path / 'lp.jsonl'), '--beta-rank', '0.25'])
    rows = [json.loads(l) for l in open(tmp_path / 'rows.jsonl')]
    lp = logprob_table([json.loads(l) for l in open(tmp_path / 'lp.jsonl')])
    want, _ = build_sft_rows(problems, samples, verdicts, tiny_model_dir, 0, rank='unlikely', logprobs=lp, beta_rank=0.25)
    assert rows and rows == want and all(r['logprob0'] == lp[r['name'], r['sample_idx']][0] for r in rows)

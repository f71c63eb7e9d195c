"""Benchmark of 02_sft training on CPU: tokens/s and padding fraction of the tiny model on rows with the
real proof-length distribution (DeepSeek-Prover-V2's 438 miniF2F solutions as completions of the real prompt).

    OMP_NUM_THREADS=1 python bench/bench_sft.py [--rows 438] [--epochs 1] [--compare 48] [--out FILE]

Prints one JSON object (last line). Three parts:
- `train`: a full `train_lora` run (LoRA r 64 / alpha 128, all linear layers, one row per forward pass,
  gradient accumulation to `--batch-tokens`): tokens/s (wall and per CPU second) and the padding fraction
  measured on the tensors fed to the model.
- `padding`: the padding fraction other batchings would have on the same lengths (computed, no training):
  random batches of 8 padded to the longest, transformers' `group_by_length` (mega-batches of 50 batches
  sorted by length), length-sorted padded micro-batches inside our token-budget steps, and packing.
- `compare`: measured forward+backward tokens/s of the same `--compare` rows one per pass, padded in
  length-grouped batches of 4 (attention mask), and packed with position ids (block-diagonal mask).
The machine may be shared: wall tokens/s moves with its load, tokens per CPU second much less.
"""
import argparse, json, random, sys, tempfile, time
from pathlib import Path

import torch

from ei_nb.core import iter_jsonl, read_problems, shared_data
from ei_nb.prompts import render_prompt
from ei_nb.rows import collate, micro_batches, tokenize_rows
from ei_nb.train import completion_loss, plan_steps, train_lora
from ei_nb.tiny import build_tiny_model


def solution_rows(tok, n: int) -> list[dict]:
    "SFT rows: the real chat prompt of each miniF2F problem and DeepSeek-Prover-V2's full solution as the completion."
    problems = {p['name']: p for p in read_problems(shared_data('minif2f_dsp15.jsonl'))}
    rows = []
    for i, (_, r) in enumerate(iter_jsonl(shared_data('deepseek_prover_v2_minif2f_solutions.jsonl'))):
        if i >= n: break
        rows.append({'name': r['name'], 'sample_idx': 0, 'prompt': render_prompt(problems[r['name']], tok, 'chat'),
                     'completion': '```lean4\n' + r['full_code'] + '\n```', 'eos': True})
    return rows


def pad_frac(batches, lengths) -> float:
    real = sum(lengths[i] for b in batches for i in b)
    fed = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    return 1 - real / fed


def padding_alternatives(lengths, batch_tokens, seed=0, bs=8) -> dict:
    rng = random.Random(seed)
    order = list(range(len(lengths))); rng.shuffle(order)
    rand = [order[i:i + bs] for i in range(0, len(order), bs)]
    mega = [sorted(order[i:i + 50 * bs], key=lambda j: -lengths[j]) for i in range(0, len(order), 50 * bs)]
    grouped = [m[i:i + bs] for m in mega for i in range(0, len(m), bs)]
    in_steps = []   # length-sorted padded micro-batches of at most 16k padded tokens inside our steps
    for step in plan_steps(lengths, batch_tokens, 1, seed):
        cur = []
        for i in sorted(step, key=lambda j: -lengths[j]):
            if cur and (len(cur) + 1) * lengths[cur[0]] > 16384: in_steps.append(cur); cur = []
            cur.append(i)
        if cur: in_steps.append(cur)
    packs = [p for s in plan_steps(lengths, batch_tokens, 1, seed) for p in micro_batches(s, lengths, 18432)]
    return {'random_batches_of_8': pad_frac(rand, lengths), 'group_by_length_8': pad_frac(grouped, lengths),
            'sorted_micro_batches_in_steps': pad_frac(in_steps, lengths), 'packed_position_ids': 0.0,
            'pack_fill_of_18432': sum(lengths) / (18432 * len(packs)), 'one_row_per_pass': 0.0}


def padded_loss(model, examples, idxs):
    "Completion loss of a right-padded batch with an attention mask (what a padding collator feeds)."
    T = max(len(examples[i]['ids']) for i in idxs)
    ids = torch.zeros(len(idxs), T, dtype=torch.long); att = torch.zeros_like(ids); tgt = torch.zeros_like(ids, dtype=torch.bool)
    for r, i in enumerate(idxs):
        e = examples[i]; n = len(e['ids'])
        ids[r, :n] = torch.tensor(e['ids']); att[r, :n] = 1; tgt[r, e['n_prompt']:n] = True
    h = model.model(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
    m = tgt[:, 1:]
    return torch.nn.functional.cross_entropy(model.lm_head(h[:, :-1][m]).float(), ids[:, 1:][m], reduction='sum')


def timed(fn, passes, n_tokens) -> dict:
    w, c = time.perf_counter(), time.process_time()
    for p in passes: fn(p).backward()
    w, c = time.perf_counter() - w, time.process_time() - c
    return {'tokens_per_s': n_tokens / w, 'tokens_per_cpu_s': n_tokens / c}


def compare(model_dir, examples, n, seed=0) -> dict:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir).train()
    idx = random.Random(seed).sample(range(len(examples)), min(n, len(examples)))
    lengths = {i: len(examples[i]['ids']) for i in idx}
    tokens = sum(lengths.values())
    by_len = sorted(idx, key=lambda i: -lengths[i])
    groups = [by_len[k:k + 4] for k in range(0, len(by_len), 4)]
    packs = micro_batches(idx, [len(e['ids']) for e in examples], 8192)
    timed(lambda i: completion_loss(model, **collate(examples, [i])), idx[:2], 1)   # warm-up
    return {'rows': len(idx), 'tokens': tokens,
            'one_row_per_pass': timed(lambda i: completion_loss(model, **collate(examples, [i])), idx, tokens),
            'padded_grouped_4': timed(lambda g: padded_loss(model, examples, g), groups, tokens)
                                | {'padding_fraction': pad_frac(groups, lengths)},
            'packed_8192': timed(lambda p: completion_loss(model, **collate(examples, p)), packs, tokens)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--rows', type=int, default=438); ap.add_argument('--epochs', type=int, default=1)
    ap.add_argument('--batch-tokens', type=int, default=65536); ap.add_argument('--compare', type=int, default=48)
    ap.add_argument('--out')
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix='bench_sft_'))
    model_dir = build_tiny_model(work / 'tiny')
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = solution_rows(tok, a.rows)
    examples, _ = tokenize_rows(rows, tok, 18432)
    lengths = [len(e['ids']) for e in examples]
    res = {'rows': len(rows), 'tokens': sum(lengths), 'length_percentiles': {q: sorted(lengths)[int(q / 100 * (len(lengths) - 1))] for q in (0, 10, 50, 90, 100)},
           'padding': padding_alternatives(lengths, a.batch_tokens)}
    if a.compare: res['compare'] = compare(model_dir, examples, a.compare)
    c0 = time.process_time()
    m = train_lora(model_dir, rows, work / 'out', epochs=a.epochs, batch_tokens=a.batch_tokens, save_every=0, log_every=5)
    cpu = time.process_time() - c0
    res['train'] = {k: m[k] for k in ('rows', 'steps', 'tokens', 'tokens_per_s', 'padding_fraction', 'train_s', 'first_loss', 'final_loss')}
    res['train']['tokens_per_cpu_s'] = m['tokens'] * a.epochs / cpu
    res['train']['merge_rel_diff'] = m['merge_rel_diff']
    res['threads'] = torch.get_num_threads()
    if a.out: Path(a.out).write_text(json.dumps(res, indent=2) + '\n')
    print(json.dumps(res))


if __name__ == '__main__':
    sys.exit(main())

"""Benchmark of the uplift-rate diagnostic (07_sharpen) against 02_sft training on CPU, and its projection to the
reference setting.

    OMP_NUM_THREADS=1 python bench/bench_sharpen.py [--rows 96] [--epochs 2] [--out FILE]

Rows: DeepSeek-Prover-V2's miniF2F solutions as completions of the real chat prompt (the real proof-length
distribution, as bench_sft.py). On the same rows and the tiny model it measures
- `train`: one `ei_nb.sft.train_lora` run (the recipe's LoRA r 64 / alpha 128, all linear layers, `--epochs`,
  one row per forward pass, checkpoints off), its wall and CPU seconds, and the export;
- `diagnostic`: what a round adds: load the input model and score every row (`score_rows`), load the output
  model (the merged one here) and score them again, then rank and tabulate (`rank_by_logprob`, `uplift_table`);
and reports the diagnostic's cost as a fraction of the SFT run (wall, and CPU seconds, which move less
with a shared machine's load), and scoring vs training tokens per CPU second.

`projection` applies the compute model of the design (t_sft = rows L E / (0.9 r_tr)) to the reference
setting. It is a PROJECTION, not a measurement: scoring is forward-only, so per token it is taken to run
`k` times faster than LoRA training, k = 2 (training = forward + backward) to 3 (forward + recomputed forward
under gradient checkpointing + backward), and the diagnostic scores every correct sample (C of them) twice.
The CPU measurement of the same ratio on the tiny model is printed beside it, not used (a 64-wide model
on one thread is dominated by per-op overhead, not FLOPs).
Prints one JSON object (last line).
"""
import argparse, json, sys, tempfile, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_sft import solution_rows   # noqa: E402

from ei_nb.sft import train_lora   # noqa: E402
from ei_nb.sharpen import load_scorer, rank_by_logprob, score_rows, uplift_table   # noqa: E402
from ei_nb.tiny import build_tiny_model   # noqa: E402


class Clock:
    "Wall and CPU seconds of a block."
    def __enter__(self): self.w, self.c = time.perf_counter(), time.process_time(); return self
    def __exit__(self, *a): self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


def score(model_dir, tok, rows):
    with Clock() as load: model = load_scorer(model_dir, 'cpu')
    with Clock() as run: s = score_rows(model, tok, rows)
    return s, {'load_s': load.wall, 'score_s': run.wall, 'score_cpu_s': run.cpu + load.cpu, 'score_run_cpu_s': run.cpu}


def projection(rows: int, correct: int, L: float, E: int, r_tr: float) -> dict:
    "The design's compute model at the reference setting, diagnostic over SFT time for k = 2 and 3."
    t_sft = rows * L * E / (0.9 * r_tr)
    out = {'inputs': {'sft_rows': rows, 'correct_samples_scored': correct, 'tokens_per_row': L, 'epochs': E,
                      'r_tr_padded_tok_per_s': r_tr},
           't_sft_h': t_sft / 3600}
    for k in (2, 3):
        t_diag = 2 * correct * L / (k * r_tr)
        out[f'k={k}'] = {'t_diagnostic_h': t_diag / 3600, 'fraction_of_sft': t_diag / t_sft}
    out['formula'] = 't_diag / t_sft = (2 C L / (k r_tr)) / (rows L E / (0.9 r_tr)) = 1.8 C / (k E rows)'
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--rows', type=int, default=96); ap.add_argument('--epochs', type=int, default=2)
    ap.add_argument('--batch-tokens', type=int, default=65536)
    ap.add_argument('--ref-problems', type=int, default=300, help='P: problems of a reference round')
    ap.add_argument('--ref-correct-per-problem', type=float, default=3.5,
                    help='mean correct samples of a selected problem (band 0 < p <= 0.75 of n = 8: 1..6, mean 3.5)')
    ap.add_argument('--ref-rows-per-problem', type=float, default=3.0, help='kept rows per problem (min(c, 4) over c = 1..6: 3.0)')
    ap.add_argument('--ref-tokens', type=float, default=5000, help='L: tokens per row (the design\'s T)')
    ap.add_argument('--r-tr', type=float, default=2152, help='training throughput, padded tok/s (design, 4xA10G)')
    ap.add_argument('--out')
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix='bench_sharpen_'))
    model_dir = build_tiny_model(work / 'tiny')
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = solution_rows(tok, a.rows)
    with Clock() as tr:
        m = train_lora(model_dir, rows, work / 'out', epochs=a.epochs, batch_tokens=a.batch_tokens, save_every=0, log_every=10)
    s0, before = score(model_dir, tok, rows)
    s1, after = score(work / 'out' / 'merged', tok, rows)
    with Clock() as tab:
        ranked = rank_by_logprob([x | {'logprob0': x['logprob'], 'logprob1': y['logprob']} for x, y in zip(s0, s1)])
        table = uplift_table(ranked)
    diag_wall = before['load_s'] + before['score_s'] + after['load_s'] + after['score_s'] + tab.wall
    diag_cpu = before['score_cpu_s'] + after['score_cpu_s'] + tab.cpu
    train_tok_cpu = m['tokens'] * a.epochs / tr.cpu   # every token of a row is fed, prompt included, in training and in scoring
    for d in (before, after): d['tokens_per_cpu_s'] = m['tokens'] / d['score_run_cpu_s']
    res = {'rows': len(rows), 'completion_tokens': m['completion_tokens'], 'tokens': m['tokens'], 'epochs': a.epochs,
           'train': {'train_s': m['train_s'], 'wall_s_with_load_and_export': tr.wall, 'cpu_s': tr.cpu, 'steps': m['steps'],
                     'tokens_per_cpu_s': train_tok_cpu},
           'diagnostic': {'before': before, 'after': after, 'tabulate_s': tab.wall, 'wall_s': diag_wall, 'cpu_s': diag_cpu,
                          'uplift_rate': float((ranked['logprob1'] > ranked['logprob0']).mean()), 'ranks': len(table)},
           'fraction_of_sft': {'wall': diag_wall / tr.wall, 'cpu': diag_cpu / tr.cpu, 'vs_train_s_only': diag_wall / m['train_s']},
           'cpu_score_vs_train_tokens_per_s': before['tokens_per_cpu_s'] / train_tok_cpu,
           'threads': torch.get_num_threads()}
    P = a.ref_problems
    res['projection'] = projection(round(P * a.ref_rows_per_problem), round(P * a.ref_correct_per_problem), a.ref_tokens, 2, a.r_tr)
    res['projection']['note'] = ('projection from the compute model, not a measurement; uncapped (every correct sample scored twice); '
                                 'a max_samples cap scales t_diagnostic by max_samples / C; two model loads come on top')
    if a.out: Path(a.out).write_text(json.dumps(res, indent=2) + '\n')
    print(json.dumps(res))


if __name__ == '__main__':
    sys.exit(main())

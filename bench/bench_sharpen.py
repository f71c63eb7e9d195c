"""Benchmark of the uplift-rate diagnostic (03c_sharpen) against 02_sft training on CPU, and its projection to the
reference setting.

    OMP_NUM_THREADS=1 python bench/bench_sharpen.py [--rows 96] [--epochs 2] [--run-dir RUN] [--out FILE]

Rows: DeepSeek-Prover-V2's miniF2F solutions as completions of the real chat prompt (the real proof-length
distribution, as bench_sft.py). On the same rows and the tiny model it measures
- `train`: one `ei_nb.train.train_lora` run (the recipe's LoRA r 64 / alpha 128, all linear layers, `--epochs`,
  one row per forward pass, checkpoints off), its wall and CPU seconds, and the export;
- `diagnostic`: what a round adds: load the input model and score every row (`score_rows`), load the output
  model (the merged one here) and score them again, then rank and tabulate (`rank_by_logprob`, `uplift_table`);
and reports the diagnostic's cost as a fraction of the SFT run (wall, and CPU seconds, which move less
with a shared machine's load), and scoring vs training tokens per CPU second.

With `--run-dir` (a finished `ei run` with `[sharpen] enabled = true`, e.g. configs/demo_unlikely.toml) it
also reads, per round, the wall seconds of the 03c_sharpen and 02_sft stages from their stage.json files:
the diagnostic's cost as a fraction of the round's SFT in the same run (kernel start and imports included).

`projection` is the ETA's compute model (`ei_nb.eta`: `stage_work`, `model_seconds`) on the reference config
configs/goedel8b.toml with the diagnostic switched on (`--set sharpen.enabled=true`), at P = 300 selected
problems: 03c_sharpen scores min(max_samples, P x correct_per_problem) samples twice at `score_speedup` x the
training rate r_tr (forward only: 2 (forward + backward) to 3 (with the recomputed forward of gradient
checkpointing)), against 02_sft's training time. It is a PROJECTION, not a measurement, printed for the
default cap (400) and uncapped. The CPU ratio on the tiny model is printed beside it, not used (a 64-wide
model on one thread is dominated by per-op overhead, not FLOPs).
Prints one JSON object (last line).
"""
import argparse, json, sys, tempfile, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_sft import solution_rows   # noqa: E402

from ei_nb.train import train_lora   # noqa: E402
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


def projection(config: Path, P: int = 300) -> dict:
    "03c_sharpen against 02_sft by the ETA's compute model on `config` (the diagnostic switched on), per cap and scoring speed-up."
    from ei_nb.config import load_config
    from ei_nb.eta import model_seconds, stage_work
    out = {'config': str(config), 'P': P}
    for cap in (400, 0):
        for k in (2.0, 2.5, 3.0):
            cfg = load_config(config, [f'sharpen.enabled=true', f'sharpen.max_samples={cap}', f'eta.score_speedup={k}'], warn=lambda m: None)
            t_sft = model_seconds('02_sft', cfg, stage_work('02_sft', cfg, P, 244))
            work = stage_work('03c_sharpen', cfg, P, 244)
            t_diag = model_seconds('03c_sharpen', cfg, work)
            out[f'max_samples={cap or "all"}, score_speedup={k}'] = {'samples_scored': work, 't_sft_h': round(t_sft / 3600, 3),
                                                                      't_diagnostic_h': round(t_diag / 3600, 3), 'fraction_of_sft': round(t_diag / t_sft, 4)}
    return out


def run_fractions(run_dir: Path) -> dict:
    "Per round of a finished run: wall seconds of 03c_sharpen and 02_sft (their stage.json) and the ratio."
    from ei_nb.layout import RunLayout, read_stage_json
    L, out = RunLayout(run_dir), {}
    for r in L.rounds():
        sh, sft = (read_stage_json(L.round(r).stage_json(s)) for s in ('03c_sharpen', '02_sft'))
        if sh and sft:   # stage.json: the runner's own work; the marker: the whole step (kernel start and library cells included)
            mk = {s: json.loads(L.round(r).marker(s).read_text())['wall_s'] for s in ('03c_sharpen', '02_sft')}
            out[f'round {r}'] = {'07_sharpen_stage_s': sh['wall_s'], '02_sft_stage_s': sft['wall_s'], 'fraction_stage': sh['wall_s'] / sft['wall_s'],
                                 '07_sharpen_step_s': mk['03c_sharpen'], '02_sft_step_s': mk['02_sft'], 'fraction_step': mk['03c_sharpen'] / mk['02_sft'],
                                 'scoring_s': sh['headline'].get('score_s'), 'samples': sh['headline'].get('samples')}
    summary = json.loads(L.summary.read_text()) if L.summary.exists() else {}
    if summary.get('wall_s'):
        steps = sum(v['07_sharpen_step_s'] for v in out.values())
        out['run'] = {'wall_s': summary['wall_s'], '07_sharpen_steps_s': steps, 'fraction_of_run': steps / summary['wall_s']}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--rows', type=int, default=96); ap.add_argument('--epochs', type=int, default=2)
    ap.add_argument('--batch-tokens', type=int, default=65536)
    ap.add_argument('--ref-problems', type=int, default=300, help='P: problems of a reference round')
    ap.add_argument('--ref-config', default=str(Path(__file__).resolve().parents[1] / 'configs' / 'goedel8b.toml'))
    ap.add_argument('--run-dir', help='a finished `ei run` with the diagnostic on: its per-round stage wall times')
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
    res['projection'] = projection(Path(a.ref_config), a.ref_problems)
    res['projection']['note'] = 'projection from the compute model (ei_nb.eta), not a measurement; two model loads come on top'
    if a.run_dir: res['run'] = run_fractions(Path(a.run_dir))
    if a.out: Path(a.out).write_text(json.dumps(res, indent=2) + '\n')
    print(json.dumps(res))


if __name__ == '__main__':
    sys.exit(main())

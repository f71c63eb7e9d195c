"""Benchmark of training/dpo against 02_sft on CPU: time and peak memory per row, same model, same rows.

    OMP_NUM_THREADS=1 python bench/bench_dpo.py [--rows 48] [--hidden 64] [--layers 2] [--out FILE]

Rows have the real proof-length distribution: the real chat prompt of a miniF2F problem and DeepSeek-Prover-V2's
published solution as the completion (the SFT row, and the DPO winner). The DPO loser is the same solution with
its last tactic line replaced (a wrong proof of about the same length). Each measurement runs in its own process:
- `load`: load the model for training and tokenize, no step (the baseline of peak RSS);
- `sft`: `train_lora` on the N winner rows, one epoch;
- `dpo`: `train_dpo` on the N pairs, one epoch (reference log-probs with the adapter disabled, then training).
Prints one JSON object (last line): seconds per row (SFT) and per pair (DPO), tokens/s, peak RSS and its rise over
`load`, and the DPO/SFT ratios. The machine may be shared: compare CPU seconds (`*_cpu_s`), which move less.

`--project configs/goedel8b.toml` adds `projection`: 02's time for the reference setting by the ETA compute model
(`ei_nb.eta`: SFT at `r_tr`, `row_tokens`, `rows_per_problem`, P = `max_problems`) and DPO's by the measured CPU
ratio per pair (and by the count, 8/3 SFT rows per pair); a projection, not a GPU measurement.
"""
import argparse, json, resource, subprocess, sys, tempfile, time
from pathlib import Path

from ei_nb.core import iter_jsonl, read_problems, shared_data, write_records
from ei_nb.prompts import render_prompt


def solution_pairs(tok, n: int) -> list[dict]:
    "Pairs: a published solution (winner) and the same solution with its last line made wrong (loser)."
    problems = {p['name']: p for p in read_problems(shared_data('minif2f_dsp15.jsonl'))}
    out = []
    for i, (_, r) in enumerate(iter_jsonl(shared_data('deepseek_prover_v2_minif2f_solutions.jsonl'))):
        if len(out) >= n: break
        code = r['full_code'].rstrip()
        wrong = code.rsplit('\n', 1)[0] + '\n  linarith'
        out.append({'name': r['name'], 'sample_idx': 0, 'prompt': render_prompt(problems[r['name']], tok, 'chat'),
                    'chosen': f'```lean4\n{code}\n```', 'rejected': f'```lean4\n{wrong}\n```', 'chosen_idx': 0,
                    'rejected_idx': 1, 'band': 0, 'pass_rate': 0.5})
    return out


def child(mode: str, model: str, data: str, out: str, batch: int) -> dict:
    "One measurement, in this process."
    c0, w0, last = time.process_time(), time.perf_counter(), {}
    mark = lambda step, loss: last.update(cpu_s=time.process_time() - c0)   # CPU seconds up to the last step (export excluded)
    if mode == 'load':
        import torch
        from ei_nb.rows import load_tokenizer, tokenize_rows
        from ei_nb.train import load_for_training
        from ei_nb.dpo import read_pairs, tokenize_pairs
        load_for_training(model, torch.device('cpu'), lora_r=64, lora_alpha=128)
        tokenize_pairs(read_pairs(data), load_tokenizer(model))
        res = {}
    elif mode == 'sft':
        from ei_nb.dpo import read_pairs
        from ei_nb.train import train_lora
        rows = [{'name': p['name'], 'sample_idx': 0, 'prompt': p['prompt'], 'completion': p['chosen']} for p in read_pairs(data)]
        m = train_lora(model, rows, out, epochs=1, batch_tokens=batch, save_every=0, log_every=1000, on_step=mark)
        res = {'rows': m['rows'], 'tokens': m['tokens'], 'train_s': m['train_s'], 'steps': m['steps']}
    else:
        from ei_nb.dpo import train_dpo
        m = train_dpo(model, data, out, batch_pairs=8, save_every=0, log_every=1000, on_step=mark)
        res = {'pairs': m['pairs'], 'tokens': m['tokens'], 'train_s': m['train_s'], 'reference_s': m['reference_s'], 'steps': m['steps']}
    return res | {'cpu_s_to_last_step': last.get('cpu_s', time.process_time() - c0), 'wall_s': time.perf_counter() - w0, 'cpu_s': time.process_time() - c0,
                  'peak_rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def project(config: str, pair_over_row: float) -> dict:
    "02's seconds at the reference setting of `config`: SFT by the ETA model, DPO by `pair_over_row` x an SFT row-epoch."
    from ei_nb.config import load_config
    from ei_nb.eta import model_seconds, stage_work
    cfg = load_config(config, warn=lambda *a: None)
    st, e, P = cfg['stages']['02_sft'], cfg['eta'], cfg['stages']['00_select']['max_problems']
    sft_s = model_seconds('02_sft', cfg, stage_work('02_sft', cfg, P, 0))
    row_epoch_s = e['row_tokens'] / (e['r_tr'] * e['sft_efficiency'])   # one SFT row, one epoch, at the measured GPU rate
    pairs = P * st['pairs_per_problem']                                  # an upper bound: problems with few proofs have fewer
    dpo = lambda ratio: pairs * st['dpo_epochs'] * row_epoch_s * ratio + e['export_s']
    return {'config': config, 'P': P, 'sft_rows': P * e['rows_per_problem'], 'sft_epochs': st['epochs'], 'dpo_pairs_at_most': pairs,
            'sft_row_epoch_s': row_epoch_s, 'sft_h': sft_s / 3600, 'dpo_h_measured_ratio': dpo(pair_over_row) / 3600,
            'dpo_h_counted_ratio': dpo(8 / 3) / 3600, 'sft_then_dpo_h': (sft_s + dpo(pair_over_row)) / 3600}


def run(mode, model, data, out, batch) -> dict:
    r = subprocess.run([sys.executable, __file__, '--child', mode, '--model', model, '--data', data, '--out-dir', out,
                        '--batch-tokens', str(batch)], capture_output=True, text=True)
    if r.returncode: sys.exit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--rows', type=int, default=48); ap.add_argument('--hidden', type=int, default=64)
    ap.add_argument('--layers', type=int, default=2); ap.add_argument('--out')
    ap.add_argument('--project', help='a run config (e.g. configs/goedel8b.toml): project 02 under dpo for it')
    ap.add_argument('--child'); ap.add_argument('--model'); ap.add_argument('--data'); ap.add_argument('--out-dir')
    ap.add_argument('--batch-tokens', type=int, default=0)
    a = ap.parse_args()
    if a.child: print(json.dumps(child(a.child, a.model, a.data, a.out_dir, a.batch_tokens))); return
    from ei_nb.rows import load_tokenizer
    from ei_nb.tiny import build_tiny_model
    tmp = Path(tempfile.mkdtemp())
    model = build_tiny_model(tmp / 'tiny', hidden_size=a.hidden, num_hidden_layers=a.layers, intermediate_size=2 * a.hidden)
    tok = load_tokenizer(model)
    pairs = solution_pairs(tok, a.rows)
    write_records(tmp / 'pairs.jsonl', pairs)
    chosen_tokens = [len(tok(p['prompt'] + p['chosen']).input_ids) for p in pairs]
    batch = int(sum(chosen_tokens) / len(pairs) * 8)   # SFT steps of about 8 rows, like DPO steps of 8 pairs
    res = {m: run(m, str(model), str(tmp / 'pairs.jsonl'), str(tmp / m), batch) for m in ('load', 'sft', 'dpo')}
    sft, dpo, base = res['sft'], res['dpo'], res['load']['peak_rss_mb']
    s_row = sft['train_s'] / sft['rows']
    d_pair = (dpo['train_s'] + dpo['reference_s']) / dpo['pairs']
    cpu_row = (sft['cpu_s_to_last_step'] - res['load']['cpu_s']) / sft['rows']
    cpu_pair = (dpo['cpu_s_to_last_step'] - res['load']['cpu_s']) / dpo['pairs']
    summary = {'model': {'hidden': a.hidden, 'layers': a.layers}, 'rows': len(pairs),
               'mean_row_tokens': sum(chosen_tokens) / len(pairs),
               'sft_s_per_row': s_row, 'dpo_s_per_pair': d_pair, 'dpo_reference_s_per_pair': dpo['reference_s'] / dpo['pairs'],
               'time_ratio_dpo_pair_over_sft_row': d_pair / s_row,
               'time_ratio_per_sequence': d_pair / 2 / s_row,
               'sft_cpu_s_per_row': cpu_row, 'dpo_cpu_s_per_pair': cpu_pair, 'cpu_ratio_dpo_pair_over_sft_row': cpu_pair / cpu_row,
               'sft_peak_rss_mb': sft['peak_rss_mb'], 'dpo_peak_rss_mb': dpo['peak_rss_mb'], 'load_peak_rss_mb': base,
               'rss_rise_ratio_dpo_over_sft': (dpo['peak_rss_mb'] - base) / max(sft['peak_rss_mb'] - base, 1e-9),
               'runs': res}
    if a.project: summary['projection'] = project(a.project, summary['cpu_ratio_dpo_pair_over_sft_row'])
    if a.out: Path(a.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == '__main__':
    main()

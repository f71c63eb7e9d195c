#!/usr/bin/env bash
# GPU smoke check (a few minutes at most; hard limit 8): on a CUDA machine, with no download and nothing beyond
# this repository and its installed dependencies, run each GPU path of a round once on a small Qwen3 built in code:
#   1. sample   the transformers sampler in bf16 (tokens/s)
#   2. train    one LoRA training step in bf16 with gradient checkpointing and the chunked completion loss
#               (ei_nb.train.load_for_training + loss_module), then a second step must lower the loss on the same rows
#   3. export   merge the adapter and export in bf16, reload, compare logits (ei_nb.train.export_model)
#   4. average  out = 0.3 * base + 0.7 * merged, streamed (ei_nb.average.average_checkpoints), checked on one tensor
# Prints tokens/s, peak GPU memory and PASS/FAIL per step; exit 0 when every step passes, 1 otherwise.
# Without CUDA it says why (with the NVIDIA driver nvidia-smi reports, when there is one) and exits 2 having run
# nothing, unless asked to rehearse on the CPU (--cpu, or EI_SMOKE_CPU=1).
#   bash bench/gpu_smoke.sh [--cpu] [WORK_DIR]   (default: a temporary folder, removed afterwards)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# --cpu (or EI_SMOKE_CPU=1) runs the same steps on the CPU in fp32 (a rehearsal of the script itself; its figures mean
# nothing)
if [ "${1:-}" = --cpu ]; then export EI_SMOKE_CPU=1; shift; fi
if [ "${EI_SMOKE_CPU:-0}" != 1 ] && ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
  echo "gpu_smoke: no CUDA device here (torch.cuda.is_available() is False; NVIDIA driver: ${driver:-none found}):" \
       "nothing was run. Run this on a GPU node (\`ei doctor\` names the driver torch needs: >= 580 for CUDA 13)," \
       "or rehearse on the CPU with --cpu." >&2
  exit 2
fi

WORK="${1:-$(mktemp -d)}"
[ -n "${1:-}" ] || trap 'rm -rf "$WORK"' EXIT
exec timeout 480 python - "$WORK" <<'PY'
import json, math, os, sys, time, traceback
from pathlib import Path
import torch

work = Path(sys.argv[1]); work.mkdir(parents=True, exist_ok=True)
cpu = os.environ.get('EI_SMOKE_CPU') == '1'
dev, dtype = (torch.device('cpu'), 'float32') if cpu else (torch.device('cuda'), 'bfloat16')
DT = getattr(torch, dtype)
sync = (lambda: None) if cpu else torch.cuda.synchronize
reset = (lambda: None) if cpu else torch.cuda.reset_peak_memory_stats
peak = (lambda: 0) if cpu else torch.cuda.max_memory_allocated
results = []

def step(name):
    def wrap(fn):
        sync(); reset(); t0 = time.perf_counter()
        try: info, ok = fn(), True
        except Exception as e: info, ok = {'error': f'{type(e).__name__}: {e}'}, False; traceback.print_exc()
        sync()
        results.append({'step': name, 'ok': ok, 'seconds': round(time.perf_counter() - t0, 2),
                        'peak_gpu_gb': round(peak() / 1e9, 3), **info})
        print(json.dumps(results[-1]), flush=True)
        return ok
    return wrap

if cpu: print('gpu_smoke: EI_SMOKE_CPU=1: a CPU rehearsal in fp32, not a GPU check', flush=True)
else:
    p = torch.cuda.get_device_properties(0)
    print(f'gpu_smoke: {torch.cuda.device_count()} x {p.name}, {p.total_memory/1e9:.0f} GB, bf16 {torch.cuda.is_bf16_supported()}, torch {torch.__version__}', flush=True)

from ei_nb.tiny import build_tiny_model
from ei_nb.core import read_problems, shared_data
from ei_nb.prompts import render_prompt
# a small Qwen3 (about 26 M parameters), saved in bf16: big enough for the GPU to matter, small enough for seconds
SIZE = dict(hidden_size=512, num_hidden_layers=8, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=4)
if cpu: SIZE = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
MAX_NEW, REPEAT = (24, 4) if cpu else (256, 40)
base = build_tiny_model(work/'base', seed=0, dtype=dtype, **SIZE)
problems = [q for q in read_problems(shared_data('minif2f_dsp15.jsonl')) if q['split'] == 'valid'][:16]

@step('sample')
def _():
    from ei_nb.samplers import TransformersSampler, SampleParams
    smp = TransformersSampler(base, device=dev.type, dtype=dtype)
    assert smp.model.dtype == DT
    prompts = [render_prompt(q, smp.tokenizer, 'completion') for q in problems]
    params = SampleParams(n=4, max_new_tokens=MAX_NEW, seed=0)
    smp.generate(prompts[:2], SampleParams(n=1, max_new_tokens=8), [0, 1])          # warm-up
    sync(); t = time.perf_counter()
    outs = smp.generate(prompts, params, list(range(len(prompts))))
    sync(); dt = time.perf_counter() - t
    toks = sum(s['n_tokens'] for o in outs for s in o)
    assert len(outs) == len(prompts) and all(len(o) == 4 for o in outs) and toks > 0
    assert outs == smp.generate(prompts, params, list(range(len(prompts))))            # seeded: reproducible
    return {'tokens': toks, 'tokens_per_s': round(toks / dt, 1)}

state = {}
@step('train')
def _():
    from ei_nb.rows import collate, tokenize_rows
    from ei_nb.train import load_for_training, loss_module
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(base)
    model, on_disk, bf16 = load_for_training(base, dev, lora_r=16, lora_alpha=32, gradient_checkpointing=True)
    assert (cpu or bf16) and next(model.parameters()).dtype == DT and model.base_model.model.is_gradient_checkpointing
    rows = [{'prompt': q['header'] + q['formal_statement'], 'completion': '  nlinarith [sq_nonneg (a - b)]\n' * REPEAT} for q in problems]
    examples, dropped = tokenize_rows(rows, tok, 18432)
    batch = collate(examples, list(range(len(examples))), dev)                         # packed rows, one forward
    lossf = loss_module(model, chunk=1024)                                              # chunked completion loss
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    n_target = int(batch['target_mask'][:, 1:].sum())
    losses = []
    sync(); t = time.perf_counter()
    for _ in range(2):
        loss = lossf(**batch) / n_target
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True); losses.append(loss.item())
    sync(); dt = time.perf_counter() - t
    assert all(math.isfinite(l) for l in losses) and losses[1] < losses[0], losses
    state.update(model=model, tok=tok, probe=[examples[0]['ids'][:64]])
    return {'tokens_per_step': batch['input_ids'].shape[1], 'train_tokens_per_s': round(2 * batch['input_ids'].shape[1] / dt, 1),
            'loss_first': round(losses[0], 4), 'loss_second': round(losses[1], 4)}

@step('export')
def _():
    from ei_nb.train import export_model
    info = export_model(state['model'], state['tok'], work/'sft', state['probe'], save_dtype=DT)
    assert (work/'sft'/'merged'/'config.json').is_file() and (work/'sft'/'adapter').is_dir()
    return {k: info[k] for k in ('merge_rel_diff', 'merge_tol', 'save_dtype')}

@step('average')
def _():
    from ei_nb.average import average_checkpoints
    from safetensors import safe_open
    t = time.perf_counter()
    rec = average_checkpoints(base, work/'sft'/'merged', work/'avg', ft_weight=0.7, threads=4, log=lambda *a: None)
    dt = time.perf_counter() - t
    name = 'model.layers.0.mlp.down_proj.weight'
    get = lambda d: safe_open(str(next(Path(d).glob('*.safetensors'))), 'pt').get_tensor(name).float()
    a, m, o = get(base), get(work/'sft'/'merged'), get(work/'avg')
    assert not torch.equal(a, m)                       # the LoRA step changed the weights
    err = (o - (0.3 * a + 0.7 * m)).abs().max().item()
    assert err <= (2 ** -7 if not cpu else 1e-6) * (0.3 * a.abs() + 0.7 * m.abs()).max().item(), err   # within rounding of the dtype
    size = sum(f.stat().st_size for f in Path(work/'avg').glob('*.safetensors'))
    return {'bytes': size, 'gb_per_s': round(size / dt / 1e9, 3), 'max_abs_err': err}

print('\nstep      result  seconds  peak GPU GB  figures')
for r in results:
    figs = {k: v for k, v in r.items() if k not in ('step', 'ok', 'seconds', 'peak_gpu_gb')}
    print(f"{r['step']:<9} {'PASS' if r['ok'] else 'FAIL':<7} {r['seconds']:>7}  {r['peak_gpu_gb']:>11}  {json.dumps(figs)}")
sys.exit(0 if all(r['ok'] for r in results) and len(results) == 4 else 1)
PY

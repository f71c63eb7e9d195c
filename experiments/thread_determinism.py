#!/usr/bin/env python
"""What varies across machines: does the learning demo's training depend on the CPU thread count, on torch's
deterministic algorithms, or on the CPU kernels (the instruction set torch, MKL and oneDNN dispatch to)?

    python experiments/thread_determinism.py [--epochs 3] [--out experiments/results/thread_determinism.json]

Each setting runs in its own process (the thread counts and the kernel environment are fixed before torch starts):
build the arith demo's tiny model for seed 1, warm-start it on the demo's warm-start rows for a few epochs (the demo
stage's own code: `ei_nb.demo.arith_warm_start`), then sample 64 completions with a fixed seed. It records a sha256 of
the trained weights, the final loss and the sampled texts; two settings agree when the weights hash the same.

Settings: 1 and 2 threads; `torch.use_deterministic_algorithms(True)`; this machine's kernels restricted to AVX2
(`ATEN_CPU_CAPABILITY=avx2`, `MKL_ENABLE_INSTRUCTIONS=AVX2`, `ONEDNN_MAX_CPU_ISA=AVX2`: what an AVX2-only CPU runs);
and portable kernels (`ATEN_CPU_CAPABILITY=default`, MKL's conditional numerical reproducibility `MKL_CBWR=COMPATIBLE`,
`ONEDNN_MAX_CPU_ISA=SSE41`), which any x86-64 CPU with SSE4.1 runs the same way. A second machine is needed to show
that the portable kernels remove the cross-machine difference; this script run there gives the other half.
"""
import argparse, hashlib, json, os, subprocess, sys, tempfile
from pathlib import Path

CHILD = r'''
import hashlib, json, os, sys, tempfile
from pathlib import Path
import torch
threads, deterministic, epochs = int(sys.argv[1]), sys.argv[2] == '1', int(sys.argv[3])
torch.set_num_threads(threads)
if deterministic: torch.use_deterministic_algorithms(True)
from ei_nb.arith import arith_sets, warm_rows
from ei_nb.demo import arith_warm_start
from ei_nb.config import load_config
d = load_config('configs/demo_learn.toml')['stages']['demo']
sets = arith_sets(1, d['arith_scored'], d['arith_pool'], d['arith_warm'], d.get('arith_test'))
out = Path(tempfile.mkdtemp())
m = arith_warm_start(out, warm_rows(sets['warm'], None, ('exact',)), epochs, d['lr'], 1, d['batch_tokens'],
                     d['pack_tokens'], d['hidden_size'], d['num_hidden_layers'], d['vocab_size'])
from safetensors.torch import load_file
w = load_file(str(out/'model'/'model.safetensors'))
h = hashlib.sha256(b''.join(w[k].numpy().tobytes() for k in sorted(w))).hexdigest()
from transformers import AutoModelForCausalLM, AutoTokenizer
tok, model = AutoTokenizer.from_pretrained(out/'model'), AutoModelForCausalLM.from_pretrained(out/'model')
from ei_nb.prompts import render_prompt
prompts = [render_prompt(p, None, 'completion') for p in sets['scored'][:8]]
torch.manual_seed(0)
enc = tok(prompts, return_tensors='pt', padding=True)
gen = model.generate(**enc, do_sample=True, max_new_tokens=24, num_return_sequences=8, temperature=1.0, top_p=0.95)
texts = tok.batch_decode(gen[:, enc['input_ids'].shape[1]:], skip_special_tokens=True)
print(json.dumps({'threads': threads, 'deterministic': deterministic, 'weights_sha256': h,
                  'final_loss': m['final_loss'], 'samples_sha256': hashlib.sha256('\n'.join(texts).encode()).hexdigest(),
                  'samples': texts[:4]}))
'''


AVX2 = {'ATEN_CPU_CAPABILITY': 'avx2', 'MKL_ENABLE_INSTRUCTIONS': 'AVX2', 'ONEDNN_MAX_CPU_ISA': 'AVX2'}
PINNED = {'ATEN_CPU_CAPABILITY': 'default', 'MKL_CBWR': 'COMPATIBLE', 'ONEDNN_MAX_CPU_ISA': 'SSE41'}
# name -> (threads, deterministic algorithms, extra environment)
SETTINGS = {'t1': (1, False, {}), 't1_again': (1, False, {}), 't2': (2, False, {}),
            'det_t1': (1, True, {}), 'det_t2': (2, True, {}),
            'avx2_t1': (1, False, AVX2), 'avx2_t2': (2, False, AVX2),   # this machine's kernels as an AVX2-only CPU
            'pinned_t1': (1, False, PINNED), 'pinned_t1_again': (1, False, PINNED)}   # portable kernels, MKL's CNR


def run(threads:int, deterministic:bool, epochs:int, extra:dict|None=None) -> dict:
    env = {**os.environ, 'OMP_NUM_THREADS': str(threads), 'MKL_NUM_THREADS': str(threads),
           'TOKENIZERS_PARALLELISM': 'false', **(extra or {})}
    p = subprocess.run([sys.executable, '-c', CHILD, str(threads), '1' if deterministic else '0', str(epochs)],
                       capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1])
    if p.returncode: raise SystemExit(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--epochs', type=int, default=3)
    ap.add_argument('--out', default='experiments/results/thread_determinism.json')
    a = ap.parse_args()
    import torch
    rows = {name: run(t, d, a.epochs, env) | {'env': env} for name, (t, d, env) in SETTINGS.items()}
    same = lambda i, j: rows[i]['weights_sha256'] == rows[j]['weights_sha256']
    flags = open('/proc/cpuinfo').read().split()
    result = {'torch': torch.__version__, 'cpu': os.uname().machine, 'cores': os.cpu_count(), 'epochs': a.epochs,
              'cpu_capability': torch.backends.cpu.get_cpu_capability(),
              'isa': sorted({f for f in flags if f in ('avx2', 'avx512f', 'avx512_vnni', 'amx_tile')}),
              'blas': torch.__config__.show().split('\n')[0:12], 'runs': rows,
              'repeat_same_threads_identical': same('t1', 't1_again'), 'threads_1_vs_2_identical': same('t1', 't2'),
              'deterministic_1_vs_2_identical': same('det_t1', 'det_t2'),
              'deterministic_equals_default_1': same('t1', 'det_t1'),
              'avx2_kernels_equal_default': same('t1', 'avx2_t1'), 'avx2_1_vs_2_threads_identical': same('avx2_t1', 'avx2_t2'),
              'pinned_repeatable': same('pinned_t1', 'pinned_t1_again'), 'pinned_equals_default': same('t1', 'pinned_t1')}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + '\n')
    for k, v in result.items():
        if isinstance(v, bool): print(f'{k}: {v}')
    print('final losses:', {k: round(r['final_loss'], 6) for k, r in rows.items()})


if __name__ == '__main__':
    main()

"""Benchmark of `train_lora` on CPU by `pack_tokens`: tokens per CPU second of the arith demo's warm start, each
packing against one row per forward pass (pack_tokens = 0) in the same run (the ratio behind `pack_tokens = 256`
in configs/demo_learn*.toml).

    OMP_NUM_THREADS=1 python bench/bench_pack.py [--hidden 64] [--layers 2] [--packs 0,128,256,512,1024]

Prints one JSON line per packing, then one JSON object (last line) with each packing's speed-up over pack 0.
"""
import argparse, json, os, tempfile, time
from pathlib import Path
os.environ.setdefault('OMP_NUM_THREADS', '1')
import torch
from ei_nb.arith import arith_sets, build_arith_model, warm_rows
from ei_nb.train import train_lora


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--hidden', type=int, default=64); p.add_argument('--layers', type=int, default=2)
    p.add_argument('--packs', default='0,128,256,512,1024'); p.add_argument('--batch-tokens', type=int, default=2048)
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = warm_rows(arith_sets(0, {}, {}, {'2+1': 300, '2+2': 300})['warm'])
    d = Path(tempfile.mkdtemp(prefix='bench_pack_'))
    model, speed = build_arith_model(d/'tiny', 0, a.hidden, a.layers), {}
    for pack in map(int, a.packs.split(',')):
        c0 = time.process_time()
        r = train_lora(model, rows, d/f'o{pack}', lr=1e-2, epochs=2, full_finetune=True, batch_tokens=a.batch_tokens,
                       pack_tokens=pack, schedule='constant', warmup_ratio=0.0, save_every=0, log_every=10**9)
        cpu = time.process_time() - c0
        speed[pack] = r['tokens'] * 2 / cpu
        print(json.dumps({'hidden': a.hidden, 'pack': pack, 'cpu_s': round(cpu, 1), 'train_s': round(r['train_s'], 1),
                          'tokens': r['tokens'], 'cpu_tok_s': round(speed[pack]), 'final_loss': round(r['final_loss'], 3)}), flush=True)
    base = speed.get(0)
    print(json.dumps({'speedup_over_pack0': {k: round(v / base, 2) for k, v in speed.items()} if base else None}))


if __name__ == '__main__':
    main()

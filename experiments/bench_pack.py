# train_lora CPU throughput by pack_tokens. usage: python experiments/bench_pack.py HIDDEN LAYERS 0,128,256,512,1024
import os, sys, time, json, resource, shutil
os.environ['OMP_NUM_THREADS']='1'
import torch; torch.set_num_threads(1)
from pathlib import Path
from ei_nb.arith import arith_sets, build_arith_model, warm_rows
from ei_nb.sft import train_lora
sets=arith_sets(0,{},{},{'2+1':300,'2+2':300})
rows=warm_rows(sets['warm'])
d=Path('/tmp/bench_pack'); shutil.rmtree(d,ignore_errors=True); d.mkdir()
m=build_arith_model(d/'tiny', 0, int(sys.argv[1]), int(sys.argv[2]))
for pack in map(int, sys.argv[3].split(',')):
    for bt in (2048,):
        c0=time.process_time()
        r=train_lora(m, rows, d/f'o{pack}_{bt}', lr=1e-2, epochs=2, full_finetune=True, batch_tokens=bt, pack_tokens=pack, schedule='constant', warmup_ratio=0.0, save_every=0, log_every=10**9)
        c=time.process_time()-c0
        print(json.dumps({'H':sys.argv[1],'pack':pack,'bt':bt,'cpu':round(c,1),'train_s':round(r['train_s'],1),'tokens':r['tokens'],'cpu_tok_s':round(r['tokens']*2/c),'final_loss':round(r['final_loss'],3)}),flush=True)

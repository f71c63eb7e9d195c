# usage: python experiments/feas3.py HIDDEN LAYERS LR CPU_SECONDS WARM_JSON EVAL_GRADES_JSON
# fixed warm set (records from ei_nb.arith), full FT, then per-grade pass rates on held-out problems
import os, sys, time, random, json
os.environ['OMP_NUM_THREADS']='1'
import torch; torch.set_num_threads(1)
from transformers import AutoModelForCausalLM
from ei_nb.arith import arith_sets, arith_tokenizer, arith_proof, parse_statement, grade_of
from ei_nb.tiny import tiny_config
from ei_nb.prompts import render_prompt
H,L,lr,budget=int(sys.argv[1]),int(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4])
warm=json.loads(sys.argv[5]); evalg=json.loads(sys.argv[6])
tok=arith_tokenizer(512)
sets=arith_sets(0, scored={g:48 for g in evalg}, pool={}, warm=warm)
cfg=tiny_config(len(tok), True, hidden_size=H, num_hidden_layers=L, intermediate_size=2*H, max_position_embeddings=512, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
torch.manual_seed(0); model=AutoModelForCausalLM.from_config(cfg)
rows=[(tok(render_prompt(p,None,'completion'),add_special_tokens=False)['input_ids'], tok(arith_proof(p),add_special_tokens=False)['input_ids']+[tok.eos_token_id]) for p in sets['warm']]
rng=random.Random(0)
def batch(n):
    sel=[rows[rng.randrange(len(rows))] for _ in range(n)]
    m=max(len(p)+len(c) for p,c in sel)
    X=torch.full((n,m),tok.pad_token_id); M=torch.zeros((n,m),dtype=torch.bool); A=torch.zeros((n,m),dtype=torch.long)
    for i,(p,c) in enumerate(sel):
        x=p+c; X[i,:len(x)]=torch.tensor(x); M[i,len(p):len(x)]=True; A[i,:len(x)]=1
    return X,M,A
opt=torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
def evaluate(probs, n=8, greedy=False):
    model.eval()
    e=tok([render_prompt(p,None,'completion') for p in probs],return_tensors='pt',padding=True,add_special_tokens=False)
    torch.manual_seed(1)
    with torch.inference_mode():
        out=model.generate(**e, **(dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=0, num_return_sequences=n)), max_new_tokens=20, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    txt=tok.batch_decode(out[:,e['input_ids'].shape[1]:],skip_special_tokens=True)
    model.train()
    if greedy: n=1
    c=[sum(txt[i*n+k].strip()==arith_proof(p).strip() for k in range(n)) for i,p in enumerate(probs)]
    return round(sum(c)/(n*len(probs)),2), sum(x>0 for x in c)
c0=time.process_time(); s=0; nxt=budget/3
while True:
    X,M,A=batch(32)
    logits=model(input_ids=X,attention_mask=A).logits[:,:-1]
    loss=torch.nn.functional.cross_entropy(logits[M[:,1:]],X[:,1:][M[:,1:]])
    loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(),1.0); opt.step(); opt.zero_grad(); s+=1
    el=time.process_time()-c0
    if el>=nxt:
        byg={}
        for p in sets['scored']: byg.setdefault(grade_of([int(x) for x in p['name'].split('_')[1:]],'+'),[]).append(p)
        wr=evaluate(sets['warm'][::max(1,len(sets['warm'])//48)])
        print(f'step {s} cpu {el:.0f} loss {loss.item():.3f} warm {wr}', {g:evaluate(v) for g,v in byg.items()}, 'greedy', {g:evaluate(v,greedy=True)[0] for g,v in byg.items()}, flush=True)
        nxt+=budget/3
        if el>=budget: break

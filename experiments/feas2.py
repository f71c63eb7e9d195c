# Transfer probe (phase A, issue 29): train on some grades for a CPU budget, print T=1 accuracy per grade (ROPE=1e9 for NoPE-like).
# usage: python experiments/feas2.py HIDDEN LAYERS LR CPU_SECONDS 1+1,2+1,1+2
import os, sys, time, random
os.environ['OMP_NUM_THREADS']='1'
import torch; torch.set_num_threads(1)
exec(open(__import__('os').path.join(__import__('os').path.dirname(__file__), 'feas1.py')).read().split("H=int")[0].split("t0=time.time(); tok=tok_build()")[0])
tok=tok_build()
H,L,lr,budget=int(sys.argv[1]),int(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4])
grades=[tuple(map(int,g.split('+'))) for g in sys.argv[5].split(',')]
cfg=tiny_config(len(tok), True, hidden_size=H, num_hidden_layers=L, intermediate_size=2*H, num_attention_heads=4, num_key_value_heads=2, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None, max_position_embeddings=512)
cfg.rope_parameters={"rope_theta":float(os.environ.get("ROPE","10000")),"rope_type":"default"}
torch.manual_seed(0); model=AutoModelForCausalLM.from_config(cfg)
rng=random.Random(0)
cache={}
def enc(s):
    if s not in cache: cache[s]=tok(s,add_special_tokens=False)['input_ids']
    return cache[s]
def batch(n):
    ids=[];masks=[]
    for _ in range(n):
        da,db=rng.choice(grades); a,b=rnd(rng,da),rnd(rng,db)
        p=enc(prompt(a,b)); c=enc(comp(a+b))+[tok.eos_token_id]
        ids.append(p+c); masks.append([0]*len(p)+[1]*len(c))
    m=max(map(len,ids))
    X=torch.full((n,m),tok.pad_token_id); M=torch.zeros((n,m),dtype=torch.bool); A=torch.zeros((n,m),dtype=torch.long)
    for i,(x,mm) in enumerate(zip(ids,masks)): X[i,:len(x)]=torch.tensor(x); M[i,:len(x)]=torch.tensor(mm,dtype=torch.bool); A[i,:len(x)]=1
    return X,M,A
opt=torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
erng=random.Random(123)
def evaluate(d1,d2,n=48,T=1.0):
    model.eval()
    probs=[(rnd(erng,d1),rnd(erng,d2)) for _ in range(n)]
    e=tok([prompt(a,b) for a,b in probs],return_tensors='pt',padding=True,add_special_tokens=False)
    with torch.inference_mode():
        out=model.generate(**e, do_sample=True, temperature=T, top_p=0.95, top_k=0, max_new_tokens=20, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    txt=tok.batch_decode(out[:,e['input_ids'].shape[1]:],skip_special_tokens=True)
    model.train(); return sum(t.strip()==comp(a+b).strip() for t,(a,b) in zip(txt,probs))/n
c0=time.process_time(); s=0; nxt=budget/4
EV=[(1,1),(2,1),(2,2),(3,1),(3,2),(3,3)]
while True:
    X,M,A=batch(32)
    logits=model(input_ids=X,attention_mask=A).logits[:,:-1]
    loss=torch.nn.functional.cross_entropy(logits[M[:,1:]],X[:,1:][M[:,1:]])
    loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(),1.0); opt.step(); opt.zero_grad(); s+=1
    el=time.process_time()-c0
    if el>=nxt:
        print(f'H{H} L{L} lr{lr} step {s} cpu {el:.0f} loss {loss.item():.3f}', {f'{a}+{b}':round(evaluate(a,b),2) for a,b in EV}, flush=True)
        nxt+=budget/4
        if el>=budget: break

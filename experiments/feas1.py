# Feasibility probe (phase A, issue 29): raw training loop, uniform 1-2 digit addition; prints T=1 accuracy per grade.
# usage: python experiments/feas1.py HIDDEN LAYERS MAXDIGITS STEPS
# feasibility: can a tiny Qwen3 with digit tokens learn MSB-first addition quickly on 1 CPU thread?
import os, sys, time, random, resource, json, math
os.environ['OMP_NUM_THREADS']='1'
import torch; torch.set_num_threads(1)
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast, AutoModelForCausalLM
from ei_nb.tiny import lean_corpus, tiny_config, SPECIAL_TOKENS, CHAT_TEMPLATE
HEADER='import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n'
def tok_build(V=512):
    tok=Tokenizer(models.BPE()); tok.pre_tokenizer=pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder=decoders.ByteLevel()
    tr=trainers.BpeTrainer(vocab_size=V, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus=lean_corpus()+[prompt(12,34)+' exact ⟨46, by norm_num⟩']*50
    tok.train_from_iterator(corpus, tr)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token='<|im_end|>', pad_token='<|endoftext|>', bos_token=None, chat_template=CHAT_TEMPLATE, padding_side='left')
def prompt(a,b,op='+'):
    nm={'+':'add','*':'mul'}[op]
    return HEADER+f'theorem {nm}_{a}_{b} : ∃ n : ℕ, {a} {op} {b} = n := by\n'
def comp(v): return f'  exact ⟨{v}, by norm_num⟩'
def rnd(rng,d): return rng.randrange(10**(d-1) if d>1 else 0, 10**d)
t0=time.time(); tok=tok_build(); print('tok', time.time()-t0, len(tok))
print(tok.tokenize(prompt(4721,3856)+comp(8577))[-40:])
H=int(sys.argv[1]) if len(sys.argv)>1 else 128; L=int(sys.argv[2]) if len(sys.argv)>2 else 2
cfg=tiny_config(len(tok), True, hidden_size=H, num_hidden_layers=L, intermediate_size=2*H, num_attention_heads=4, num_key_value_heads=2, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None, max_position_embeddings=512)
torch.manual_seed(0); model=AutoModelForCausalLM.from_config(cfg); print('params', sum(p.numel() for p in model.parameters()))
rng=random.Random(0)
def batch(n, maxd):
    ids=[];masks=[]
    for _ in range(n):
        da,db=rng.randint(1,maxd),rng.randint(1,maxd); a,b=rnd(rng,da),rnd(rng,db)
        p=tok(prompt(a,b),add_special_tokens=False)['input_ids']; c=tok(comp(a+b),add_special_tokens=False)['input_ids']+[tok.eos_token_id]
        ids.append(p+c); masks.append([0]*len(p)+[1]*len(c))
    m=max(map(len,ids)); 
    X=torch.full((n,m),tok.pad_token_id); M=torch.zeros((n,m),dtype=torch.bool); A=torch.zeros((n,m),dtype=torch.long)
    for i,(x,mm) in enumerate(zip(ids,masks)): X[i,:len(x)]=torch.tensor(x); M[i,:len(x)]=torch.tensor(mm,dtype=torch.bool); A[i,:len(x)]=1
    return X,M,A
opt=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
def evaluate(d1,d2,n=64,T=1.0):
    model.eval(); tok.padding_side='left'
    probs=[(rnd(rng,d1),rnd(rng,d2)) for _ in range(n)]
    enc=tok([prompt(a,b) for a,b in probs],return_tensors='pt',padding=True,add_special_tokens=False)
    with torch.inference_mode():
        out=model.generate(**enc, do_sample=T>0, temperature=T if T>0 else None, top_p=0.95 if T>0 else None, top_k=0, max_new_tokens=20, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    txt=tok.batch_decode(out[:,enc['input_ids'].shape[1]:],skip_special_tokens=True)
    ok=sum(t.strip()==comp(a+b).strip() for t,(a,b) in zip(txt,probs)); model.train(); return ok/n, txt[:2]
maxd=int(sys.argv[3]) if len(sys.argv)>3 else 2
steps=int(sys.argv[4]) if len(sys.argv)>4 else 600
c0=time.process_time(); t0=time.time()
for s in range(steps):
    X,M,A=batch(32,maxd)
    logits=model(input_ids=X,attention_mask=A).logits[:,:-1]
    tgt=X[:,1:]; mm=M[:,1:]
    loss=torch.nn.functional.cross_entropy(logits[mm],tgt[mm])
    loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(),1.0); opt.step(); opt.zero_grad()
    if (s+1)%100==0:
        r={f'{d1}+{d2}':evaluate(d1,d2)[0] for d1,d2 in [(1,1),(2,2),(2,3),(3,3),(4,4)]}
        print(s+1, round(loss.item(),3), r, 'wall', round(time.time()-t0,1), 'cpu', round(time.process_time()-c0,1), flush=True)
print(evaluate(3,3)[1])

#!/usr/bin/env python
"""Expert iteration on the arith fragment, outside the driver: a prototype to find a recipe that learns on 2 CPU cores.

It uses the package's own pieces for every step: `ei_nb.arith` (sets, digit tokenizer, model, the checker behind the
real `Verifier`), `ei_nb.train.train_lora` (warm start: full fine-tune; rounds: LoRA, completion-only loss, merge and
export), `ei_nb.samplers.run_pipeline` with the transformers sampler (completion prompts, pipelined verification),
`ei_nb.select.select_problems` (the band), `ei_nb.sft.build_sft_rows` (keep rules), `ei_nb.average.average_checkpoints`
(ft_weight toward the base) and `ei_nb.report.mcnemar_table`.

    python experiments/ei_arith.py --out /tmp/ei_arith/plain                     # the recipe (RECIPE below)
    python experiments/ei_arith.py --out /tmp/ei_arith/m1 --mutant prompt_loss   # one failure mode
    python experiments/ei_arith.py --out DIR --set rounds=4 --set lr=2e-3        # any recipe number

Mutants (each a change the science regression test must catch): prompt_loss (the loss includes the prompt tokens),
keep_longest (the keep rule ranks the longest completion first), band_solved (the band selects solved problems,
0.9 < p <= 1), ftw0 (averaging with ft_weight 0). The base model is cached per recipe (same warm start for every
mutant, so their scores are paired with the plain run's).

Prints one JSON line per phase and writes OUT/result.json: S per round, McNemar b/c/p of the last round against the
base, CPU seconds (process and children, from `resource.getrusage`) and wall seconds of every phase, `uptime` before
and after.
"""
import argparse, hashlib, json, os, resource, shutil, subprocess, sys, time
from pathlib import Path

os.environ.setdefault('OMP_NUM_THREADS', '1'); os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')

RECIPE = dict(
    seed=1, hidden_size=64, num_hidden_layers=2, vocab_size=512,
    scored={'2+2': 128}, pool={'2+2': 600}, warm={'1+1': 100, '2+1': 300, '1+2': 300, '2+2': 300},
    warm_epochs=25, warm_lr=1e-2, warm_batch_tokens=2048, warm_forms=['exact'], warm_comments=[''], warm_each_form=False,
    rounds=3, n=8, max_new_tokens=24, eval_max_new_tokens=None, n_e=4, eval_seed=1234, chunk_problems=64,
    lo=0.0, hi=0.75, max_problems=600, max_per_problem=4, rank='shortest',
    lr=1e-2, epochs=6, lora_r=16, lora_alpha=32, batch_tokens=2048, pack_tokens=256,
    ft_weight=0.7, anchor='original')
MUTANTS = ('prompt_loss', 'keep_longest', 'band_solved', 'ftw0')


def usage() -> dict:
    "CPU seconds so far: this process and its children (user + system)."
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {'cpu_self': s.ru_utime + s.ru_stime, 'cpu_children': c.ru_utime + c.ru_stime, 'wall': time.time()}


class Phase:
    "Times a phase: wall seconds and CPU seconds (process + children)."
    log = []
    def __init__(self, name): self.name = name
    def __enter__(self): self.t0 = usage(); return self
    def __exit__(self, *exc):
        t1 = usage()
        rec = {'phase': self.name, 'wall_s': round(t1['wall'] - self.t0['wall'], 2),
               'cpu_s': round(t1['cpu_self'] - self.t0['cpu_self'] + t1['cpu_children'] - self.t0['cpu_children'], 2)}
        Phase.log.append(rec); print(json.dumps(rec), flush=True)


def uptime() -> str: return subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()


def apply_mutant(name:str|None):
    "Patch the package in this process the way the mutant edits the notebook."
    import ei_nb.sft as sft, ei_nb.rows as rows, ei_nb.train as train
    if name == 'prompt_loss':
        orig = rows.collate
        def collate(examples, idxs, device='cpu'):
            b = orig(examples, idxs, device); b['target_mask'][:] = True; return b
        rows.collate = collate
        if hasattr(train, 'collate'): train.collate = collate
    elif name == 'keep_longest':
        sft._RANK_KEYS['shortest'] = lambda sv: (-sv[0]['n_tokens'], sv[0]['sample_idx'])


def write_sets(R:dict, out:Path) -> dict:
    from ei_nb.arith import arith_sets
    from ei_nb.core import write_records
    sets = arith_sets(R['seed'], R['scored'], R['pool'], R['warm'])
    for k, v in sets.items(): write_records(out/f'{k}.jsonl', v, 'problem')
    return sets


def warm_start(R:dict, sets:dict, cache:Path) -> Path:
    "The base model: a random tiny Qwen3 with the digit tokenizer, fully fine-tuned on the warm-start set (cached)."
    from ei_nb.arith import build_arith_model, warm_rows
    from ei_nb.train import train_lora
    base = cache/'model'
    if (base/'config.json').exists(): return base
    shutil.rmtree(cache, ignore_errors=True); cache.mkdir(parents=True)
    tiny = build_arith_model(cache/'tiny', R['seed'], R['hidden_size'], R['num_hidden_layers'], R['vocab_size'])
    rows = ([r for f in R['warm_forms'] for r in warm_rows(sets['warm'], None, (f,), tuple(R['warm_comments']))] if R['warm_each_form']
            else warm_rows(sets['warm'], None, tuple(R['warm_forms']), tuple(R['warm_comments'])))
    m = train_lora(tiny, rows, cache/'warm', lr=R['warm_lr'], epochs=R['warm_epochs'], full_finetune=True,
                   batch_tokens=R['warm_batch_tokens'], pack_tokens=R['pack_tokens'], schedule='constant', warmup_ratio=0.0,
                   seed=R['seed'], save_every=0, log_every=10**9)
    (cache/'warm.json').write_text(json.dumps({k: v for k, v in m.items() if k != 'history'} | {'loss': m['history']['loss'][::10]}))
    os.replace(cache/'warm'/'merged', base)
    return base


def sample(model:Path, problems:list, out:Path, n:int, seed:int, R:dict, round_idx:int, cap:int|None=None) -> tuple[list, list]:
    "n samples per problem, verified by the arith checker through the real Verifier path."
    from ei_nb.arith import arith_verifier
    from ei_nb.core import read_samples, read_verdicts
    from ei_nb.samplers import SampleParams, TransformersSampler, run_pipeline
    smp = TransformersSampler(model)
    with arith_verifier() as ver:
        run_pipeline(problems, smp, out/'samples.jsonl', SampleParams(n, 1.0, 0.95, cap or R['max_new_tokens'], seed), round_idx,
                     ver, out/'verdicts.jsonl', 'completion', R['chunk_problems'], 0.9, progress=False)
    return read_samples(out/'samples.jsonl'), read_verdicts(out/'verdicts.jsonl')


def solved(verdicts:list) -> dict:
    out = {}
    for v in verdicts: out[v['name']] = out.get(v['name'], False) or v['verdict'] == 'pass'
    return out


def one_round(R:dict, r:int, model:Path, base:Path, sets:dict, out:Path, mutant) -> tuple[Path, dict]:
    "Measure the pool, select the band, keep, LoRA-train, merge, average toward the base."
    import pandas as pd
    from ei_nb.average import average_checkpoints
    from ei_nb.core import DataStop
    from ei_nb.select import select_problems
    from ei_nb.sft import build_sft_rows
    from ei_nb.train import train_lora
    rd = out/f'round_{r:02d}'; rd.mkdir(parents=True, exist_ok=True)
    with Phase(f'r{r} sample pool'):
        samples, verdicts = sample(model, sets['pool'], rd/'pool', R['n'], R['seed'] + r, R, r)
    lo, hi = (0.9, 1.0) if mutant == 'band_solved' else (R['lo'], R['hi'])
    sel, summary, _ = select_problems(sets['pool'], pd.DataFrame(verdicts), sets['scored'], lo, hi, max_problems=R['max_problems'],
                                      seed=R['seed'], table=False)
    names = {p['name'] for p in sel}
    rows, st = build_sft_rows(sel, [s for s in samples if s['name'] in names], [v for v in verdicts if v['name'] in names],
                              model, r, R['max_per_problem'], R['rank'], protected=sets['scored'], style='completion')
    rates = pd.DataFrame(verdicts).assign(p=lambda d: d.verdict.eq('pass')).groupby('name').p.mean()
    info = {'selected': len(sel), 'rows': len(rows), 'band': summary, 'pool_pass_rate': round(float(rates.mean()), 4),
            'pool_solved': int((rates > 0).sum()), 'pool_all': int((rates == 1).sum()),
            'sft_stats': {k: v for k, v in st.items() if k != 'candidates'}}
    if not rows: return model, info | {'trained': False}
    with Phase(f'r{r} train'):
        m = train_lora(model, rows, rd/'sft', lr=R['lr'], epochs=R['epochs'], lora_r=R['lora_r'], lora_alpha=R['lora_alpha'],
                       batch_tokens=R['batch_tokens'], pack_tokens=R['pack_tokens'], schedule='constant', warmup_ratio=0.0,
                       seed=R['seed'] + r, save_every=0, log_every=10**9)
    with Phase(f'r{r} average'):
        average_checkpoints(base if R['anchor'] == 'original' else model, rd/'sft'/'merged', rd/'model',
                            0.0 if mutant == 'ftw0' else R['ft_weight'], threads=2, log=lambda *a: None)
    return rd/'model', info | {'trained': True, 'first_loss': round(m['first_loss'], 4), 'final_loss': round(m['final_loss'], 4),
                               'steps': m['steps']}


def evaluate(R:dict, model:Path, sets:dict, out:Path, r:int) -> dict:
    with Phase(f'r{r} eval'):
        samples, verdicts = sample(model, sets['scored'], out/f'eval_{r:02d}', R['n_e'], R['eval_seed'], R, r, R['eval_max_new_tokens'])
    print(json.dumps({'round': r, 'eval_capped_frac': round(sum(s['capped'] for s in samples) / max(1, len(samples)), 4),
                      'eval_refine_frac': round(sum('refine' in s['completion'] for s in samples) / max(1, len(samples)), 4)}), flush=True)
    return solved(verdicts), sum(v['verdict'] == 'pass' for v in verdicts) / max(1, len(verdicts))


def by_grade(solved_by_name:dict) -> dict:
    "Solved problems per grade (from the problem names `add_A_B`)."
    from ei_nb.arith import grade_of
    out = {}
    for name, ok in solved_by_name.items():
        op, *nums = name.split('_'); g = grade_of([int(x) for x in nums], '+' if op == 'add' else '*')
        out.setdefault(g, [0, 0]); out[g][0] += ok; out[g][1] += 1
    return {g: f'{a}/{b}' for g, (a, b) in sorted(out.items())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', required=True); ap.add_argument('--mutant', choices=MUTANTS)
    ap.add_argument('--set', action='append', default=[], help='KEY=JSON, e.g. rounds=4 or pool=\'{"2+2": 300}\'')
    ap.add_argument('--cache', default='/tmp/ei_arith_cache', help='base models, keyed by the warm-start recipe')
    a = ap.parse_args(argv)
    R = dict(RECIPE)
    for kv in a.set:
        k, v = kv.split('=', 1)
        if k not in R: raise SystemExit(f'unknown recipe key {k!r}')
        R[k] = json.loads(v)
    import torch; torch.set_num_threads(1)
    from ei_nb.report import mcnemar_table
    import pandas as pd
    out = Path(a.out); shutil.rmtree(out, ignore_errors=True); out.mkdir(parents=True)
    print(json.dumps({'uptime_before': uptime(), 'recipe': R, 'mutant': a.mutant}), flush=True)
    t_all = usage()
    apply_mutant(a.mutant)
    sets = write_sets(R, out)
    keyed = {k: R[k] for k in ('seed', 'hidden_size', 'num_hidden_layers', 'vocab_size', 'warm', 'warm_epochs', 'warm_lr',
                               'warm_batch_tokens', 'pack_tokens', 'scored', 'pool')}
    keyed |= {k: R[k] for k in ('warm_forms', 'warm_comments', 'warm_each_form') if R[k] != RECIPE[k]}
    warm_key = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:12]
    with Phase('warm start'):
        base = warm_start(R, sets, Path(a.cache)/warm_key)
    scores, rounds, model = [], [], base
    s0, p0 = evaluate(R, base, sets, out, 0)
    scores.append(sum(s0.values())); print(json.dumps({'round': 0, 'S': scores[-1], 'pass@1': round(p0, 4), 'by_grade': by_grade(s0)}), flush=True)
    last = s0
    for r in range(1, R['rounds'] + 1):
        model, info = one_round(R, r, model, base, sets, out, a.mutant)
        last, p = evaluate(R, model, sets, out, r)
        scores.append(sum(last.values())); rounds.append(info | {'S': scores[-1], 'pass@1': round(p, 4), 'by_grade': by_grade(last)})
        print(json.dumps({'round': r, **rounds[-1]}), flush=True)
    mc = mcnemar_table(pd.Series(s0), pd.Series(last))
    t1 = usage()
    res = {'recipe': R, 'mutant': a.mutant, 'S': scores, 'rounds': rounds, 'mcnemar_last_vs_base': mc, 'phases': Phase.log,
           'total_wall_s': round(t1['wall'] - t_all['wall'], 1),
           'total_cpu_s': round(t1['cpu_self'] - t_all['cpu_self'] + t1['cpu_children'] - t_all['cpu_children'], 1),
           'uptime_after': uptime()}
    (out/'result.json').write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ('S', 'mcnemar_last_vs_base', 'total_wall_s', 'total_cpu_s', 'uptime_after')}), flush=True)


if __name__ == '__main__': main()

#!/usr/bin/env python3
"""Benchmark of Lean's tokenizer and command splitter (ei_nb.lean_tokens, ei_nb.lean_commands) against the
lexer the pre-check uses today (ei_nb.lean_lex.code_only), in the same run, on one core.

Inputs: DeepSeek-Prover-V2's 438 miniF2F solutions wrapped as Goedel-style completions of about --chars characters
(bench/bench_verify.py's `completion`: prose, a draft block, the final ```lean4 block). Two measurements:
1. per completion, as the pre-check sees it: extract the code (about 3,000 characters), then lex it;
2. the worst case: the whole 15,000-character completion lexed as if it were code.
For each: code_only, tokenize, tokenize + split_commands, and the ratio to code_only. CPU time of this process, best
of --reps runs (wall time on a shared machine counts other processes too).

Usage: OMP_NUM_THREADS=1 python bench/bench_lex.py [--chars 15000] [--reps 5]
"""
import argparse, json, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT/'bench'))
from bench_verify import completion
from ei_nb.core import shared_data
from ei_nb.lean_commands import split_commands
from ei_nb.lean_lex import code_only
from ei_nb.lean_tokens import tokenize
from ei_nb.policy import extract_code

def best_cpu(f, items, reps):
    "Best CPU seconds of `reps` runs of f over items."
    out = None
    for _ in range(reps):
        t0 = time.process_time()
        for x in items: f(x)
        dt = time.process_time() - t0
        out = dt if out is None else min(out, dt)
    return out

def measure(label, texts, reps):
    fns = {'code_only': code_only, 'tokenize': tokenize, 'tokenize+split': lambda t: split_commands(t, tokenize(t))}
    base, rows = None, []
    for name, f in fns.items():
        f(texts[0])                                        # tables and regexes built once, outside the timing
        s = best_cpu(f, texts, reps)
        base = base or s
        rows.append({'bench': label, 'lexer': name, 'texts': len(texts), 'mean_chars': round(sum(map(len, texts)) / len(texts)),
                     'per_s': round(len(texts) / s), 'ms_each': round(1000 * s / len(texts), 3), 'x_code_only': round(s / base, 1)})
    return rows

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--chars', type=int, default=15000)
    ap.add_argument('--reps', type=int, default=5)
    a = ap.parse_args(argv)
    minif2f = {r['name']: r for r in map(json.loads, open(shared_data('minif2f_dsp15.jsonl'), encoding='utf-8'))}
    sols = [json.loads(l) for l in open(shared_data('deepseek_prover_v2_minif2f_solutions.jsonl'), encoding='utf-8')]
    completions = [completion(r, minif2f[r['name']], a.chars) for r in sols]
    codes = [extract_code(c) for c in completions]
    rows = measure('extracted code', codes, a.reps) + measure(f'whole {a.chars}-char completion', completions, max(1, a.reps // 2))
    for r in rows: print(json.dumps(r))
    print(f"\n{'bench':34} {'lexer':16} {'per s':>8} {'ms each':>8} {'x code_only':>11}")
    for r in rows: print(f"{r['bench']:34} {r['lexer']:16} {r['per_s']:>8} {r['ms_each']:>8} {r['x_code_only']:>11}")

if __name__ == '__main__':
    main()

"""Paraphrases of Lean theorem statements for the structural near-duplicate key (issue 30, point 8), and the
measurement: `python tests/paraphrase.py` prints how many generated paraphrases of the bundled miniF2F statements the
exact key and the structural key catch, and the false matches. Built from issue 30's prototype generator;
the key under test is `ei_nb.near_dup.structural_key`.

Kinds of paraphrase (each keeps the theorem the same):
- rename: every binder name (variables and hypotheses) consistently replaced by a fresh name;
- reorder: hypothesis groups permuted; variable groups of simple types split and permuted;
- commute: the statement re-printed fully parenthesised, `+ * ∧ ∨ = ≠ ↔` operands swapped and `≤ <` flipped to
  `≥ >` at random.
Controls (each changes the theorem): `perturb` changes one numeral; distinct statements of the benchmark."""
import random, re, sys
from collections import Counter
from pathlib import Path
from ei_nb.core import lean_code_only, normalize_ws, read_problems, shared_data, statement_key
from ei_nb.near_dup import AC, BIN, OPEN, SYM, head, parse, structural_key, tokens

INV = {'≤': '≥', '<': '>', '≥': '≤', '>': '<'}
RELS = {'=', '≠', '<', '>', '≤', '≥', '∣', '∈', '∉', '∧', '∨', '¬', '→', '↔', '≡'}
PRED = {'Nat.Prime', 'Prime', 'Even', 'Odd', 'Squarefree', 'IsLeast', 'IsGreatest', 'Function.Injective', 'Function.Surjective',
        'Function.Bijective', 'StrictMono', 'Monotone', 'Antitone', 'StrictAnti', 'Irrational', 'Nat.Coprime', 'IsSquare', 'Continuous'}
TYPEISH = re.compile(r"^(ℝ|ℕ|ℤ|ℚ|ℂ|NNReal|ENNReal|Prop|Type|Finset|Set|Fin|Polynomial|ZMod|Matrix|Multiset|List|EuclideanSpace)")


def is_prop(e) -> bool:
    "A binder type that is a proposition (a hypothesis), judged from its head."
    if e[0] == '→' and len(e) == 3: return is_prop(e[2])
    if e[0] in RELS: return True
    if e[0] == 'bind' and e[1] in ('∀', '∃', '∃!'): return True
    while e[0] == 'app': e = e[1]
    return e[0] == 'atom' and e[1] in PRED


def show(e, rng, commute:bool) -> str:
    "Print expression `e` fully parenthesised, swapping commutative operands and flipping orders at random when `commute`."
    k, sh = e[0], lambda x: show(x, rng, commute)
    if k == 'atom': return e[1]
    if k in BIN and len(e) == 3:
        op, a, b = e
        if commute and rng.random() < 0.5:
            if op in AC or op in SYM: a, b = b, a
            elif op in INV: op, a, b = INV[op], b, a
        return f'({sh(a)} {op} {sh(b)})'
    if k in ('¬', '-', '↑', '√'): return f'({k}{sh(e[1])})'
    if k in ('!', '⁻¹'): return f'({sh(e[1])}){k}'
    if k == 'proj': return f'({sh(e[1])}){e[2]}'
    if k == 'app': return f'({sh(e[1])} {sh(e[2])})'
    if k == 'ascr': return f'({sh(e[1])} : {sh(e[2])})'
    if k == 'ite': return f'(if {sh(e[1])} then {sh(e[2])} else {sh(e[3])})'
    if k == 'setb': return f'{sh(e[1])} | {sh(e[2])}'
    if k.startswith('group'): return k[5:] + ', '.join(sh(x) for x in e[1:]) + OPEN[k[5:]]
    if k == 'bind':
        _, q, bs, dom, body = e
        bb = ' '.join((f'{n} {t[1]} {sh(t[2])}' if t[0] == 'pred' else f'({n} : {sh(t)})') if t is not None else n for n, t in bs)
        return f"({q} {bb}{f' in {sh(dom)}' if dom is not None else ''}{' =>' if q in ('fun', 'λ') else ','} {sh(body)})"
    raise ValueError(k)


def paraphrase(stmt:str, rng, rename=True, reorder=True, commute=True) -> str:
    "A paraphrase of `stmt`: renamed binders, reordered hypotheses and variables, commuted operators, as asked."
    groups, concl = head(stmt)
    vgroups, hgroups, igroups = [], [], []
    for br, g in groups:
        c = g.index(':'); ns, ty = g[:c], parse(g[c + 1:])
        (igroups if br == '[' else hgroups if is_prop(ty) else vgroups).append((br, ns, ty))
    ren = {n: f'v{k}_{rng.randrange(1000)}' for k, n in enumerate(n for _, ns, _ in vgroups + hgroups for n in ns)} if rename else {}
    simple = lambda g: g[0] == '(' and TYPEISH.match(show(g[2], rng, False)) and not show(g[2], rng, False).startswith('Fin')
    vs = [(br, [n], ty) for br, ns, ty in vgroups for n in ns] if reorder else vgroups
    if reorder and all(simple(g) for g in vs): rng.shuffle(vs)
    hs = list(hgroups)
    if reorder: rng.shuffle(hs)
    parts = [f"{br}{' '.join(ns)} : {show(ty, rng, commute)}{OPEN[br]}" for br, ns, ty in vs + igroups + hs]
    text = f"theorem para_{rng.randrange(10**6)} {' '.join(parts)} : {show(parse(concl), rng, commute)} := by"
    return ' '.join(ren.get(t, t) for t in tokens(text)) if rename else text


def rename_only(stmt:str, rng) -> str:
    "Every binder name of the original text consistently renamed (layout otherwise kept, as tokens)."
    groups, _ = head(stmt)
    ren = {}
    for _, g in groups:
        if ':' in g: ren |= {n: f'w{len(ren) + k}_{rng.randrange(1000)}' for k, n in enumerate(g[:g.index(':')])}
    return ' '.join(ren.get(t, t) for t in tokens(normalize_ws(lean_code_only(stmt))))


NUM = re.compile(r'(?<![\w.₀-₉])(\d+)(?![\w.])')

def perturb(stmt:str, rng) -> str|None:
    "A statement that differs in meaning: one numeral after the name changed."
    text = normalize_ws(lean_code_only(stmt))
    ms = [m for m in NUM.finditer(text) if m.start() > text.find(' ', 8)]
    if not ms: return None
    m = rng.choice(ms)
    return text[:m.start()] + str(int(m.group(1)) + 1) + text[m.end():]


MODES = {'rename': dict(rename=True, reorder=False, commute=False), 'reorder': dict(rename=False, reorder=True, commute=False),
         'commute': dict(rename=False, reorder=False, commute=True), 'all three': dict(rename=True, reorder=True, commute=True)}


def measure(statements:list[str], reps:int=3, seed:int=0) -> dict:
    "Per kind of paraphrase: generated, caught by the exact key, caught by the structural key; and the false matches."
    rng, keyed = random.Random(seed), [(s, k) for s in statements if (k := structural_key(s)) is not None]
    out = {'statements': len(statements), 'parsed': len(keyed)}
    n = ex = st = 0
    for s, k in keyed:
        p = rename_only(s, rng); n += 1; ex += statement_key(p) == statement_key(s); st += structural_key(p) == k
    out['rename, original layout'] = {'n': n, 'exact': ex, 'structural': st}
    for mode, kw in MODES.items():
        n = ex = st = failed = 0
        for _ in range(reps):
            for s, k in keyed:
                try: p = paraphrase(s, rng, **kw)
                except ValueError: failed += 1; continue   # a binder group the generator cannot re-print (no type)
                n += 1; ex += statement_key(p) == statement_key(s); st += structural_key(p) == k
        out[mode] = {'n': n, 'exact': ex, 'structural': st, 'not_generated': failed}
    perturbed = [(p, k) for _ in range(reps) for s, k in keyed if (p := perturb(s, rng)) is not None]
    out['perturbed'] = {'n': len(perturbed), 'false_matches': sum(structural_key(p) == k for p, k in perturbed)}
    counts = Counter(k for _, k in keyed)
    out['collisions'] = sum(v - 1 for v in counts.values() if v > 1)
    return out


if __name__ == '__main__':
    import json, time
    stmts = [p['formal_statement'] for p in read_problems(shared_data('minif2f_dsp15.jsonl'))]
    t0 = time.time()
    res = measure(stmts)
    print(json.dumps(res, indent=1, ensure_ascii=False)); print(f'{time.time() - t0:.1f} s', file=sys.stderr)

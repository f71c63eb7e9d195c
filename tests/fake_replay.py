#!/usr/bin/env python3
"""A FAKE `ei-replay` (the kernel replay tool of `ei_nb/lean/EiReplay.lean`) for tests of the verifier's replay layer.
It runs no Lean and checks no proof: it replays a *pickle stand-in* (JSON written by `tests/fake_repl.py` when it is
asked `{"pickleTo": PATH, "env": N}`, or `--lean -o PATH`) with the algorithm of Lean's `Environment.replay`, as
lean4checker uses it (leanprover/lean4checker tag v4.9.0 = b3178065f785a6637f112d7857c4b64b1de83cc7, `Main.lean`
`replayFromImports`; the replay itself is core's `src/Lean/Replay.lean`, read at leanprover/lean4 0477624):

- every added constant that is not `unsafe`/`partial` is *remaining*; each is replayed after the added constants it
  uses (`replayConstant`: `isTodo`, recursion over `getUsedConstants`, then `addDecl`);
- constructors are not sent to the kernel: they are postponed and must equal those the replayed inductive types
  generate (`checkPostponedConstructors`: "No such constructor X");
- `addDecl` is the "kernel": a constant whose name exists, that uses a constant the environment lacks, whose value
  has another type than the one declared, or that needs compiled code (`Lean.reduceBool`), is rejected with the
  messages lean4checker's tests expect (`test.sh`: "(kernel) declaration type mismatch, 'false' has type ...",
  "(kernel) unknown constant ...", "(kernel) unknown declaration 'foo'").

A stand-in constant is `{"name", "kind": thm|defn|axiom|induct|ctor, "type", "value_type", "uses": [names],
"assumes": {base name: the type the proof relied on}, "unsafe", "reduce_bool"}`; the value's type "in the kernel" is
`value_type`, unless an `assumes` entry differs from the base environment's type of that constant (the proof type
checked only against a forged `constants.map₁`: SafeVerify's replaceAxiom test), then it is that forged type.

Protocol and replies: those of `EiReplay.lean` (requests separated by a blank line; `{"ok": true, "replayed", "axioms",
"type", "statement", "reference_type"}`, `{"ok": false, "reason"}`, `{"error"}`). Issue 36: the request's `reference`
(the header's commands but its imports, then the problem's statement closed by `sorry`) is "elaborated" here with the
fake REPL's own type model (`fake_repl.fake_type`: the statement's text, normalised), and `statement` says whether
it equals the replayed theorem's type (`same`/`differs`; `unchecked` without a reference, `no_reference` when the
reference declares no such theorem). Before the replay, the kernel-bug guards of `EiReplay.lean` run on each added
constant: a kind other than thm/defn (`induct`, `ctor`, `axiom`, `opaque`, ...), a stand-in's `"fvar": true`, a
`"proj": STRUCT` not in the base's structures, or a `"nat_pow": [base, exponent]` whose base is a constant (a str)
with a numeral exponent, or an exponent >= 2^24, is refused with the reason `kernel-bug guard: ...`.
The base environment is "imported" once per process and import list.
A stand-in's `fake_tool` field makes this process misbehave on that request: crash, garbage, hang, error.
Options: --log FILE (appends `start PID`, `import PID`, `replay PID` lines), --import-delay S.
"""
import itertools, json, os, sys, time
from fake_repl import fake_type           # the fake REPL's type model: the reference is "elaborated" with it

# the part of the header's environment the stand-ins refer to (types as text)
BASE = {
    'propext': {'kind': 'axiom', 'type': '∀ {a b : Prop}, (a ↔ b) → a = b'},
    'Classical.choice': {'kind': 'axiom', 'type': '{α : Sort u} → Nonempty α → α'},
    'Quot.sound': {'kind': 'axiom', 'type': '∀ {α : Sort u} {r : α → α → Prop} {a b : α}, r a b → Quot.mk r a = Quot.mk r b'},
    'sorryAx': {'kind': 'axiom', 'type': '(α : Sort u) → optParam Bool false → α'},
    'Lean.ofReduceBool': {'kind': 'axiom', 'type': '∀ (a b : Bool), Lean.reduceBool a = b → a = b'},
    'False': {'kind': 'induct', 'type': 'Prop', 'ctors': []},
    'True': {'kind': 'induct', 'type': 'Prop', 'ctors': ['True.intro']},
    'True.intro': {'kind': 'ctor', 'type': 'True', 'induct': 'True'},
}

STRUCTURES = {'Prod': 2, 'And': 2, 'Subtype': 2}    # structure-like inductive types of the base, with their fields

def guard(c:dict) -> str|None:
    "EiReplay.lean's `guard` on one stand-in constant: None when it passes."
    n = c['name']
    if c['kind'] not in ('thm', 'defn'):
        return f'{n} declares an inductive type, constructor, recursor, opaque, quotient or axiom'
    if c.get('fvar'): return f'{n} holds a free, meta or loose bound variable (lean4#14484)'
    if 'proj' in c and c['proj'] not in STRUCTURES:
        return f"{n}: a projection of {c['proj']}, not a field of a structure of the header (lean4#14576)"
    if 'nat_pow' in c:
        b, e = c['nat_pow']
        if (not isinstance(b, int) and isinstance(e, int)) or (isinstance(e, int) and e >= 2 ** 24):
            return f'{n}: Nat.pow on a constant base, or a huge exponent (lean4#8060, #15022)'
    return None

class Rejected(Exception):
    "The kernel (or the replay's structural check) rejected a constant."

def _log(path, what):
    if path:
        with open(path, 'a') as f: f.write(f'{what} {os.getpid()}\n')

def _add_decl(env:dict, c:dict):
    "The stand-in kernel's `addDecl`."
    name = c['name']
    if name in env: raise Rejected(f"(kernel) already declared '{name}'")
    for u in c.get('uses', []):
        if u not in env: raise Rejected(f"(kernel) unknown constant '{u}'")
    if c.get('reduce_bool'): raise Rejected(f"(kernel) unknown declaration '{c['reduce_bool']}'")
    vt = c.get('value_type', c.get('type'))
    for base, typ in c.get('assumes', {}).items():
        if env.get(base, {}).get('type') != typ: vt = f'{vt} (type checked against a forged {base} : {typ})'
    if c['kind'] in ('thm', 'defn') and vt != c.get('type'):
        raise Rejected(f"(kernel) declaration type mismatch, '{name}' has type\n  {vt}\nbut it is expected to have type\n  {c.get('type')}")
    env[name] = c

def replay(constants:list, base:dict) -> dict:
    "The environment after replaying `constants` into `base` (Lean.Replay's order and checks); `Rejected` on failure."
    new = {c['name']: c for c in constants}
    remaining = {n for n, c in new.items() if not c.get('unsafe') and not c.get('partial')}
    pending, env, ctors = set(), dict(base), set()

    def replay_constant(n):
        if n not in remaining: return
        remaining.discard(n); pending.add(n)
        c = new[n]
        for u in c.get('uses', []):
            if u in new: replay_constant(u)
        if n in pending:
            if c['kind'] == 'ctor': ctors.add(n)
            elif c['kind'] == 'induct':
                _add_decl(env, c)
                for k in c.get('ctors', []): env[k] = {'kind': 'ctor', 'induct': n, 'type': new.get(k, {}).get('type')}
            else: _add_decl(env, c)
        pending.discard(n)

    for n in sorted(remaining): replay_constant(n)
    for k in sorted(ctors):
        have = env.get(k)
        if have is None or have.get('kind') != 'ctor': raise Rejected(f'No such constructor {k}')
        if (have.get('induct'), have.get('type')) != (new[k].get('induct'), new[k].get('type')): raise Rejected(f'Invalid constructor {k}')
    return env

def axioms_of(env:dict, root:str) -> list:
    "The axioms `root` depends on (what `#print axioms` collects), in `env`."
    out, seen, todo = [], set(), [root]
    while todo:
        n = todo.pop()
        if n in seen: continue
        seen.add(n)
        c = env.get(n)
        if c is None: continue
        if c['kind'] == 'axiom': out.append(n)
        todo += c.get('uses', []) + c.get('ctors', [])
    return sorted(out)

def misbehave(what, out):
    if what == 'crash': sys.stderr.write('fake ei-replay: crashing on request\n'); sys.stderr.flush(); os._exit(3)
    if what == 'garbage': out.write('this is not JSON {{{\n\n'); out.flush(); return True
    if what == 'hang':
        while True: time.sleep(3600)
    return False

def answer(req:dict, bases:dict, log, delay:float) -> dict:
    "The reply to one request."
    path = req.get('pickle') or req.get('olean')
    if not path or not isinstance(req.get('name'), str) or not isinstance(req.get('imports'), list):
        return {'error': 'the request names neither a pickle nor an olean, or lacks name/imports'}
    try: data = json.loads(open(path, encoding='utf-8').read())
    except (OSError, ValueError) as e: return {'error': f'cannot read {path}: {e}'}
    if data.get('fake_tool') == 'error': return {'error': 'importModules: unknown package Evil (fake)'}
    if data['imports'] != req['imports']: return {'ok': False, 'reason': f"the proof's environment imports {data['imports']}, the header {req['imports']}"}
    added = {c['name']: c for c in data['constants']}
    if req['name'] not in added: return {'ok': False, 'reason': f"{req['name']} is not among the declarations the proof added"}
    if added[req['name']]['kind'] != 'thm': return {'ok': False, 'reason': f"{req['name']} is not a theorem among the declarations the proof added"}
    key = tuple(data['imports'])
    if key not in bases:
        time.sleep(delay); _log(log, 'import'); bases[key] = dict(BASE)
    if why := next((w for c in data['constants'] if (w := guard(c))), None):
        return {'ok': False, 'reason': f'kernel-bug guard: {why}'}
    _log(log, 'replay')
    try: env = replay(data['constants'], bases[key])
    except Rejected as e: return {'ok': False, 'reason': str(e)}
    typ, ref = env[req['name']]['type'], req.get('reference')
    want = fake_type(ref, req['name']) if isinstance(ref, str) else None
    statement = 'unchecked' if ref is None else 'no_reference' if want is None else 'same' if want == typ else 'differs'
    return {'ok': True, 'replayed': len(data['constants']), 'axioms': axioms_of(env, req['name']), 'type': typ,
            'statement': statement, 'reference_type': want or ''}

def main(argv):
    log = argv[argv.index('--log') + 1] if '--log' in argv else None
    delay = float(argv[argv.index('--import-delay') + 1]) if '--import-delay' in argv else 0.0
    _log(log, 'start')
    bases, block = {}, []
    for line in itertools.chain(sys.stdin, ['\n']):
        if line.strip(): block.append(line); continue
        if not block: continue
        text, block = ''.join(block), []
        try: req = json.loads(text)
        except ValueError as e: reply = {'error': f'not JSON: {e}'}
        else:
            try: what = json.load(open(req.get('pickle') or req.get('olean') or '', encoding='utf-8')).get('fake_tool')
            except (OSError, ValueError, AttributeError): what = None
            if misbehave(what, sys.stdout): continue
            reply = answer(req, bases, log, delay)
        sys.stdout.write(json.dumps(reply, ensure_ascii=False) + '\n\n'); sys.stdout.flush()
    return 0

if __name__ == '__main__': sys.exit(main(sys.argv[1:]))

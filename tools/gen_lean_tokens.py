#!/usr/bin/env python3
"""Generate ei_nb/data/lean_tokens.json: the tokens (atoms) that the Lean environment of the problem header
(`import Mathlib`, `import Aesop`) declares, the tokens that begin a command, and the tokens after which a string
is an interpolated string, extracted from the sources at the pinned commits.

Sources, each a git repository read with `git show COMMIT:PATH` (nothing is built or run):
  --mathlib      xinhjBrant/mathlib4 at 2f65ba7f1a9144b20c8e7358513548e317d26de1 (the fork the REPL image uses);
                 its lake-manifest.json pins the commits of the dependencies below, which are checked
  --batteries    leanprover-community/batteries      --aesop  leanprover-community/aesop
  --qq           leanprover-community/quote4           --proofwidgets  leanprover-community/ProofWidgets4
  --importgraph  leanprover-community/import-graph
  --lean-src     optional: the `src/lean` folder of the Lean toolchain leanprover/lean4:v4.9.0-rc1
                 (elan installs it at ~/.elan/toolchains/leanprover--lean4---v4.9.0-rc1/src/lean); without it the
                 Lean core part (Init, Lean, Lake) comes from tools/lean_core_tokens.txt, a hand list, and the
                 JSON says so.

Only modules in the import closure of the header's imports are read (Mathlib.lean imports every Mathlib module, and
Mathlib.Util.GetAllModules imports Lake.CLI.Main, so Lake's DSL is in the environment too). `local` declarations are
left out (they do not survive the import); `scoped` ones are listed under their namespace.

Usage: python tools/gen_lean_tokens.py --mathlib DIR --batteries DIR --aesop DIR --qq DIR --proofwidgets DIR \
           --importgraph DIR [--lean-src DIR] [--out ei_nb/data/lean_tokens.json]
"""
import argparse, collections, json, re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ei_nb.lean_lex import spans            # Lean's comment/string rules (src/Lean/Parser/Basic.lean)

MATHLIB = ('xinhjBrant/mathlib4', '2f65ba7f1a9144b20c8e7358513548e317d26de1')
DEPS = {'batteries': ('leanprover-community/batteries', 'Batteries'), 'aesop': ('leanprover-community/aesop', 'Aesop'),
        'Qq': ('leanprover-community/quote4', 'Qq'), 'proofwidgets': ('leanprover-community/ProofWidgets4', 'ProofWidgets'),
        'importGraph': ('leanprover-community/import-graph', 'ImportGraph')}
ROOTS = ['Mathlib', 'Aesop']                 # the problem header: import Mathlib, import Aesop
CORE_ROOTS = ('Init', 'Lean', 'Lake', 'Std')  # modules of the toolchain itself

# `"tok " (interpolatedStr…`, `msg:(interpolatedStr…`
_INTERP = re.compile(r'\s*(?:[A-Za-z_][\w]*:)?\(?\s*interpolatedStr')

def _opener(lits:list, k:int) -> str:
    "The token opening the interpolated string after literal k: `aesop_trace![` for `\"aesop_trace![\" opt \"] \" …`."
    t = lits[k][1].strip()
    return lits[k - 1][1].strip() if t == ']' and k and lits[k - 1][1].strip().endswith('[') else t

HEADS = ('syntax', 'macro', 'elab', 'notation', 'notation3', 'infix', 'infixl', 'infixr', 'prefix', 'postfix',
         'binder_predicate', 'declare_syntax_cat')
_MODS = r"(?:@\[[^\]]*\]\s*|(?:private|protected|noncomputable|unsafe|partial|nonrec)\s+|local\s+|scoped(?:\[[^\]]*\])?\s+)*"
_HEAD = re.compile(rf"^[ \t]*({_MODS})({'|'.join(HEADS)})\b", re.M)
_NS = re.compile(r"^[ \t]*(?:noncomputable\s+)?(namespace|end|section|mutual)\b[ \t]*([^\s]*)", re.M)
_IMPORT = re.compile(r"^import\s+(\S+)", re.M)
_PARSER_DEF = re.compile(r"\b(?:leading_parser|trailing_parser)\b")
_CAT = re.compile(r":\s*([A-Za-z_][\w.]*)\s*$")
_STR = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


_BATCH = {}

def git_show(repo, commit, path):
    "The text of PATH at COMMIT (one `git cat-file --batch` process per repository), or None."
    if repo not in _BATCH:
        _BATCH[repo] = subprocess.Popen(['git', '-C', str(repo), 'cat-file', '--batch'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    p = _BATCH[repo]
    p.stdin.write(f'{commit}:{path}\n'.encode()); p.stdin.flush()
    head = p.stdout.readline().split()
    if len(head) < 3 or head[1] != b'blob': return None
    data = p.stdout.read(int(head[2])); p.stdout.read(1)
    return data.decode('utf-8')


_ESC = re.compile(r'\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)', re.S)

def unquote(lit):
    "The value of a Lean string literal (quotedCharCoreFn's escapes)."
    simple = {'n': '\n', 't': '\t', 'r': '\r', '\\': '\\', '"': '"', "'": "'"}
    return _ESC.sub(lambda m: chr(int(m.group(1)[1:], 16)) if len(m.group(1)) > 1 else simple.get(m.group(1), m.group(1)), lit[1:-1])


def masked(text):
    "`text` with comments (doc comments too) blanked to spaces, line breaks kept; string literals as they are."
    out = list(text)
    for kind, a, b in spans(text):
        if kind == 'comment':
            for i in range(a, b):
                if out[i] != '\n': out[i] = ' '
    return ''.join(out)


def strings_in(code, a, b):
    "(start, literal text) of the string literals in code[a:b], with whether `&` stands right before (non-reserved)."
    out = []
    for m in _STR.finditer(code, a, b):
        before = code[a:m.start()].rstrip()
        out.append((m.start(), unquote(m.group()), before.endswith('&'), m.end()))
    return out


def top_level(code, a, b, needle):
    "Offsets of `needle` in code[a:b] outside parentheses/brackets and strings."
    depth, i, hits = 0, a, []
    while i < b:
        c = code[i]
        if c == '"':
            m = _STR.match(code, i)
            i = m.end() if m else i + 1; continue
        if c in '([{': depth += 1
        elif c in ')]}': depth -= 1
        elif depth == 0 and code.startswith(needle, i): hits.append(i)
        i += 1
    return hits


def chunks(code, raw):
    "(start, end) of each top-level declaration: a new one starts at every line whose raw text starts in column 0."
    starts = [m.start() for m in re.finditer(r'^\S', raw, re.M)] + [len(raw)]
    return list(zip(starts, starts[1:]))


def namespace_at(code):
    "For each offset, the current namespace (list of components), from namespace/section/end lines."
    events, stack = [], []
    for m in _NS.finditer(code):
        kind, name = m.group(1), m.group(2)
        if kind == 'namespace': stack.append(('ns', name.split('.')))
        elif kind in ('section', 'mutual'): stack.append((kind, []))
        elif stack: stack.pop()
        events.append((m.start(), [p for _, parts in stack for p in parts]))
    def at(pos):
        cur = []
        for p, ns in events:
            if p > pos: break
            cur = ns
        return '.'.join(cur)
    return at


def extract_file(text, path):
    "Declarations of tokens in one file: list of dicts (kind, tokens, category, first atom, scope)."
    code = masked(text)
    ns_at, out = namespace_at(code), []
    ranges = chunks(code, text)
    for m in _HEAD.finditer(code):
        # indented: inside a body or a quotation (a leading comment blanks to spaces, not col 0)
        if text[m.start()] in ' \t': continue
        mods, head = m.group(1) or '', m.group(2)
        end = next((b for a, b in ranges if a <= m.start(2) < b), len(code))   # modifiers may stand on the lines above
        if 'local' in mods.split(): continue                       # local: gone after the import
        scope = None
        if (s := re.search(r'scoped(?:\[([^\]]*)\])?', mods)): scope = s.group(1) or ns_at(m.start()) or '_root_'
        if head == 'declare_syntax_cat':
            name = code[m.end(2):end].split()[0] if code[m.end(2):end].split() else ''
            out.append(dict(kind=head, tokens=[f'`({name}|'], category=name, first=None, scope=scope, path=path)); continue
        body_end = end
        if head in ('macro', 'elab', 'notation', 'infix', 'infixl', 'infixr', 'prefix', 'postfix', 'binder_predicate'):
            arrows = top_level(code, m.end(2), end, '=>')
            body_end = arrows[0] if arrows else end
        elif head == 'notation3':
            arrows = top_level(code, m.end(2), end, '=>')
            body_end = arrows[-1] if arrows else end
        lits = strings_in(code, m.end(2), body_end)
        category = None
        if head in ('syntax', 'macro', 'elab'):
            tail = _STR.sub('""', code[m.end(2):body_end])
            c = _CAT.search(tail)
            category = c.group(1) if c else None
            if head == 'syntax' and re.match(r'\s*[A-Za-z_«][\w.«»]*\s*:=', tail): category = 'syntax-abbrev'
        else: category = 'term' if head != 'binder_predicate' else 'binderPred'
        # `syntax … foo:ident …`: a name before the pattern; the pattern's first atom is the first string
        reserved = [(p, t.strip(), amp) for p, t, amp, _ in lits if t.strip()]
        first = None
        if reserved:
            p0, t0, amp0 = reserved[0]
            lead = _STR.sub('', code[m.end(2):p0])
            lead = re.sub(r'\((?:name|priority|kind)\s*:=[^)]*\)', ' ', lead)
            lead = re.sub(r':\s*(?:max|arg|lead|min|\d+)', ' ', lead)
            pre = [w for w in re.findall(r"[A-Za-z_][\w.]*", lead) if w not in ('ppSpace', 'withPosition', 'group', 'atomic',
                                                                                  'ppIndent', 'ppGroup', 'ppDedent', 'ppRealGroup', 'tk', 'ppAllowUngrouped')]
            first = dict(token=t0, nonreserved=amp0, after=pre)
        interp = [_opener(lits, k) for k, (_, _, _, e) in enumerate(lits) if _INTERP.match(code[e:body_end])]
        out.append(dict(kind=head, tokens=[t for _, t, amp in reserved if not amp], nonreserved=[t for _, t, amp in reserved if amp],
                        category=category, first=first, scope=scope, path=path, interpolation=interp))
    for m in _PARSER_DEF.finditer(code):                       # Lean-defined parsers: `leading_parser "tok" >> …`
        end = next((b for a, b in ranges if a <= m.start() < b), len(code))
        toks = []
        for p, t, amp, e in strings_in(code, m.end(), end):
            before = code[m.end():p].rstrip()
            after = code[e:end].lstrip()
            if amp or re.search(r'(nonReservedSymbol|errorAtSavedPos|checkColGt|checkColGe|checkWsBefore|checkNoWsBefore|'
                                r'checkLinebreakBefore|notFollowedBy|s!|m!|throwError|mkAtom|Name\.mkSimple)\s*\(?\s*$', before): continue
            if re.search(r'(leading_parser(?::\w+)?|trailing_parser(?::\w+)?|>>|<\|>|symbol|unicodeSymbol|\(|"\s*)\s*$', before) \
                    or after.startswith(('>>', '<|>')):
                toks.append(t.strip())
        if toks:
            command = re.search(r'@\[[^\]]*command_parser', code[max(0, m.start() - 400):m.start()])
            out.append(dict(kind='parser', tokens=[t for t in toks if t], category='command' if command else None,
                            first=dict(token=toks[0], nonreserved=False, after=[]) if command else None, scope=None, path=path))
    return out


def header_imports(text):
    "The modules a file imports: its leading `import` lines (comments skipped)."
    out = []
    for line in masked(text).split('\n'):
        w = line.split()
        if not w or w[0] == 'prelude': continue
        if w[0] != 'import': break
        out += w[1:]
    return out


def module_path(mod):
    return mod.replace('.', '/') + '.lean'


def closure(sources):
    "Import closure from ROOTS: {module: (source name, path)}; core modules collected separately."
    seen, core, todo = {}, set(), list(ROOTS)
    while todo:
        mod = todo.pop()
        if mod in seen or mod in core: continue
        top = mod.split('.')[0]
        if top in CORE_ROOTS: core.add(mod); continue
        src = next((s for s in sources.values() if s['top'] == top), None)
        if src is None: raise SystemExit(f'{mod}: no source for package {top}')
        text = git_show(src['git'], src['commit'], module_path(mod))
        if text is None: raise SystemExit(f'{mod}: {module_path(mod)} not found at {src["repo"]}@{src["commit"]}')
        seen[mod] = (src['name'], text)
        todo += header_imports(text)
    return seen, core


def read_core_list(path):
    "tools/lean_core_tokens.txt: `[section]` headers, one token per line, `#:` comments."
    sec, out = None, collections.defaultdict(list)
    for line in path.read_text(encoding='utf-8').splitlines():
        if not line.strip() or line.startswith('#:'): continue
        if line.startswith('[') and line.endswith(']') and ' ' not in line: sec = line[1:-1]; continue
        out[sec].append(line.strip())
    return out


def core_from_src(lean_src):
    "Declarations of every .lean file under a toolchain's src/lean (Init, Lean, Lake, Std)."
    decls = []
    for top in CORE_ROOTS:
        for f in sorted(Path(lean_src).glob(f'{top}/**/*.lean')) + [Path(lean_src)/f'{top}.lean']:
            if f.is_file(): decls += extract_file(f.read_text(encoding='utf-8'), str(f.relative_to(lean_src)))
    return decls


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    for k in ('mathlib', 'batteries', 'aesop', 'qq', 'proofwidgets', 'importgraph'): ap.add_argument(f'--{k}', required=True)
    ap.add_argument('--lean-src')
    ap.add_argument('--out', default=str(ROOT/'ei_nb'/'data'/'lean_tokens.json'))
    a = ap.parse_args(argv)
    manifest = json.loads(git_show(a.mathlib, MATHLIB[1], 'lake-manifest.json'))
    pins = {p['name']: p['rev'] for p in manifest['packages']}
    toolchain = git_show(a.mathlib, MATHLIB[1], 'lean-toolchain').strip()
    dirs = {'batteries': a.batteries, 'aesop': a.aesop, 'Qq': a.qq, 'proofwidgets': a.proofwidgets, 'importGraph': a.importgraph}
    sources = {'mathlib': dict(name='mathlib', repo=MATHLIB[0], commit=MATHLIB[1], git=a.mathlib, top='Mathlib')}
    for name, (repo, top) in DEPS.items():
        sources[name] = dict(name=name, repo=repo, commit=pins[name], git=dirs[name], top=top)
    modules, core_modules = closure(sources)
    decls = []
    for mod, (src, text) in sorted(modules.items()):
        decls += [dict(d, source=src) for d in extract_file(text, module_path(mod))]
    if a.lean_src:
        core = [dict(d, source='lean4') for d in core_from_src(a.lean_src)]
        core_note = dict(status='generated', from_=f'{a.lean_src} ({toolchain})')
        decls += core
    else:
        hand = read_core_list(ROOT/'tools'/'lean_core_tokens.txt')
        core_note = dict(status='hand-listed', file='tools/lean_core_tokens.txt',
                         why='the leanprover/lean4 repository (6.6 GB) could not be fetched here; regenerate with --lean-src '
                             'on a machine with the v4.9.0-rc1 toolchain')
        decls += [dict(kind='core-list', tokens=hand['tokens'], category=None, first=None, scope=None, path='tools/lean_core_tokens.txt', source='lean4')]
        decls += [dict(kind='core-list', tokens=[t], category='command', first=dict(token=t, nonreserved=False, after=[]),
                       scope=None, path='tools/lean_core_tokens.txt', source='lean4') for t in hand['command_starts']]
        decls += [dict(kind='core-list', tokens=[t], category=None, first=None, scope=None, interpolation=[t],
                       path='tools/lean_core_tokens.txt', source='lean4') for t in hand['interpolation']]
    write(a.out, decls, sources, core_note, toolchain, len(modules), sorted(core_modules))


def write(out, decls, sources, core_note, toolchain, n_modules, core_modules):
    tokens, scoped, origin = set(), collections.defaultdict(set), {}
    starts, nonreserved_starts, unanchored, interp = set(), set(), [], set()
    for d in decls:
        target = scoped[d['scope']] if d['scope'] else tokens
        for t in d['tokens']:
            target.add(t); origin.setdefault(t, f"{d['source']}:{d['path']}")
        interp |= set(d.get('interpolation') or [])
        if d['category'] == 'command':
            f = d['first']
            if f is None: unanchored.append(f"{d['source']}:{d['path']}")
            elif f['nonreserved']: nonreserved_starts.add(f['token'])
            else: starts.add(f['token'])
            if f and set(f['after']) - {'declModifiers', 'docComment', 'attrKind', 'Term.attrKind', 'Parser.Term.attrKind',
                                         'Command.declModifiers', 'Lean.Parser.Command.declModifiers', 'mods', 'doc', 'attrs',
                                         'optional', 'many', 'Term.attributes', 'attributes', 'Lean.Parser.Command.docComment', 'ppIndent'}:
                unanchored.append(f"{d['source']}:{d['path']}: {f['token']!r} after {f['after']}")
    data = {
        'about': 'Tokens declared in the Lean environment of `import Mathlib` + `import Aesop` (generated by tools/gen_lean_tokens.py)',
        'toolchain': toolchain,
        'sources': [dict(repo=s['repo'], commit=s['commit']) for s in sources.values()],
        'lean_core': dict(core_note, modules_imported=len(core_modules)),
        'modules_read': n_modules,
        'counts': dict(tokens=len(tokens), scoped=sum(len(v) for v in scoped.values()), command_starts=len(starts),
                       nonreserved_command_starts=len(nonreserved_starts), interpolation=len(interp)),
        'tokens': sorted(tokens),
        'scoped_tokens': {k: sorted(v) for k, v in sorted(scoped.items())},
        'command_starts': sorted(starts),
        'nonreserved_command_starts': sorted(nonreserved_starts),
        'interpolation_tokens': sorted(interp),
        'command_syntax_to_review': sorted(set(unanchored)),
        'token_origin': dict(sorted(origin.items())),
    }
    Path(out).write_text(json.dumps(data, ensure_ascii=False, indent=0) + '\n', encoding='utf-8')
    print(json.dumps(data['counts']), file=sys.stderr)


if __name__ == '__main__':
    main()

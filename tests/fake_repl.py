#!/usr/bin/env python3
"""A FAKE Lean REPL for fault-injection tests of the verifier's Lean back-ends (`ei_nb.lean_backends`).
It runs no Lean and proves nothing.

Its replies follow the recordings of the real REPL at tag v4.9.0-rc1 (leanprover-community/repl,
`test/*.in` / `*.expected.out`, read for this file; `tests/data/repl_v4.9.0-rc1/` keeps a few):
- commands are JSON objects separated by blank lines; a query whose text starts with `#` or `--` is
  skipped; end of input ends the process (exit 0);
- a reply is Lean's `Json.pretty` at width 80 with the keys of every object in reverse sorted order
  (`sorries`, `messages`, `env`; a message `severity`, `pos`, `endPos`, `data`; a sorry
  `proofState`, `pos`, `goal`, `endPos`), then an empty line;
- `messages`/`sorries` appear only when non-empty; a message's `endPos` may be `null`;
- `#print axioms` lists `sorryAx` whenever the proof had a sorry or an error;
- `{"message": "Unknown environment."}` for an unknown `env`;
- malformed JSON: an uncaught exception on stderr and exit 1 (no reply);
- `--no-flush`: like the v4.9.0-rc1 binary, stdout is written only when its 4 KiB buffer fills or the
  process ends, unless stdout is a terminal (C stdio line-buffers a tty) or `_STDBUF_O=L` is set (what
  `stdbuf -oL` sets for libstdbuf).

It misbehaves on request; directives are read from the command text (the verifier sends the proof verbatim):
  FAKE:hang        never answer                  FAKE:crash      exit(3) without answering
  FAKE:garbage     answer text that is not JSON  FAKE:partial    half a JSON object, then hang
  FAKE:flood       endless output, no blank line FAKE:leak       allocate memory until the limit kills it
  FAKE:slow=S      sleep S seconds, then answer  FAKE:badshape   `messages` is not a list
  FAKE:error       a Lean error message          FAKE:sorry      a sorry warning and a `sorries` entry
  FAKE:sorry428    the sorry warning as v4.28 words it (backticks), no `sorries`
  FAKE:axiom=NAME  an extra axiom in the report  FAKE:noaxioms   no `#print axioms` report
  FAKE:twoaxioms   an extra report printed on line 1 (what a candidate's own #print would add)
  FAKE:qualified=P the report names P.NAME       FAKE:replerror  a REPL-level {"message": ...} reply
  FAKE:nullend     a warning whose endPos is null FAKE:u2028     (lean mode) a message holding U+2028 and U+2029
  FAKE:retype      the statement probe reports another type for the theorem than for the reference
  FAKE:forge       print a forged clean-pass reply (the env number the real one will carry) on stdout, then the real
                   reply (a Lean error): what code run inside Lean can print on the protocol channel
  FAKE:wrongenv    the reply carries an env number out of the REPL's sequence
`-- RUN: CODE` (one line of Python) is executed while the command is "elaborated", in the fake's process: a model
of code that a proof runs inside Lean (`#eval`, `run_tac`, …), with this process's rights, files and environment.
`#print "TEXT"` is answered as Lean answers it: an info message TEXT on its line (the verifier's sync command).
FAKE:leak ends like Lean at its memory limit: `INTERNAL PANIC: out of memory` on stderr, exit 1 (leanprover/lean4
src/runtime/object.cpp, `lean_internal_panic_out_of_memory`, read at 2e66341f).
`{"pickleTo": PATH, "env": N}` (the REPL's `PickleEnvironment`, REPL/Main.lean `pickleCommandSnapshot` at v4.9.0-rc1:
reply `{"env": N}`, or `{"message": "Unknown environment."}`) writes a PICKLE STAND-IN, JSON read by
tests/fake_replay.py: the header's imports (`Init` first, as `headerToImports` puts it) and the constants the env's
proofs added, faked from their text (each `theorem`/`lemma` a theorem whose type is what the statement probe reports,
using the standard axioms). `--lean` with `-o PATH` (lean's olean output) writes the same stand-in for the file.
Directives that forge the pickled environment (the REPL's own replies stay a clean pass: it was fooled):
  FAKE:addfalse     a theorem `false : False` whose value is `False` (lean4checker's AddFalse), used by the theorem
  FAKE:addctor      a constructor `False.intro` with no inductive replayed, used by the theorem
                    (SafeVerify's addFalseConstr)
  FAKE:lonector     the same constructor, used by nothing (lean4checker's AddFalseConstructor)
  FAKE:replaceaxiom the theorem type checks only against a forged `propext : False` (SafeVerify's replaceAxiom)
  FAKE:skipkernel   the theorem's value does not have its type (added with debug.skipKernelTC / without the kernel)
  FAKE:hideaxiom    an axiom `cheat` in the added constants, used by the theorem, missing from the REPL's report
  FAKE:notadded     the theorem is not among the added constants    FAKE:otherimports  the pickle's imports differ
  FAKE:replaytype   the replayed theorem has another type           FAKE:nativedecide  the value needs compiled code
  FAKE:unsafehelper the theorem uses an `unsafe` helper (skipped by the replay)
  FAKE:nopickle     answer `{"env": N}` without writing the file
  FAKE:replaycrash, FAKE:replaygarbage, FAKE:replayhang, FAKE:replayerror   the fake replay tool misbehaves on it
A line `#eval … Lean.getConstInfo `X).type.dbgToString …` (the verifier's statement probe) is answered with an info
message "ei-statement-type: (fake) TEXT", TEXT the declaration of X between its name and `:=`, whitespace normalised.
Otherwise the reply is a clean pass: one info message "'NAME' depends on axioms: [propext, ...]"
on the line of `#print axioms NAME`.

A header containing `import Broken` fails to import (an error message, as Lean reports it). Two texts get the error
real Lean gives them: `exact ei_line_probe_unknown` (an unknown identifier: the `server` backend's line probe, on that
line) and the `norm_num` of `ei_doctor_false` (`ei doctor`'s false theorem `(2 : ℕ) + 2 = 5`: unsolved goals, on
that line).
Options: --log FILE (appends `start PID`, `cmd PID` and `pickle PID` lines), --header-delay S, --hang-on-header,
--die-after N (crash on the N-th proof), --no-flush, --lean (act as `lean --json FILE`, FILE the last argument),
--hang-on REGEX (never answer a proof command whose text matches REGEX; the header and `#print` commands are answered).
"""
import itertools, json, mmap, os, re, sys, time

AXIOMS = ['propext', 'Classical.choice', 'Quot.sound']
WIDTH = 80

# ---------------------------------------------------------------- Lean's Json.pretty
def _flat(v):
    if isinstance(v, dict):
        return '{' + ', '.join(f'{json.dumps(k, ensure_ascii=False)}: {_flat(x)}' for k, x in _items(v)) + '}'
    if isinstance(v, list): return '[' + ', '.join(_flat(x) for x in v) + ']'
    return json.dumps(v, ensure_ascii=False)

def _items(d): return sorted(d.items(), key=lambda kv: kv[0], reverse=True)   # Lean's RBMap fold: reverse order

def _render(v, col):
    "Text of `v` starting at column `col`: flat if it fits in the line, else one member per line."
    flat = _flat(v)
    if len(flat) <= WIDTH - col or not isinstance(v, (dict, list)) or not v: return flat
    inner = col + 1
    if isinstance(v, list):
        parts = [_render(x, inner) for x in v]
        return '[' + (',\n' + ' ' * inner).join(parts) + ']'
    parts = []
    for k, x in _items(v):
        key = json.dumps(k, ensure_ascii=False) + ':'
        fx = _flat(x)
        if len(key) + 1 + len(fx) <= WIDTH - inner: parts.append(f'{key} {fx}')
        else: parts.append(key + '\n' + ' ' * inner + _render(x, inner))
    return '{' + (',\n' + ' ' * inner).join(parts) + '}'

def pretty(v) -> str: return _render(v, 0)

# ---------------------------------------------------------------- replies
def _axiom_line(text):
    for i, line in enumerate(text.split('\n'), 1):
        m = re.match(r'\s*#print\s+axioms\s+(\S+)', line)
        if m: return i, m.group(1).removeprefix('_root_.')     # Lean prints the name it resolved
    return None, None

def _line_of(text, what):
    return text[:text.index(what)].count('\n') + 1

def _msg(severity, line, data, col=0, end=1):
    return {'severity': severity, 'pos': {'line': line, 'column': col},
            'endPos': None if end is None else {'line': line, 'column': col + end}, 'data': data}

def action(text):
    "The misbehaviour a command asks for, or None."
    for a in ('hang', 'crash', 'garbage', 'partial', 'flood', 'leak'):
        if f'FAKE:{a}' in text: return a
    return None

def reply_for(text, env=None, next_state=0):
    "The REPL reply (a dict) to a proof command with text `text` (no process-level faults)."
    m = re.search(r'FAKE:slow=([0-9.]+)', text)
    if m: time.sleep(float(m.group(1)))
    if 'FAKE:replerror' in text: return {'message': 'Unknown environment.'}
    if 'FAKE:badshape' in text: return {'env': env, 'messages': 'oops'}
    msgs, sorries = [], []
    if 'FAKE:error' in text: msgs.append(_msg('error', _line_of(text, 'FAKE:error'), 'unsolved goals\n⊢ False', 2, 5))
    if 'ei_line_probe_unknown' in text:   # ServerBackend's line probe: Lean's error for an unknown identifier
        msgs.append(_msg('error', _line_of(text, 'ei_line_probe_unknown'), "unknown identifier 'ei_line_probe_unknown'",
                         8, 21))
    if 'ei_doctor_false' in text and 'norm_num' in text:   # ei doctor's false theorem, 2 + 2 = 5
        msgs.append(_msg('error', _line_of(text, 'norm_num'), 'unsolved goals\n⊢ False', 2, 8))
    if 'FAKE:nullend' in text:
        msgs.append(_msg('warning', _line_of(text, 'FAKE:nullend'), 'unused variable `h`', 2, None))
    if 'FAKE:sorry428' in text:
        msgs.append(_msg('warning', _line_of(text, 'FAKE:sorry428'), 'declaration uses `sorry`', 8, 10))
    elif 'FAKE:sorry' in text:
        line = _line_of(text, 'FAKE:sorry')
        msgs.append(_msg('warning', line, "declaration uses 'sorry'", 8, 10))
        sorries.append({'proofState': next_state, 'pos': {'line': line, 'column': 2}, 'goal': '⊢ False',
                        'endPos': {'line': line, 'column': 7}})
    line, name = _axiom_line(text)
    if name and 'FAKE:noaxioms' not in text:
        extra = re.findall(r'FAKE:axiom=([\w.]+)', text)
        tainted = ['sorryAx'] if any(x in text for x in ('FAKE:error', 'FAKE:sorry')) else []
        q = re.search(r'FAKE:qualified=([\w.]+)', text)
        shown = f'{q.group(1)}.{name}' if q else name
        if 'FAKE:twoaxioms' in text: msgs.insert(0, _msg('info', 1, f"'{name}' does not depend on any axioms", 0, 6))
        msgs.append(_msg('info', line, f"'{shown}' depends on axioms: [{', '.join(AXIOMS + extra + tainted)}]", 0, 6))
    for i, l in enumerate(text.split('\n'), 1):    # `#print "TEXT"`: Lean logs the string
        if (q := re.match(r'#print\s+"([^"\\]*)"\s*$', l)): msgs.append(_msg('info', i, q.group(1), 0, 6))
    for i, l in enumerate(text.split('\n'), 1):    # the verifier's statement probe: "the type Lean holds", faked
        if (p := re.match(r'#eval .*Lean\.getConstInfo `(\S+)\)\.type\.dbgToString', l)):
            typ = fake_type(text, p.group(1))
            if typ is None: msgs.append(_msg('error', i, f"unknown constant '{p.group(1)}'")); continue
            msgs.append(_msg('info', i, f'ei-statement-type: {typ}', 0, 5))
    reply = {'env': env} if env is not None else {}
    if msgs: reply['messages'] = msgs
    if sorries: reply['sorries'] = sorries
    return reply

def fake_type(text, name):
    "The type of theorem NAME as the fake reports it (probe, pickle stand-in): its statement's text, normalised."
    d = re.search(r'(?:theorem|lemma)\s+' + re.escape(name) + r'(?![\w\'.])(.*?):=', text, re.S)
    if d is None: return None
    typ = '(fake) ' + ' '.join(re.sub(r'--[^\n]*|/-.*?-/', ' ', d.group(1), flags=re.S).split())
    return typ + (' [elaborated differently]' if 'FAKE:retype' in text and name != 'ei_reference_statement' else '')

# ---------------------------------------------------------------- the pickle stand-in
def header_imports(header):
    "The imports of a header command, as the REPL's environment records them (`Init` first)."
    return ['Init'] + re.findall(r'^\s*import\s+(\S+)', header, re.M)

def added_constants(text):
    "The constants a proof command adds, faked from its text, with the forgeries its directives ask for."
    main = _axiom_line(text)[1]
    out = [{'name': n, 'kind': 'thm', 'type': fake_type(text, n), 'value_type': fake_type(text, n),
            'uses': list(AXIOMS)}
           for n in dict.fromkeys(re.findall(r'(?:theorem|lemma)\s+([^\s:(\[{]+)', text))]
    m = next((c for c in out if c['name'] == main), None)
    if m is None: return out
    if 'FAKE:addfalse' in text:
        out.append({'name': 'false', 'kind': 'thm', 'type': 'False', 'value_type': 'Prop', 'uses': []})
        m['uses'].append('false')
    if 'FAKE:addctor' in text:
        out.append({'name': 'False.intro', 'kind': 'ctor', 'induct': 'False', 'type': 'False'})
        m['uses'].append('False.intro')
    if 'FAKE:lonector' in text: out.append({'name': 'False.intro', 'kind': 'ctor', 'induct': 'False', 'type': 'False'})
    if 'FAKE:replaceaxiom' in text: m['assumes'] = {'propext': 'False'}
    if 'FAKE:skipkernel' in text: m['value_type'] = 'False'
    if 'FAKE:hideaxiom' in text:
        out.append({'name': 'cheat', 'kind': 'axiom', 'type': m['type']}); m['uses'].append('cheat')
    if 'FAKE:replaytype' in text: m['type'] = m['value_type'] = m['type'] + ' [forged]'
    if 'FAKE:nativedecide' in text: m['reduce_bool'] = 'foo'
    if 'FAKE:unsafehelper' in text:
        out.append({'name': 'helper_unsafe', 'kind': 'defn', 'type': 'Nat', 'value_type': 'Nat', 'unsafe': True})
        m['uses'].append('helper_unsafe')
    if 'FAKE:notadded' in text: out.remove(m)
    return out

def write_pickle(path, imports, texts):
    "Write the stand-in of the environment the commands `texts` built on the header's `imports`."
    text = '\n'.join(texts)
    if 'FAKE:nopickle' in text: return
    data = {'ei_fake_pickle': 1, 'imports': imports + (['Evil'] if 'FAKE:otherimports' in text else []),
            'constants': [c for t in texts for c in added_constants(t)]}
    for what in ('crash', 'garbage', 'hang', 'error'):
        if f'FAKE:replay{what}' in text: data['fake_tool'] = what
    with open(path, 'w', encoding='utf-8') as f: json.dump(data, f, ensure_ascii=False)

# ---------------------------------------------------------------- output, buffered like C stdio when asked
class Out:
    "stdout; with `no_flush`, block-buffered like glibc on a pipe (line-buffered on a tty or with _STDBUF_O=L)."
    def __init__(self, no_flush):
        self.line_mode = not no_flush or os.isatty(1) or os.environ.get('_STDBUF_O') == 'L'
        self.buf = bytearray()
    def write(self, data:bytes):
        self.buf += data
        if self.line_mode: self.flush()
        elif len(self.buf) >= 4096: os.write(1, bytes(self.buf[:4096])); del self.buf[:4096]
    def flush(self):
        while self.buf: del self.buf[:os.write(1, bytes(self.buf))]

def misbehave(a, out):
    "Carry out a process-level fault `a`."
    if a == 'hang':
        while True: time.sleep(3600)
    if a == 'crash':
        sys.stderr.write('fake repl: crashing on request\n'); sys.stderr.flush(); os._exit(3)
    if a == 'garbage':
        out.write(b'this is not JSON {{{\n\n'); out.flush(); return
    if a == 'partial':
        out.write(b'{"env": 1, "messa'); out.flush()
        while True: time.sleep(3600)
    if a == 'flood':
        while True: out.write(b'x' * 65536); out.flush()
    if a == 'leak':
        # address space, untouched: an RLIMIT_AS stops this at once, and without a limit it costs no RAM
        try: hog = [mmap.mmap(-1, 256 << 20) for _ in range(256)]
        except (MemoryError, OSError):       # Lean's allocator at the limit: lean_internal_panic_out_of_memory
            sys.stderr.write('INTERNAL PANIC: out of memory\n'); sys.stderr.flush(); os._exit(1)
        while True: time.sleep(3600)

def run_code(text):
    "Execute the `-- RUN: CODE` lines of a command: code a proof runs inside Lean, here Python with the fake's rights."
    for code in re.findall(r'^\s*-- RUN: (.*)$', text, re.M):
        try: exec(code, {'os': os, 'sys': sys, 'json': json, 'time': time})
        except Exception as e: sys.stderr.write(f'fake repl: RUN: {type(e).__name__}: {e}\n')   # elaboration goes on

def hangs(argv, text):
    "Whether `--hang-on REGEX` asks to never answer this proof command."
    pattern = _opt(argv, '--hang-on')
    return bool(pattern and re.search(pattern, text))

def forged(text, env):
    "The clean-pass reply a proof's code prints to forge its verdict (FAKE:forge), with the real reply's env number."
    line, name = _axiom_line(text)
    report = f"'{name}' depends on axioms: [{', '.join(AXIOMS)}]"
    return {'env': env, 'messages': [_msg('info', line or 1, report, 0, 6)]}

def _log(path, what):
    if path:
        with open(path, 'a') as f: f.write(f'{what} {os.getpid()}\n')

def _opt(argv, name, default=None, cast=str):
    return cast(argv[argv.index(name) + 1]) if name in argv else default

def lean_main(argv):
    "Act as `lean --json FILE`: one compact JSON message per line (severity `information`), exit 1 on an error."
    path = argv[-1]
    _log(_opt(argv, '--log'), 'lean')
    text = open(path, encoding='utf-8').read()
    out = Out(False)
    def emit(m):
        m = {'fileName': path, **m, 'caption': '', 'keepFullRange': False}
        out.write((json.dumps(m, ensure_ascii=False) + '\n').encode())
    if 'import Broken' in text:
        emit(_msg('error', 1, "unknown package 'Broken'")); return 1
    run_code(text)
    if hangs(argv, text): misbehave('hang', out)
    a = action(text)
    if a: misbehave(a, out)
    reply = reply_for(text)
    if '-o' in argv and not any(m['severity'] == 'error' for m in reply.get('messages', []) if isinstance(m, dict)):
        write_pickle(argv[argv.index('-o') + 1], header_imports(text), [text])     # the file: header, then proof
    if 'message' in reply: out.write(('not json: ' + reply['message'] + '\n').encode()); return 0
    msgs = reply.get('messages', [])
    if not isinstance(msgs, list): out.write(b'garbage\n'); return 0
    if 'FAKE:u2028' in text: msgs.insert(0, _msg('info', 1, 'line\u2028separator and paragraph\u2029separator'))
    for m in msgs: emit({**m, 'severity': 'information' if m['severity'] == 'info' else m['severity']})
    return 1 if any(m['severity'] == 'error' for m in msgs) else 0

def main(argv):
    if '--lean' in argv: return lean_main(argv)
    log, delay = _opt(argv, '--log'), _opt(argv, '--header-delay', 0.0, float)
    die_after = _opt(argv, '--die-after', 0, int)
    _log(log, 'start')
    out, n_env, n_proofs, n_states, block = Out('--no-flush' in argv), 0, 0, 0, []
    envs = {}                                            # env id -> (header imports, the texts of its commands)
    try:
        for line in itertools.chain(sys.stdin, ['\n']):      # end of input ends the last command too
            if line.strip(): block.append(line); continue
            if not block: continue
            text, block = ''.join(block), []
            if text.startswith('#') or text.startswith('--'): continue
            try: cmd = json.loads(text)
            except ValueError as e:   # the real REPL throws from `parse`: uncaught, no reply, exit 1
                out.flush()
                said = json.dumps({'message': f'Could not parse as a valid JSON command:\n{e}'})
                sys.stderr.write('uncaught exception: ' + said + '\n')
                return 1
            sync = str(cmd.get('cmd', '')).startswith('#print "ei-sync-')
            _log(log, 'pickle' if 'pickleTo' in cmd else 'sync' if sync else 'cmd')
            if 'pickleTo' in cmd:
                if cmd.get('env') not in envs: reply = {'message': 'Unknown environment.'}
                else: write_pickle(cmd['pickleTo'], *envs[cmd['env']]); reply = {'env': cmd['env']}
            elif 'env' not in cmd:
                if '--hang-on-header' in argv: misbehave('hang', out)
                time.sleep(delay)
                envs[n_env] = (header_imports(cmd.get('cmd', '')), [])
                reply, n_env = {'env': n_env}, n_env + 1
                if 'import Broken' in cmd.get('cmd', ''):
                    reply['messages'] = [_msg('error', 1, "unknown package 'Broken'")]
            elif not isinstance(cmd['env'], int) or cmd['env'] >= n_env:
                reply = {'message': 'Unknown environment.'}
            else:
                text = cmd.get('cmd', '')
                n_proofs += not sync
                if die_after and n_proofs >= die_after and not sync: misbehave('crash', out)
                run_code(text)
                if hangs(argv, text) and not sync: misbehave('hang', out)
                a = action(text)
                if a: misbehave(a, out)
                if a == 'garbage': continue
                if 'FAKE:forge' in text: out.write((pretty(forged(text, n_env)) + '\n\n').encode()); out.flush()
                reply = reply_for(text.replace('FAKE:forge', 'FAKE:error'), n_env, n_states)
                if 'FAKE:wrongenv' in text: reply['env'] = n_env + 7
                n_states += len(reply.get('sorries', [])) if isinstance(reply.get('sorries'), list) else 0
                imports, texts = envs[cmd['env']]
                envs[n_env] = (imports, texts + [cmd.get('cmd', '')])
                n_env += 1
            out.write((pretty(reply) + '\n\n').encode())
    finally:
        out.flush()
    return 0

if __name__ == '__main__': sys.exit(main(sys.argv[1:]))

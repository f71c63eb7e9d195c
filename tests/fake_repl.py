#!/usr/bin/env python3
"""A FAKE Lean REPL for fault-injection tests of `ei_nb.verify`. It runs no Lean and proves nothing.

It speaks the Lean REPL protocol (JSON commands separated by blank lines; a command without `env`
imports a header and returns a new `env`; a reply carries `env`, `messages`, `sorries`) and misbehaves
on request, so the tests can prove that the process layer turns every fault into an `error` verdict.

Directives are read from the command text (the verifier sends the proof verbatim, comments included):
  FAKE:hang        never answer                  FAKE:crash      exit(3) without answering
  FAKE:garbage     answer text that is not JSON  FAKE:partial    half a JSON object, then hang
  FAKE:flood       endless output, no blank line FAKE:leak       allocate memory until the limit kills it
  FAKE:slow=S      sleep S seconds, then answer  FAKE:badshape   `messages` is not a list
  FAKE:error       a Lean error message          FAKE:sorry      a sorry warning and a `sorries` entry
  FAKE:axiom=NAME  an extra axiom in the report  FAKE:noaxioms   no `#print axioms` report
  FAKE:twoaxioms   two axiom reports             FAKE:replerror  a REPL-level {"message": ...} reply
Otherwise the reply is a clean pass: one info message "'NAME' depends on axioms: [propext, ...]"
on the line of `#print axioms NAME`.

A header containing `import Broken` fails to import (an error message, as Lean reports it).
Options: --log FILE (appends `start PID` and `cmd PID` lines), --header-delay S, --hang-on-header,
--die-after N (crash on the N-th proof), --lean (act as `lean --json FILE`, FILE the last argument).
"""
import json, mmap, os, re, sys, time

AXIOMS = ['propext', 'Classical.choice', 'Quot.sound']

def _axiom_line(text):
    for i, line in enumerate(text.split('\n'), 1):
        m = re.match(r'\s*#print\s+axioms\s+(\S+)', line)
        if m: return i, m.group(1)
    return None, None

def _line_of(text, what):
    return text[:text.index(what)].count('\n') + 1

def _msg(severity, line, data):
    return {'severity': severity, 'pos': {'line': line, 'column': 0}, 'endPos': {'line': line, 'column': 1}, 'data': data}

def action(text):
    "The misbehaviour a command asks for, or None."
    for a in ('hang', 'crash', 'garbage', 'partial', 'flood', 'leak'):
        if f'FAKE:{a}' in text: return a
    return None

def reply_for(text, env=None):
    "The REPL reply (a dict) to a proof command with text `text` (no process-level faults)."
    m = re.search(r'FAKE:slow=([0-9.]+)', text)
    if m: time.sleep(float(m.group(1)))
    if 'FAKE:replerror' in text: return {'message': 'Unknown environment.'}
    if 'FAKE:badshape' in text: return {'env': env, 'messages': 'oops'}
    msgs, sorries = [], []
    if 'FAKE:error' in text: msgs.append(_msg('error', _line_of(text, 'FAKE:error'), 'unsolved goals\n⊢ False'))
    if 'FAKE:sorry' in text:
        line = _line_of(text, 'FAKE:sorry')
        msgs.append(_msg('warning', line, "declaration uses 'sorry'"))
        sorries.append({'pos': {'line': line, 'column': 2}, 'endPos': {'line': line, 'column': 7}, 'goal': '⊢ False'})
    line, name = _axiom_line(text)
    if name and 'FAKE:noaxioms' not in text:
        extra = re.findall(r'FAKE:axiom=([\w.]+)', text)
        report = f"'{name}' depends on axioms: [{', '.join(AXIOMS + extra)}]"
        if 'FAKE:twoaxioms' in text: msgs.append(_msg('info', 1, f"'{name}' does not depend on any axioms"))
        msgs.append(_msg('info', line, report))
    reply = {'env': env} if env is not None else {}
    if msgs: reply['messages'] = msgs
    if sorries: reply['sorries'] = sorries
    return reply

def misbehave(a, out):
    "Carry out a process-level fault `a`, writing to the binary stream `out`."
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
        # address space, untouched: an RLIMIT_AS kills this at once, and without a limit it costs no RAM
        hog = [mmap.mmap(-1, 256 << 20) for _ in range(256)]
        while True: time.sleep(3600)

def _log(path, what):
    if path:
        with open(path, 'a') as f: f.write(f'{what} {os.getpid()}\n')

def _opt(argv, name, default=None, cast=str):
    return cast(argv[argv.index(name) + 1]) if name in argv else default

def lean_main(argv):
    "Act as `lean --json FILE`: one JSON message per line, exit 1 when there is an error."
    path = argv[-1]
    _log(_opt(argv, '--log'), 'lean')
    text = open(path, encoding='utf-8').read()
    if 'import Broken' in text:
        print(json.dumps(_msg('error', 1, "unknown package 'Broken'"))); return 1
    a = action(text)
    if a: misbehave(a, sys.stdout.buffer)
    reply = reply_for(text)
    if 'message' in reply: print('not json: ' + reply['message']); return 0
    msgs = reply.get('messages', [])
    if not isinstance(msgs, list): print('garbage'); return 0
    for m in msgs: print(json.dumps(m, ensure_ascii=False))
    return 1 if any(m['severity'] == 'error' for m in msgs) else 0

def main(argv):
    if '--lean' in argv: return lean_main(argv)
    log, delay = _opt(argv, '--log'), _opt(argv, '--header-delay', 0.0, float)
    die_after = _opt(argv, '--die-after', 0, int)
    _log(log, 'start')
    out, n_env, n_proofs, block = sys.stdout.buffer, 0, 0, []
    for line in sys.stdin:
        if line.strip(): block.append(line); continue
        if not block: continue
        text, block = ''.join(block), []
        try: cmd = json.loads(text)
        except ValueError: reply = {'message': 'Could not parse JSON'}
        else:
            _log(log, 'cmd')
            if 'env' not in cmd:
                if '--hang-on-header' in argv: misbehave('hang', out)
                time.sleep(delay)
                reply, n_env = {'env': n_env}, n_env + 1
                if 'import Broken' in cmd.get('cmd', ''): reply['messages'] = [_msg('error', 1, "unknown package 'Broken'")]
            elif not isinstance(cmd['env'], int) or cmd['env'] >= n_env:
                reply = {'message': 'Unknown environment.'}
            else:
                n_proofs += 1
                if die_after and n_proofs >= die_after: misbehave('crash', out)
                a = action(cmd.get('cmd', ''))
                if a: misbehave(a, out)
                if a == 'garbage': continue
                reply = reply_for(cmd.get('cmd', ''), n_env)
                n_env += 1
        out.write((json.dumps(reply, indent=2, ensure_ascii=False) + '\n\n').encode()); out.flush()
    return 0

if __name__ == '__main__': sys.exit(main(sys.argv[1:]))

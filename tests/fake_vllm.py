#!/usr/bin/env python3
"""A FAKE `vllm` executable (`vllm serve MODEL_DIR [flags]`) for tests of `ei_nb.vllm_server` and the `openai` sampler.
It runs no GPU model: completions come from a file of canned texts, or from the tiny CPU model in MODEL_DIR.

Written from vLLM 0.34.0 (the PyPI wheel, `vllm/_version.py` commit 62d4bc3c7), read for this file:
- the CLI: `vllm/entrypoints/cli/serve.py` (`vllm serve [model_tag] [options]`), `vllm/engine/arg_utils.py` and
  `vllm/entrypoints/common/cli_args.py` for the flags below; `vllm/utils/argparse_utils.py` (FlexibleArgumentParser:
  an argparse parser, `--max_model_len` == `--max-model-len`, an unknown flag is "error: unrecognized arguments",
  exit 2); `--data-parallel-backend` other than mp/ray fails after parsing ("data_parallel_backend can only be ray
  or mp"); a model folder without config.json fails at start (exit 1).
- `/health` (`vllm/entrypoints/serve/instrumentator/health.py`): 200, empty body.
- `/v1/models` (`vllm/entrypoints/launchers/api_server/app_state.py`, `openai/models/serving.py`): one ModelCard per
  served name, `id` = `--served-model-name` or else MODEL_DIR exactly as given, `root` = MODEL_DIR.
- `/v1/completions` (`vllm/entrypoints/openai/completion/protocol.py` CompletionRequest/CompletionResponse,
  `completion/serving.py`): `prompt` a string or a list of strings, `n`, `seed`, `max_tokens` (default 16),
  `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`, `presence_penalty`, `frequency_penalty`, `stop`,
  `skip_special_tokens`, `logprobs`; unknown fields are accepted and ignored (`extra="allow"`); a field left out (None)
  takes the server default, else `_DEFAULT_SAMPLING_PARAMS`; the server default is the model's generation_config.json
  under `--generation-config auto` (the default) and empty under `vllm` (`vllm/config/model.py`
  get_diff_sampling_param); the cap is min(max_model_len - prompt tokens, max_tokens)
  (`vllm/entrypoints/serve/utils/api_utils.py` get_max_tokens); choices are numbered over prompts x n; finish_reason
  "stop" (EOS or a stop string, then `stop_reason` names it) or "length"; errors are
  `{"error": {"message", "type", "param", "code"}}`; a model name that is not served is 404; with `--api-key`, `/v1/*`
  needs `Authorization: Bearer KEY` (`serve/middleware/authenticate.py`: 401 `{"error": "Unauthorized"}`).
- like vLLM's engine-core process, a child process runs in the server's process group (its pid is logged).

Environment:
  FAKE_VLLM_LOG=FILE         JSON Lines: a `start` record (argv, parsed flags, pids) per start, a `request` record per
                             request as it arrives (path, body), a `reply` record per POST answered (status, and for
                             completions the effective sampling parameters of each prompt)
  FAKE_VLLM_COMPLETIONS=FILE JSON Lines of {"text": ...}: choice j of a prompt is line hash(seed, prompt, j) mod lines
  FAKE_VLLM_DIE_AFTER=K      exit(1) on the (K+1)-th completions request, without answering ("engine died")
  FAKE_VLLM_DIE_ONCE=FILE    with DIE_AFTER: die only while FILE does not exist (created when dying)
  FAKE_VLLM_START_DELAY=S    sleep S seconds before listening (a model load)
  FAKE_VLLM_IGNORE_TERM=1    ignore SIGTERM (a server that does not shut down)
"""
import argparse, hashlib, http.server, json, os, re, signal, subprocess, sys, threading, time
from pathlib import Path

DEFAULT_SAMPLING = {'repetition_penalty': 1.0, 'presence_penalty': 0.0, 'frequency_penalty': 0.0, 'temperature': 1.0,
                    'top_p': 1.0, 'top_k': 0, 'min_p': 0.0}     # CompletionRequest._DEFAULT_SAMPLING_PARAMS
GENERATION_FIELDS = ('repetition_penalty', 'presence_penalty', 'frequency_penalty', 'temperature', 'top_k', 'top_p',
                     'min_p', 'max_new_tokens', 'skip_special_tokens')   # get_diff_sampling_param's available_params
HF_DEFAULTS = {'temperature': 1.0, 'top_k': 50, 'top_p': 1.0, 'repetition_penalty': 1.0}  # transformers GenerationConfig
FLOATS = ('temperature', 'top_p', 'min_p', 'repetition_penalty', 'presence_penalty', 'frequency_penalty')
INTS = ('n', 'top_k', 'max_tokens', 'seed', 'logprobs')


# ---------------------------------------------------------------- the command line
def parser():
    p = argparse.ArgumentParser(prog='vllm serve', allow_abbrev=False)
    p.add_argument('model_tag')
    p.add_argument('--host'); p.add_argument('--port', type=int, default=8000)
    p.add_argument('--data-parallel-size', '-dp', type=int, default=1)
    p.add_argument('--data-parallel-size-local', '-dpl', type=int)
    p.add_argument('--data-parallel-backend', '-dpb', type=str, default='mp')
    p.add_argument('--tensor-parallel-size', '-tp', type=int, default=1)
    p.add_argument('--max-model-len', type=int); p.add_argument('--seed', type=int, default=0)
    p.add_argument('--generation-config', default='auto'); p.add_argument('--served-model-name', nargs='+')
    p.add_argument('--api-key', nargs='+'); p.add_argument('--gpu-memory-utilization', type=float, default=0.9)
    p.add_argument('--dtype', default='auto'); p.add_argument('--enforce-eager', action='store_true')
    p.add_argument('--max-num-seqs', type=int)   # EngineArgs.max_num_seqs: None, then the hardware's default
    return p

def dashed(argv):
    "FlexibleArgumentParser: `--a_b` and `--a_b=v` mean `--a-b`."
    return [re.sub(r'^--[^=]+', lambda m: m.group(0).replace('_', '-'), a) if a.startswith('--') else a for a in argv]

def parse(argv):
    if not argv or argv[0] != 'serve':
        print('usage: vllm serve [model_tag] [options] (this fake knows only `serve`)', file=sys.stderr); sys.exit(2)
    a = parser().parse_args(dashed(argv[1:]))
    if a.data_parallel_backend not in ('mp', 'ray'):
        print(f"AssertionError: ('data_parallel_backend can only be ray or mp, got %s', '{a.data_parallel_backend}')", file=sys.stderr); sys.exit(1)
    if not (Path(a.model_tag)/'config.json').is_file():
        print(f"ValueError: Invalid repository ID or local directory specified: '{a.model_tag}'", file=sys.stderr); sys.exit(1)
    return a


# ---------------------------------------------------------------- the model: defaults, tokens, texts
def server_defaults(a) -> dict:
    "get_diff_sampling_param: {} under `vllm`, else the non-default sampling fields of generation_config.json."
    if a.generation_config == 'vllm': return {}
    folder = Path(a.model_tag if a.generation_config == 'auto' else a.generation_config)
    cfg = json.loads((folder/'generation_config.json').read_text()) if (folder/'generation_config.json').is_file() else {}
    out = {k: cfg[k] for k in GENERATION_FIELDS if cfg.get(k) is not None and cfg[k] != HF_DEFAULTS.get(k, object())}
    if 'max_new_tokens' in out: out['max_tokens'] = out.pop('max_new_tokens')
    return out

class Tokens:
    "Token counts from MODEL_DIR's tokenizer.json (the `tokenizers` package), else whitespace words."
    def __init__(self, model_dir):
        self.tok = None
        if (Path(model_dir)/'tokenizer.json').is_file():
            import tokenizers
            self.tok = tokenizers.Tokenizer.from_file(str(Path(model_dir)/'tokenizer.json'))
    def ids(self, text): return self.tok.encode(text, add_special_tokens=False).ids if self.tok else text.split()
    def cut(self, text, k):
        "The first `k` tokens of `text`."
        if self.tok: return self.tok.decode(self.ids(text)[:k])
        return ' '.join(text.split()[:k])

class Canned:
    "Choice j of a prompt: line hash(seed, prompt, j) of the file, cut at a stop string or at the cap."
    def __init__(self, path, tokens):
        self.texts = [json.loads(l)['text'] for l in Path(path).read_text().splitlines() if l.strip()]
        self.tokens = tokens
    def complete(self, prompt, eff, n):
        out = []
        for j in range(n):
            h = hashlib.sha256(json.dumps([eff['seed'], prompt, j]).encode()).digest()
            out.append(finish(self.texts[int.from_bytes(h[:4], 'little') % len(self.texts)], eff, self.tokens))
        return out

def finish(text, eff, tokens):
    "(text, finish_reason, stop_reason, n_tokens) after the stop strings and the cap."
    hits = [(text.index(s), s) for s in eff['stop'] if s in text]
    if hits:
        at, s = min(hits); text = text[:at]
        if len(tokens.ids(text)) <= eff['max_tokens']: return text, 'stop', s, len(tokens.ids(text))
    if len(tokens.ids(text)) > eff['max_tokens']: return tokens.cut(text, eff['max_tokens']), 'length', None, eff['max_tokens']
    return text, 'stop', None, len(tokens.ids(text))

class TinyModel:
    "Sampling from the CPU model in MODEL_DIR with transformers and the effective parameters."
    def __init__(self, model_dir):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.torch, self.tok = torch, AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
    lock = threading.Lock()   # one request at a time: a request's seed then fixes its samples whatever runs beside it,
                              # as vLLM's per-request seeded sampling does (torch's global generator is shared by threads)
    def complete(self, prompt, eff, n):
        with self.lock: return self._complete(prompt, eff, n)

    def _complete(self, prompt, eff, n):
        t = self.torch
        t.manual_seed(eff['seed'] if eff['seed'] is not None else 0)
        enc = self.tok(prompt, return_tensors='pt', add_special_tokens=False)
        how = dict(do_sample=True, temperature=eff['temperature'], top_p=eff['top_p'], top_k=eff['top_k'] if eff['top_k'] > 0 else 0,
                   min_p=eff['min_p'] or None, repetition_penalty=eff['repetition_penalty']) if eff['temperature'] > 0 else dict(do_sample=False)
        with t.inference_mode():
            out = self.model.generate(**enc, **how, max_new_tokens=eff['max_tokens'], num_return_sequences=n,
                                      eos_token_id=sorted(self.eos), pad_token_id=sorted(self.eos)[0])
        rows = []
        for ids in out[:, enc['input_ids'].shape[1]:].tolist():
            end = next((i for i, x in enumerate(ids) if x in self.eos), None)
            kept = ids if end is None else ids[:end]
            text = self.tok.decode(kept, skip_special_tokens=eff['skip_special_tokens'])
            rows.append((text, 'stop' if end is not None else 'length', None, len(kept) + (end is not None)))
        return rows


# ---------------------------------------------------------------- requests
class BadRequest(Exception):
    def __init__(self, msg, code=400, kind='BadRequestError', param=None): super().__init__(msg); self.code, self.kind, self.param = code, kind, param

def check_types(body):
    "What pydantic refuses with a 400 (the fields modelled here)."
    if not isinstance(body, dict): raise BadRequest('the request body must be a JSON object')
    for k in INTS:
        if body.get(k) is not None and (not isinstance(body[k], int) or isinstance(body[k], bool)): raise BadRequest(f'{k}: Input should be a valid integer', param=k)
    for k in FLOATS:
        if body.get(k) is not None and (not isinstance(body[k], (int, float)) or isinstance(body[k], bool)): raise BadRequest(f'{k}: Input should be a valid number', param=k)
    p = body.get('prompt')
    if not (isinstance(p, str) and p) and not (isinstance(p, list) and p and all(isinstance(x, str) for x in p)):
        raise BadRequest('Either prompt or prompt_embeds must be provided and non-empty.', param='prompt')
    if body.get('n', 1) < 1: raise BadRequest('n must be at least 1, got %d.' % body['n'], param='n')

def effective(body, defaults, prompt_len, max_model_len) -> dict:
    "The sampling parameters vLLM would use for this request (user -> server default -> vLLM default)."
    eff = {k: body[k] if body.get(k) is not None else defaults.get(k, d) for k, d in DEFAULT_SAMPLING.items()}
    if prompt_len > max_model_len: raise BadRequest(f"Input length ({prompt_len}) exceeds model's maximum context length ({max_model_len}).")
    cap = body.get('max_tokens') if body.get('max_tokens') is not None else defaults.get('max_tokens', 16)
    stop = body.get('stop') or []
    return eff | {'n': body.get('n', 1), 'seed': body.get('seed'), 'max_tokens': min(max_model_len - prompt_len, cap),
                  'stop': [stop] if isinstance(stop, str) else list(stop),
                  'skip_special_tokens': body['skip_special_tokens'] if body.get('skip_special_tokens') is not None else defaults.get('skip_special_tokens', True)}


class Server:
    "The state of one `vllm serve` process."
    def __init__(self, a):
        self.a, self.lock, self.completions, self.in_flight = a, threading.Lock(), 0, 0
        self.names = a.served_model_name or [a.model_tag]
        self.defaults = server_defaults(a)
        cfg = json.loads((Path(a.model_tag)/'config.json').read_text())
        self.max_model_len = a.max_model_len or cfg.get('max_position_embeddings', 2048)
        self.tokens = Tokens(a.model_tag)
        canned = os.environ.get('FAKE_VLLM_COMPLETIONS')
        self.model = Canned(canned, self.tokens) if canned else TinyModel(a.model_tag)

    def log(self, rec):
        path = os.environ.get('FAKE_VLLM_LOG')
        if path:
            with self.lock, open(path, 'a') as f: f.write(json.dumps({**rec, 'pid': os.getpid()}) + '\n')

    def models(self):
        return {'object': 'list', 'data': [{'id': nm, 'object': 'model', 'created': int(time.time()), 'owned_by': 'vllm',
                'root': self.a.model_tag, 'parent': None, 'max_model_len': self.max_model_len, 'permission': []} for nm in self.names]}

    def maybe_die(self):
        k, once = os.environ.get('FAKE_VLLM_DIE_AFTER'), os.environ.get('FAKE_VLLM_DIE_ONCE')
        with self.lock: self.completions += 1; count = self.completions
        if k is not None and count > int(k) and not (once and Path(once).exists()):
            if once: Path(once).touch()
            print(f'ERROR EngineCore encountered a fatal error (fake: died after {k} completions requests)', file=sys.stderr, flush=True)
            os._exit(1)

    def complete(self, body):
        check_types(body)
        if body.get('model') and body['model'] not in self.names:
            raise BadRequest(f"The model `{body['model']}` does not exist. Valid aliases: {', '.join(self.names)}.", 404, 'NotFoundError', 'model')
        self.maybe_die()
        with self.lock: self.in_flight += 1; now = self.in_flight
        self.log({'event': 'in_flight', 'n': now})   # requests being answered at once (FAKE_VLLM_DELAY holds each)
        try:
            time.sleep(float(os.environ.get('FAKE_VLLM_DELAY') or 0))
            return self._complete(body)
        finally:
            with self.lock: self.in_flight -= 1

    def _complete(self, body):
        prompts = [body['prompt']] if isinstance(body['prompt'], str) else body['prompt']
        choices, effs, n_prompt, n_out = [], [], 0, 0
        for prompt in prompts:
            plen = len(self.tokens.ids(prompt))
            eff = effective(body, self.defaults, plen, self.max_model_len); effs.append(eff); n_prompt += plen
            for text, why, stop_reason, k in self.model.complete(prompt, eff, eff['n']):
                lp = None if body.get('logprobs') is None else {'text_offset': [], 'token_logprobs': [], 'tokens': [], 'top_logprobs': []}
                choices.append({'index': len(choices), 'text': text, 'logprobs': lp, 'finish_reason': why, 'stop_reason': stop_reason})
                n_out += k
        reply = {'id': f'cmpl-{os.urandom(8).hex()}', 'object': 'text_completion', 'created': int(time.time()), 'model': self.names[0],
                 'choices': choices, 'usage': {'prompt_tokens': n_prompt, 'total_tokens': n_prompt + n_out, 'completion_tokens': n_out}}
        return reply, effs


def handler(server):
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'
        def log_message(self, *a): pass
        def send(self, code, obj=None):
            data = b'' if obj is None else json.dumps(obj).encode()
            self.send_response(code)
            if obj is not None: self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(data))); self.end_headers(); self.wfile.write(data)
        def authorised(self):
            keys = server.a.api_key
            if not keys or not self.path.startswith('/v1'): return True
            scheme, _, token = (self.headers.get('Authorization') or '').partition(' ')
            return scheme.lower() == 'bearer' and token in keys
        def do_GET(self):
            server.log({'event': 'request', 'method': 'GET', 'path': self.path})
            if not self.authorised(): return self.send(401, {'error': 'Unauthorized'})
            if self.path == '/health': return self.send(200)
            if self.path == '/v1/models': return self.send(200, server.models())
            self.send(404, {'detail': 'Not Found'})
        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get('Content-Length') or 0))
            try: body = json.loads(raw)
            except ValueError: body = None
            server.log({'event': 'request', 'method': 'POST', 'path': self.path, 'body': body})   # logged as received
            if not self.authorised(): return self.reply(401, {'error': 'Unauthorized'})
            if self.path != '/v1/completions': return self.reply(404, {'detail': 'Not Found'})
            try: reply, effs = server.complete(body)
            except BadRequest as e: return self.reply(e.code, {'error': {'message': str(e), 'type': e.kind, 'param': e.param, 'code': e.code}})
            self.reply(200, reply, effs)
        def reply(self, code, obj, effective=None):
            server.log({'event': 'reply', 'path': self.path, 'status': code, **({'effective': effective} if effective else {})})
            self.send(code, obj)
    return H


def main(argv):
    a = parse(argv)
    engine = subprocess.Popen([sys.executable, '-c', 'import time\nwhile True: time.sleep(3600)'])   # the "engine core" child
    def shutdown(signum, frame):   # vLLM shuts its engines down on SIGTERM (vllm/entrypoints/cli/serve.py signal_handler)
        engine.terminate(); engine.wait(); os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get('FAKE_VLLM_IGNORE_TERM') else shutdown)
    time.sleep(float(os.environ.get('FAKE_VLLM_START_DELAY') or 0))
    server = Server(a)
    httpd = http.server.ThreadingHTTPServer((a.host or '', a.port), handler(server))
    server.log({'event': 'start', 'argv': argv, 'flags': vars(a), 'engine_pid': engine.pid, 'defaults': server.defaults})
    print(f'INFO fake vllm serve {a.model_tag} on http://{a.host or "0.0.0.0"}:{a.port} (engine pid {engine.pid})', file=sys.stderr, flush=True)
    try: httpd.serve_forever()
    finally: engine.kill()

if __name__ == '__main__': main(sys.argv[1:])

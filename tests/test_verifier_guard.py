"""Issue 27, part 3: a broken verifier stops the run instead of scoring it. Stand-ins: a checking server whose every
check times out (kimina-lean-server answers a proof past its timeout with 200 and `"error": "Lean REPL command timed out
in N seconds"`, server/routers/check.py at fb2393de), a REPL that crashes on every proof (tests/fake_repl.py --die-after
1), and a checking server that answers 401 (kimina's server/auth.py: a wrong key). `ei eval`, `ei verify` and `ei
confirm run` stop with exit 3 naming the error share, the most common reason and the fix; the stage keeps its finished
chunks, and the rerun after the fix resumes and checks the `error` samples again. Sampling goes through the `served`
sampler and the stand-in `vllm serve` (tests/fake_vllm.py) with canned proofs, so every sample reaches the checker.

Issue 34, point 3: a timeout fails the proof, not the run. A checker that hangs on half the proofs finishes `ei verify`
(the REPL pool, in its sandbox) and a stage (`ei eval` on the checking-server stand-in) with exit 0 and half the
verdicts `fail` with reason `timeout`; one that times out on every proof, a known proof included, is still broken:
`error`, and the guard stops the run."""
import http.server, json, re, shlex, sys, zlib
from pathlib import Path
import pytest
from ei_nb.core import StageFailed, read_problems, read_samples, read_verdicts, shared_data, write_records

ROOT = Path(__file__).resolve().parent.parent
from tests import fake_repl
from tests.http_standin import serving

SERVE = {'vllm_bin': f'{sys.executable} {ROOT / "tests" / "fake_vllm.py"}', 'deadline': 120, 'grace': 5}


class Checker(http.server.BaseHTTPRequestHandler):
    """A kimina-lean-server stand-in: `ok` (the fake REPL's reply, lines from the top of the file), `timeout` (every
    request, its line probe included), `proofs_time_out` (every proof, the known proof included: only the line probe
    answers), `half` (the proofs of the problems `hangs` picks time out), or `401`."""
    mode, seen = 'ok', None
    def log_message(self, *a): pass
    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code); self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers(); self.wfile.write(data)
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        type(self).seen.append(body)
        if self.mode == '401': return self._send(401, {'detail': 'Invalid API key'})
        late = lambda c: (self.mode == 'timeout' or self.mode == 'proofs_time_out' and c['custom_id'] != 'ei-line-probe'
                          or self.mode == 'half' and hangs(c['proof']))
        late_error = f"Lean REPL command timed out in {body['timeout']} seconds"     # kimina's words
        self._send(200, {'results': [{'custom_id': c['custom_id'], 'error': late_error} if late(c) else
                                     {'custom_id': c['custom_id'], 'response': fake_repl.reply_for(c['proof'], 1)}
                                     for c in body['codes']]})

def checker(mode): return serving(Checker, mode=mode)

def hangs(text):
    "Whether the stand-ins hang on this proof: half the problems, picked by a hash of the theorem's name."
    m = re.search(r'#print axioms _root_\.(\S+)', text)
    return bool(m) and zlib.crc32(m.group(1).encode()) % 2 == 1


@pytest.fixture
def canned(tmp_path, monkeypatch):
    "The stand-in vllm answers every prompt with a proof body (completion style: the verifier rebuilds the file)."
    p = tmp_path / 'completions.jsonl'
    p.write_text(json.dumps({'text': '\n  norm_num\n```'}) + '\n')
    monkeypatch.setenv('FAKE_VLLM_COMPLETIONS', str(p))
    monkeypatch.setenv('FAKE_VLLM_LOG', str(tmp_path / 'vllm.jsonl'))


def _valid(k):
    return [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'valid'][:k]


def _eval_args(problems, model, out, url):
    return ['--problems', str(problems), '--model', str(model), '--out-dir', str(out), '--n', '1',
            '--max-new-tokens', '16', '--backend', 'served',
            *[a for k, v in SERVE.items() for a in ('--serve', f'{k}={json.dumps(v)}')],
            '--prompt-style', 'completion', '--chunk-problems', '8', '--verify-backend', 'server', '--endpoint', url,
            '--workers', '4']


def test_ei_eval_stops_on_a_server_whose_checks_all_time_out_and_resumes_after_the_fix(canned, tiny_model_dir,
                                                                                      tmp_path):
    from ei_nb.eval import eval_cli
    write_records(tmp_path / 'problems.jsonl', _valid(32), 'problem')
    out = tmp_path / 'eval'
    with checker('timeout') as (url, h):
        with pytest.raises(StageFailed) as e:
            eval_cli(_eval_args(tmp_path / 'problems.jsonl', tiny_model_dir, out, url))
    msg = str(e.value)
    assert 'ended in `error`' in msg and 'Lean REPL command timed out in N seconds' in msg
    assert 'raise it, or lower verify.workers' in msg
    assert 'verify.max_error_frac = 0.1' in msg and 'rerun the same command' in msg
    # the finished chunks are kept (here generation outran the checks)
    kept = read_samples(out / 'eval_samples.jsonl')
    assert len(kept) >= 8 and all(v['verdict'] == 'error' for v in read_verdicts(out / 'eval_verdicts.jsonl', False))
    with checker('ok') as (url, h):                                # the fix: a working server
        r = eval_cli(_eval_args(tmp_path / 'problems.jsonl', tiny_model_dir, out, url) + ['--allow-unreplayed'])
    assert r['verdict_counts'] == {'pass': 32} and r['solved'] == 32    # every `error` was checked again
    assert r['unreplayed_passes'] == 32 and r['allow_unreplayed']      # issue 36: server passes are not replayed
    ids = [c['custom_id'] for b in h.seen for c in b['codes']]
    # one line probe, each sample and its reference statement
    assert ids.count('ei-line-probe') == 1 and len(ids) == 1 + 32 + 32
    # the rerun had nothing to generate: it started no server
    if len(kept) == 32:
        assert (out / 'logs' / 'vllm_eval.log').read_text().count('starting: ') == 1


def test_ei_verify_stops_when_the_repl_crashes_on_every_proof(tmp_path, capsys):
    from ei_nb.cli import main
    probs = _valid(24)
    write_records(tmp_path / 'p.jsonl', probs, 'problem')
    few = {r['name']: r for r in map(json.loads, open(shared_data('minif2f_valid_few_shot_dsp15.jsonl'),
                                                      encoding='utf-8'))}
    samples = [{'name': p['name'], 'sample_idx': 0, 'round': 0, 'n_tokens': 1, 'capped': False,
                'completion': f"```lean4\n{p['header']}{p['formal_statement']}\n  norm_num\n```"} for p in probs]
    write_records(tmp_path / 's.jsonl', samples, 'sample')
    rc = main(['verify', '--problems', str(tmp_path / 'p.jsonl'), '--samples', str(tmp_path / 's.jsonl'),
               '--out', str(tmp_path / 'v.jsonl'),
               '--backend', 'repl', '--project', str(tmp_path), '--workers', '2', '--timeout', '10', '--no-replay',
               '--repl-cmd', f'{sys.executable} {ROOT / "tests" / "fake_repl.py"} --die-after 1'])
    err = capsys.readouterr().err
    assert rc == 3 and 'ended in `error`' in err and 'crashed' in err and 'the Lean process dies' in err, err[-2000:]
    assert not (tmp_path / 'v.jsonl').exists()                      # nothing scored


def test_a_401_from_the_checking_server_stops_ei_confirm_run_at_once(canned, tmp_path):
    from ei_nb import confirm as cf
    from ei_nb.tiny import build_tiny_model
    m, b = build_tiny_model(tmp_path / 'm', seed=1), build_tiny_model(tmp_path / 'b', seed=2)
    sub = tmp_path / 'test.jsonl'
    write_records(sub, cf.load_test_problems()[0][:24], 'problem')
    with checker('401') as (url, h):
        cf.register(tmp_path / 'run', model=m, baseline_model=b, n=1, max_new_tokens=16, problems=sub, runner='ei_nb.eval:eval_arm',
                    sampler={'sampler': 'served', 'serve': SERVE, 'prompt_style': 'completion', 'chunk_problems': 8},
                    verifier={'verify_backend': 'server', 'endpoints': [url]})
        with pytest.raises(StageFailed, match='HTTP 401') as e: cf.run_confirmation(tmp_path / 'run', report=False)
        # stopped with the checks in flight, not after every proof
        assert len(h.seen) < 8
    assert 'EI_LEAN_SERVER_KEY' in str(e.value)
    # its server stopped
    assert (tmp_path / 'run' / 'confirm' / 'logs' / 'vllm_model.log').read_text().count('stopped (terminated)') == 1
    assert not (tmp_path / 'run' / 'confirm' / 'lock.json').exists()


# ------------------------------------------------------------ issue 34, point 3: a timeout fails the proof, not the run
def _verify_args(tmp_path, probs, *backend):
    write_records(tmp_path / 'p.jsonl', probs, 'problem')
    samples = [{'name': p['name'], 'sample_idx': 0, 'round': 0, 'n_tokens': 1, 'capped': False,
                'completion': f"```lean4\n{p['header']}{p['formal_statement']}\n  norm_num\n```"} for p in probs]
    write_records(tmp_path / 's.jsonl', samples, 'sample')
    return ['verify', '--problems', str(tmp_path / 'p.jsonl'), '--samples', str(tmp_path / 's.jsonl'),
            '--out', str(tmp_path / 'v.jsonl'), '--workers', '2', *backend]


def test_ei_verify_finishes_when_the_repl_hangs_on_half_the_proofs(tmp_path, capsys):
    from ei_nb.cli import main
    probs = _valid(24)
    slow = [p['name'] for p in probs if hangs(f"#print axioms _root_.{p['name']}")]
    assert 6 <= len(slow) <= 18
    pattern = r'#print axioms _root_\.(' + '|'.join(map(re.escape, slow)) + r')(?!\S)'
    rc = main(_verify_args(tmp_path, probs, '--backend', 'repl', '--project', str(tmp_path), '--timeout', '1',
                           '--repl-cmd',
                           f'{sys.executable} {ROOT / "tests" / "fake_repl.py"} --hang-on {shlex.quote(pattern)}',
                           # the sandbox: default
                           '--replay-cmd', f'{sys.executable} {ROOT / "tests" / "fake_replay.py"}'))
    out = capsys.readouterr().out
    assert rc == 0, out[-2000:]
    v = {r['name']: r for r in read_verdicts(tmp_path / 'v.jsonl')}
    assert {n for n, r in v.items() if r['verdict'] == 'fail'} == set(slow)
    assert all(v[n]['reason'] == 'timeout: no reply within 1 s' for n in slow)
    assert all(r['verdict'] == 'pass' for n, r in v.items() if n not in slow)
    assert json.loads(out.strip().splitlines()[-1])['limits'] == {'timeout': len(slow)}     # the counts of each reason


def test_a_stage_finishes_when_the_server_times_out_on_half_the_proofs(canned, tiny_model_dir, tmp_path):
    from ei_nb.eval import eval_cli
    from ei_nb.sample_job import SamplerSetup, sampler_options_of
    from ei_nb.samplers import SampleParams
    from ei_nb.verify import VerifierSettings
    from ei_nb.sample_verify import run_sample_verify
    probs = _valid(32)
    write_records(tmp_path / 'problems.jsonl', probs, 'problem')
    slow = {p['name'] for p in probs if hangs(f"#print axioms _root_.{p['name']}")}
    setup = SamplerSetup('served', sampler_options_of('served', serve=SERVE, serve_log=tmp_path / 'vllm.log'),
                         'completion', 8, 0.5)
    with checker('half') as (url, h):
        # a checking server hands over no environment: its passes are unreplayed, scored only when allowed (issue 36)
        r = eval_cli(_eval_args(tmp_path / 'problems.jsonl', tiny_model_dir, tmp_path / 'eval', url)
                     + ['--allow-unreplayed'])                                                         # `ei eval`
        st = run_sample_verify(tmp_path / 'problems.jsonl', tiny_model_dir, tmp_path / 'round', 1,
                               SampleParams(n=1, max_new_tokens=16),
                               VerifierSettings(backend='server', endpoints=[url], workers=4), setup,
                               log=lambda *a: None)                                               # the round's stage 01
    v = {x['name']: x for x in read_verdicts(tmp_path / 'eval' / 'eval_verdicts.jsonl')}
    assert r['verdict_counts'] == {'pass': 32 - len(slow), 'fail': len(slow)}               # exit 0: no StageFailed
    assert {n for n, x in v.items() if x['verdict'] == 'fail'} == slow
    assert all(v[n]['reason'].startswith('timeout: server: Lean REPL command timed out') for n in slow)
    assert st['verdict_counts'] == {'pass': 32 - len(slow), 'fail': len(slow)}
    assert st['limit_counts'] == {'timeout': len(slow)}            # what stage.json's detail counts


def test_a_checker_that_times_out_on_every_proof_and_on_a_known_one_is_an_error(tmp_path, capsys):
    from ei_nb.cli import main
    with checker('proofs_time_out') as (url, h):
        rc = main(_verify_args(tmp_path, _valid(24), '--backend', 'server', '--endpoint', url, '--timeout', '5'))
        known = [c for b in h.seen for c in b['codes'] if 'ei_known_proof' in c['proof']]
    err = capsys.readouterr().err
    assert rc == 3 and 'ended in `error`' in err and 'and so did a known proof' in err, err[-2000:]
    assert 'raise it, or lower verify.workers' in err and known                  # the known proof was tried
    assert not (tmp_path / 'v.jsonl').exists()

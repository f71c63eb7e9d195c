"""Issue 27, part 1, end to end: `ei run --config configs/demo_served.toml` — the CPU demo's two rounds, every sampling stage
starting its own `vllm serve` for its round's model folder (the stand-in tests/fake_vllm.py, written from vLLM 0.34.0's
command line and OpenAI protocol, sampling from the tiny model) and stopping it. Then, on copies of that run: SIGTERM of
`ei run` while a server runs, a server that dies twice (the stage fails, exit 3, naming the log), and a server killed once
mid-stage (one chunk redone, the files equal to the uninterrupted run's). No process of any server is left behind.
The stand-in logs every start (argv, flags, its pid and its engine's) and every request to FAKE_VLLM_LOG."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest
from ei_nb.layout import portable
from tests.driver_common import ENTRY, ENV, copy_run, tagged, _records

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO/'configs'/'demo_served.toml'
SAMPLING = [(0, '01_sample_verify'), (0, '04_eval'), (1, '01_sample_verify'), (1, '04_eval'), (2, '01_sample_verify'), (2, '04_eval')]


def run_cmd(run_dir, *args):
    return [sys.executable, '-c', ENTRY, 'run', '--config', str(CONFIG), '--run-dir', str(run_dir), *args]

def env_with(log, **extra):
    return {**ENV, 'PYTHONPATH': str(REPO), 'FAKE_VLLM_LOG': str(log), **{k: str(v) for k, v in extra.items()}}

def events(log, kind) -> list[dict]:
    p = Path(log)
    return [r for r in map(json.loads, p.read_text().splitlines()) if r['event'] == kind] if p.exists() else []

def alive(pid) -> bool:
    try: return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except (OSError, IndexError): return False

def none_left(log, within=30.0) -> bool:
    "No server process and no engine process of any start in `log` is alive (after at most `within` s)."
    pids = [p for r in events(log, 'start') for p in (r['pid'], r['engine_pid'])]
    end = time.monotonic() + within
    while any(map(alive, pids)):
        if time.monotonic() > end: return False
        time.sleep(0.2)
    return True

def stage_json(run_dir, rnd, stage) -> dict:
    return json.loads((Path(run_dir)/f'round_{rnd:02d}'/'stages'/f'{stage}.json').read_text())


@pytest.fixture(scope='module')
def served_run(tmp_path_factory):
    "The whole demo_served run, once: its folder and the stand-in's log."
    d = tmp_path_factory.mktemp('served')
    run_dir, log = d/'run', d/'fake_vllm.jsonl'
    t0 = time.monotonic()
    r = subprocess.run(run_cmd(run_dir), capture_output=True, text=True, env=env_with(log), timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    print(f'demo_served: {time.monotonic() - t0:.0f} s')
    return run_dir, log


def test_each_sampling_stage_starts_and_stops_its_own_server_for_its_model(served_run):
    run_dir, log = served_run
    summary = json.loads((run_dir/'run_summary.json').read_text())
    assert summary['rounds'] == 2 and len(summary['scores']) == 2
    model = {0: run_dir/'demo'/'model', 1: run_dir/'round_01'/'model', 2: run_dir/'round_02'/'model'}
    expected = {(r, s): model[r if s == '04_eval' else r - 1 if r else 0] for r, s in SAMPLING}   # 01 samples the round's input
    starts = events(log, 'start')
    served = []
    for (r, s), want in expected.items():
        head = stage_json(run_dir, r, s)
        generated = head['headline'].get('n_generated', head['headline'].get('n_samples'))
        server_log = run_dir/f'round_{r:02d}'/'logs'/f'vllm_{s}.log'
        if r == 1 and s == '01_sample_verify':       # round 1 reuses round 0's pool measurement: nothing to generate, no server
            assert generated == 0 and not server_log.exists() and head['detail']['server']['command'] is None
            continue
        text = server_log.read_text()
        assert text.count('# ei: ') == 2 and 'stopped (terminated)' in text          # started once, stopped once
        served.append(str(want))
        detail = head['detail']
        assert f'serve {portable(str(want), run_dir)} ' in detail['server']['command']   # the trail's own path form and '--generation-config vllm' in detail['server']['command']
        assert detail['server']['restarts'] == 0 and detail['sampling']['top_k'] == 0 and detail['sampling']['sampler'] == 'served'
    assert sorted(s['flags']['model_tag'] for s in starts) == sorted(served)     # one server per sampling stage, the right folder
    assert all(s['flags']['generation_config'] == 'vllm' for s in starts)
    assert none_left(log, within=0)
    assert tagged(run_dir) == []


def test_sigterm_of_ei_run_leaves_no_server(served_run, tmp_path):
    run_dir, log = copy_run(served_run[0], tmp_path/'run'), tmp_path/'fake.jsonl'
    proc = subprocess.Popen(run_cmd(run_dir, '--redo', '2:04_eval', '--until', '2:04_eval'), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env_with(log, FAKE_VLLM_START_DELAY=3))
    try:
        end = time.monotonic() + 300
        while not events(log, 'start'):                       # the stage's server is starting (it loads for 3 s)
            assert proc.poll() is None and time.monotonic() < end, proc.stderr.read()[-3000:] if proc.poll() is not None else 'no server'
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None: proc.kill()
    assert proc.returncode != 0 and 'interrupted' in err, err[-2000:]
    assert none_left(log) and tagged(run_dir) == []


def test_a_server_that_dies_twice_fails_the_stage_naming_its_log(served_run, tmp_path):
    run_dir, log = copy_run(served_run[0], tmp_path/'run'), tmp_path/'fake.jsonl'
    r = subprocess.run(run_cmd(run_dir, '--redo', '2:04_eval', '--until', '2:04_eval'), capture_output=True, text=True,
                       env=env_with(log, FAKE_VLLM_DIE_AFTER=0), timeout=900)
    assert r.returncode == 3, r.stderr[-3000:]
    assert 'died again' in r.stderr and str(run_dir/'round_02'/'logs'/'vllm_04_eval.log') in r.stderr
    assert len(events(log, 'start')) == 2 and none_left(log) and tagged(run_dir) == []


def test_a_server_killed_mid_stage_costs_one_chunk_and_the_files_equal_the_uninterrupted_run(served_run, tmp_path):
    from ei_nb.core import read_problems
    from ei_nb.samplers import derive_seed
    run_dir, log = copy_run(served_run[0], tmp_path/'run'), tmp_path/'fake.jsonl'
    r = subprocess.run(run_cmd(run_dir, '--redo', '2:04_eval', '--until', '2:04_eval'), capture_output=True, text=True,
                       env=env_with(log, FAKE_VLLM_DIE_AFTER=5, FAKE_VLLM_DIE_ONCE=tmp_path/'died'), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]          # the server dies on the 6th prompt: in the second chunk of 4
    assert len(events(log, 'start')) == 2 and stage_json(run_dir, 2, '04_eval')['detail']['server']['restarts'] == 1
    seeds = [q['body']['seed'] for q in events(log, 'request') if q['path'] == '/v1/completions']
    names = [p['name'] for p in read_problems(run_dir/'inputs'/'scored.jsonl')]
    first, second = [derive_seed(1234, n) for n in names[:4]], [derive_seed(1234, n) for n in names[4:8]]
    assert all(seeds.count(s) == 1 for s in first)                          # the finished chunk was not asked again
    assert all(seeds.count(s) >= 1 for s in second) and sum(seeds.count(s) for s in second) > 4   # the lost one was
    for f in ('eval_samples.jsonl', 'eval_verdicts.jsonl'):
        assert _records(run_dir/'round_02'/'eval'/f) == _records(served_run[0]/'round_02'/'eval'/f), f
    assert none_left(log)

"""bench/gpu_smoke.sh (issue 34): without CUDA it runs nothing and exits 2, so a GPU check that could not run never
reads as passed; asked to rehearse on the CPU (--cpu, EI_SMOKE_CPU=1) it runs every step."""
import os, subprocess
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / 'bench' / 'gpu_smoke.sh'


def _cuda() -> bool:
    try: import torch
    except ImportError: return False
    return torch.cuda.is_available()


def smoke(*args, **env):
    e = {k: v for k, v in os.environ.items() if k != 'EI_SMOKE_CPU'} | {'OMP_NUM_THREADS': '1', **env}
    return subprocess.run(['bash', str(SMOKE), *args], capture_output=True, text=True, env=e, timeout=900)


@pytest.mark.skipif(_cuda(), reason='this machine has CUDA: the smoke check would run')
def test_without_cuda_it_runs_nothing_and_exits_2():
    r = smoke()
    assert r.returncode == 2, r.stdout + r.stderr
    assert 'nothing was run' in r.stderr and '--cpu' in r.stderr and 'PASS' not in r.stdout


def test_asked_to_rehearse_on_the_cpu_it_runs_every_step(tmp_path):
    r = smoke('--cpu', str(tmp_path / 'work'))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert 'CPU rehearsal' in r.stdout
    for step in ('sample', 'train', 'export', 'average'):
        assert any(l.startswith(step) and ' PASS ' in l for l in r.stdout.splitlines()), step

import os
os.environ.setdefault('OMP_NUM_THREADS', '1')   # faster and deterministic on 2 cores
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')
import shutil
from pathlib import Path
import pytest


@pytest.fixture(scope='session')
def tiny_model_dir(tmp_path_factory) -> Path:
    "A tiny random Qwen3 model + tokenizer saved once per test session (read-only for tests: copy it to modify)."
    from ei_nb.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp('tiny') / 'model', seed=0)


LONG_FILES = ('test_science_learning.py', 'test_served_run.py', 'test_driver_resume.py', 'test_driver.py',
              'test_verify_ray.py')   # each builds its own runs: parallel workers start them first

def pytest_collection_modifyitems(config, items):
    "The long files first (tests/run.sh keeps this order across workers); say visibly which tests need a real `lean`."
    items.sort(key=lambda item: LONG_FILES.index(item.path.name) if item.path.name in LONG_FILES else len(LONG_FILES))
    if shutil.which('lean'): return
    for item in items:
        if 'lean' in item.keywords:
            item.add_marker(pytest.mark.skip(reason='needs a real `lean` on PATH (Lean cannot be installed on this machine)'))


@pytest.fixture(scope='session')
def tiny_tokenizer(tiny_model_dir):
    "The tiny model's tokenizer, loaded once per test session."
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model_dir)

"The audit trail: stage notebooks are tagged so that their rendered pages show the stage, not the library."
import copy, json
from pathlib import Path
import pytest
from ei_nb.trail import LIBRARY_TAG, library_cells, runner_index, tag_library_cells

NBS = Path(__file__).resolve().parents[1] / 'nbs'
RUN_BY_PAPERMILL = sorted(p for p in NBS.glob('*.ipynb') if p.stem != 'confirm_report' and any(
    'parameters' in c.get('metadata', {}).get('tags', []) for c in json.loads(p.read_text(encoding='utf-8'))['cells']))


def test_every_stage_notebook_is_found():
    assert {'00_select', '01_sample_verify', '02_sft', '03_average', '04_eval', '05_stop_rule', '06_report', 'demo'} \
        <= {p.stem for p in RUN_BY_PAPERMILL}


@pytest.mark.parametrize('path', RUN_BY_PAPERMILL, ids=lambda p: p.stem)
def test_library_cells_are_tagged_and_nothing_else(path):
    "A new library cell without the tag, or a runner cell with it, would put code on (or take results off) the audit page."
    nb = json.loads(path.read_text(encoding='utf-8'))
    assert runner_index(nb) is not None, f'{path.name}: no "## Run the stage" heading'
    tagged = [i for i, c in enumerate(nb['cells']) if LIBRARY_TAG in c.get('metadata', {}).get('tags', [])]
    assert tagged == library_cells(nb), f'{path.name}: run ei_nb.trail.tag_library_cells on it'
    assert tag_library_cells(copy.deepcopy(nb)) == 0
    params = next(i for i, c in enumerate(nb['cells']) if 'parameters' in c.get('metadata', {}).get('tags', []))
    assert params > runner_index(nb), f'{path.name}: the parameters cell must be in the runner section'


def test_the_example_run_renders_as_a_readable_trail(tmp_path):
    "The committed demo run renders: every stage page opens with its summary, figures are images, index links resolve."
    import re, shutil, subprocess, sys
    run = tmp_path / 'run'
    shutil.copytree(Path(__file__).resolve().parents[1] / 'runs' / 'demo-example', run)
    res = subprocess.run([sys.executable, '-c', 'import sys; from ei_nb.cli import _entry; sys.argv[0] = "ei"; _entry()',
                          'report', 'html', '--run-dir', str(run)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1])['pages'] == 18
    index = (run / 'index.html').read_text(encoding='utf-8')
    hrefs = re.findall(r'href="([^"]+)"', index)
    assert len(hrefs) == 18 and all((run / h).is_file() for h in hrefs)
    for page in sorted(run.rglob('*.html')):
        if page.name == 'index.html': continue
        text = page.read_text(encoding='utf-8')
        first = re.search(r'<h[1-6][^>]*>(.*?)</h', text, re.S).group(1)
        assert first.startswith('Summary of'), f'{page}: starts with {first[:60]!r}'
        assert '&lt;Figure size' not in text and '<Figure size' not in text, f'{page}: a figure shown as text'
        for link in re.findall(r'<a href="([^"#:]+)"', text):
            assert (page.parent / link).exists(), f'{page}: broken link {link}'

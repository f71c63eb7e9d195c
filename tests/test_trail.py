"The audit trail: stage notebooks are tagged so that their rendered pages show the stage, not the library."
import copy, json, os, re
from pathlib import Path
import pytest
from ei_nb.audit_html import LIBRARY_TAG, library_cells, runner_index, tag_library_cells

NBS = Path(__file__).resolve().parents[1] / 'nbs'
RUN_BY_PAPERMILL = sorted(p for p in NBS.rglob('*.ipynb') if p.stem != 'confirm_report' and any(
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
    assert tagged == library_cells(nb), f'{path.name}: run ei_nb.audit_html.tag_library_cells on it'
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


# -- what the pages and the records of the committed example run must not show -----------------------------
EXAMPLE_RUN = Path(os.environ.get('EI_EXAMPLE_RUN') or Path(__file__).resolve().parents[1] / 'runs' / 'demo-example')   # another finished run to check
RECORDS = sorted(EXAMPLE_RUN.rglob('*.ipynb'))
STRAY = ('<Figure size', '<IPython.core.display', '<function ', '<matplotlib.', 'TqdmWarning', 'it/s]')


def _outputs(nb, library:bool|None=None):
    "(cell, output) pairs; library=True/False keeps only library / runner cells."
    for c in nb['cells']:
        if library is not None and (LIBRARY_TAG in c.get('metadata', {}).get('tags', [])) != library: continue
        for o in c.get('outputs', []): yield c, o


def _text(o) -> str:
    if o.get('output_type') == 'stream': return ''.join(o['text'])
    d = o.get('data', {})
    return '' if set(d) - {'text/plain'} else ''.join(d.get('text/plain', ''))   # a richer type is what a reader sees


def test_the_example_run_has_records():
    assert len(RECORDS) == 18, [p.relative_to(EXAMPLE_RUN) for p in RECORDS]


@pytest.mark.parametrize('path', RECORDS, ids=lambda p: str(p.relative_to(EXAMPLE_RUN)))
def test_records_are_clean(path):
    "A record shows no figure or object as text, no progress bar or tqdm warning, and no second copy of its input."
    nb = json.loads(path.read_text(encoding='utf-8'))
    for c, o in _outputs(nb):
        t = _text(o)
        bad = [s for s in STRAY if s in t]
        assert not bad, f'{path.name}: {bad} in the output of {"".join(c["source"])[:80]!r}'
    pm = nb['metadata'].get('papermill', {})
    assert isinstance(pm.get('input_path'), (str, type(None))), f'{path.name}: papermill embeds its input notebook'


@pytest.mark.parametrize('path', RECORDS, ids=lambda p: str(p.relative_to(EXAMPLE_RUN)))
def test_example_outputs_are_labelled(path):
    "Every output of a library cell (self-tests and examples on made-up data) opens with the example-data label."
    from ei_nb.audit_html import EXAMPLE_LABEL
    nb = json.loads(path.read_text(encoding='utf-8'))
    for c in nb['cells']:
        if LIBRARY_TAG in c.get('metadata', {}).get('tags', []) and c.get('outputs'):
            first = c['outputs'][0].get('data', {}).get('text/plain', '')
            assert EXAMPLE_LABEL in ''.join(first), f'{path.name}: unlabelled example output in {"".join(c["source"])[:80]!r}'


@pytest.mark.parametrize('path', RECORDS, ids=lambda p: str(p.relative_to(EXAMPLE_RUN)))
def test_records_open_with_their_summary(path):
    from ei_nb.audit_html import SUMMARY_TAG
    nb = json.loads(path.read_text(encoding='utf-8'))
    first = nb['cells'][0]
    assert SUMMARY_TAG in first.get('metadata', {}).get('tags', []) and ''.join(first['source']).startswith('## Summary of')


@pytest.mark.parametrize('path', RECORDS, ids=lambda p: str(p.relative_to(EXAMPLE_RUN)))
def test_records_collapse_library_cells_and_tabulate_numbers(path):
    "In JupyterLab the summary comes before the stage's own cells (the library is collapsed); other numbers are a table."
    from ei_nb.audit_html import SUMMARY_TAG
    nb = json.loads(path.read_text(encoding='utf-8'))
    for c in nb['cells']:
        hidden = c.get('metadata', {}).get('jupyter', {})
        want = {'source_hidden': True, 'outputs_hidden': True} if LIBRARY_TAG in c['metadata'].get('tags', []) else {}
        assert hidden == want, f'{path.name}: {"".join(c["source"])[:60]!r} collapsed {hidden}'
    summary = ''.join(nb['cells'][0]['source'])
    if '### Other numbers' in summary:
        assert summary.split('### Other numbers\n\n')[1].startswith('| | |\n|---|---|\n'), f'{path.name}: other numbers not a table'


def test_the_example_run_names_no_folder_of_the_machine_it_ran_on():
    "Every path the committed run's files give is relative to the run folder: the folder it ran in appears nowhere."
    files = [p for p in sorted(EXAMPLE_RUN.rglob('*')) if p.is_file() and p.suffix in ('.json', '.done', '.ipynb', '.md')]
    assert len(files) > 50
    leaks = [str(p.relative_to(EXAMPLE_RUN)) for p in files if re.search(r'/tmp/|/work/|/home/|/root/', p.read_text(encoding='utf-8'))]
    assert leaks == [], leaks


def test_pages_show_every_figure_as_an_image_and_no_example_data(tmp_path):
    "Rendered pages: each PNG output of the shown cells is an <img>; no library output (example data) is on a page."
    import re, shutil
    import nbformat
    from ei_nb.layout import RunLayout
    from ei_nb.audit_html import EXAMPLE_LABEL, latest_figures, render_run, run_pages
    run = tmp_path / 'run'
    shutil.copytree(EXAMPLE_RUN, run)
    index = render_run(run)
    assert index.read_text(encoding='utf-8').count('<img ') == len(list(latest_figures(RunLayout(run)).glob('*.png'))) > 0
    for p in run_pages(run):
        text = p['page'].read_text(encoding='utf-8')
        nb = nbformat.read(p['notebook'], as_version=4)
        pngs = sum('image/png' in o.get('data', {}) for _, o in _outputs(nb, library=False))
        assert len(re.findall(r'<img[^>]+src="data:image/png;base64,', text)) == pngs, p['page']
        assert EXAMPLE_LABEL not in text, f"{p['page']}: a library output is on the page"
        assert not [s for s in STRAY if html_escape(s) in text], p['page']


def html_escape(s:str) -> str:
    import html
    return html.escape(s, quote=False)

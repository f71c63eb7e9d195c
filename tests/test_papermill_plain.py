"Every stage notebook runs under plain papermill (no -k: the notebook's own kernelspec) and documents its parameters."
import ast, io, json, subprocess, sys, tokenize
from pathlib import Path
import pytest

NBS = Path(__file__).resolve().parents[1] / 'nbs'


def _parameters_cell(path: Path) -> str|None:
    nb = json.loads(path.read_text(encoding='utf-8'))
    return next((''.join(c['source']) for c in nb['cells'] if 'parameters' in c.get('metadata', {}).get('tags', [])), None)


STAGES = sorted(p for p in NBS.rglob('*.ipynb') if _parameters_cell(p) is not None)   # every notebook papermill runs


def tagged_parameters(path: Path) -> dict[str, str]:
    "name -> comment of each assignment in the cell tagged `parameters`."
    src = _parameters_cell(path)
    comments = {t.start[0]: t.string.lstrip('#').strip() for t in tokenize.generate_tokens(io.StringIO(src).readline)
                if t.type == tokenize.COMMENT}
    return {(n.targets[0] if isinstance(n, ast.Assign) else n.target).id: comments.get(n.lineno, '')
            for n in ast.parse(src).body}


def test_stage_notebooks_exist():
    assert {'00_select', '01_sample_verify', '02_sft', '03_average', '04_eval', '05_stop_rule', '06_report'} <= {p.stem for p in STAGES}


@pytest.mark.parametrize('nb', STAGES, ids=lambda p: p.stem)
def test_kernelspec_is_python3(nb):
    assert json.loads(nb.read_text(encoding='utf-8'))['metadata']['kernelspec']['name'] == 'python3'


@pytest.mark.parametrize('nb', STAGES, ids=lambda p: p.stem)
def test_help_notebook_lists_every_parameter_with_its_comment(nb):
    from click.testing import CliRunner
    from papermill.cli import papermill
    res = CliRunner().invoke(papermill, ['--help-notebook', str(nb)])   # the `papermill` command, in this process
    assert res.exit_code == 0, res.output
    params = tagged_parameters(nb)
    assert params, 'no parameters cell'
    for name, comment in params.items():
        assert f'  {name}:' in res.output, f'{nb.name}: papermill --help-notebook does not list {name!r}'
        assert comment, f'{nb.name}: parameter {name!r} has no comment'
        words = ' '.join(res.output.split())
        assert ' '.join(comment.split()) in words, f'{nb.name}: the help of {name!r} lacks its comment {comment!r}'


@pytest.mark.slow
@pytest.mark.parametrize('nb', STAGES, ids=lambda p: p.stem)
def test_plain_papermill_runs_the_stage_on_its_defaults(nb, tmp_path):
    out = tmp_path / nb.name
    res = subprocess.run([sys.executable, '-m', 'papermill', str(nb), str(out), '--cwd', str(NBS), '--log-level', 'ERROR'],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    executed = json.loads(out.read_text(encoding='utf-8'))
    assert executed['metadata']['papermill']['exception'] in (False, None)


@pytest.mark.parametrize('nb', sorted(NBS.rglob('*.ipynb')), ids=lambda p: p.stem)
def test_every_notebook_names_its_kernel(nb):
    "Any notebook may be run alone with plain `papermill NB OUT`, which needs the notebook's own kernelspec."
    assert json.loads(nb.read_text(encoding='utf-8'))['metadata'].get('kernelspec', {}).get('name') == 'python3', nb.name

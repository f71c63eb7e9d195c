"""One home per key (issue 33): a stage's defaults live in its notebook's `parameters` cell, and its runner, its CLI
and `ei_nb.params_check` agree with it; a stage runner takes at most 12 parameters (objects, not loose keys)."""
import ast, inspect, json, re
from pathlib import Path
import pytest
from ei_nb.cli import stage_defaults
from ei_nb.config import flat_parameters, load_config, notebook_parameters, validate_config, WIRED
from ei_nb.core import BadInput

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(p.stem for p in (ROOT/'nbs').glob('0*.ipynb'))
MAX_PARAMS = 12


def _cells(stage):
    return json.loads((ROOT/'nbs'/f'{stage}.ipynb').read_text())['cells']


def _module(stage):
    "The module the stage notebook exports (its `#| default_exp`)."
    for c in _cells(stage):
        if m := re.search(r'#\| default_exp (\w+)', ''.join(c['source'])): return m.group(1)


def runners(stage) -> list:
    "The functions of the stage's module that the notebook's run section (below `## Run the stage`) calls: its runners."
    import importlib
    cells, mod = _cells(stage), importlib.import_module(f'ei_nb.{_module(stage)}')
    start = next(i for i, c in enumerate(cells) if c['cell_type'] == 'markdown' and '## Run the stage' in ''.join(c['source']))
    called = set()
    for c in cells[start:]:
        if c['cell_type'] != 'code': continue
        src = '\n'.join(l for l in ''.join(c['source']).splitlines() if not l.lstrip().startswith(('%', '!')))
        called |= {n.func.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return [getattr(mod, n) for n in sorted(called) if inspect.isfunction(getattr(mod, n, None))
            and getattr(mod, n).__module__ == mod.__name__ and n.startswith(('run_', 'average_checkpoints'))]


def test_every_stage_with_a_runner_is_found():
    "The census below must see the runners it limits (a renamed run section would otherwise pass unchecked)."
    names = {f.__name__ for s in STAGES for f in runners(s)}
    assert {'run_select', 'run_conjecture', 'run_sample_verify', 'run_correct', 'run_eval', 'average_checkpoints'} <= names


@pytest.mark.parametrize('stage', STAGES)
def test_stage_runners_take_at_most_12_parameters(stage):
    for fn in runners(stage):
        n = len(inspect.signature(fn).parameters)
        assert n <= MAX_PARAMS, f'{stage}: {fn.__name__} takes {n} parameters (at most {MAX_PARAMS}: group them in objects)'


@pytest.mark.parametrize('stage', STAGES)
def test_runner_defaults_are_the_notebook_defaults(stage):
    "A runner parameter named like a key of the parameters cell has no default of its own, or the cell's."
    cell = notebook_parameters(ROOT/'nbs'/f'{stage}.ipynb')
    flat = flat_parameters(cell, WIRED.get(stage, set()))
    for fn in runners(stage):
        for name, p in inspect.signature(fn).parameters.items():
            if p.default is inspect.Parameter.empty: continue
            for params in (cell, flat):
                if name in params:   # a tuple stands for a list default (immutable)
                    default = list(p.default) if isinstance(p.default, tuple) else p.default
                    assert default == params[name]['default'], (
                        f'{fn.__name__}({name}={p.default!r}) but nbs/{stage}.ipynb says {name} = {params[name]["default"]!r}')


def _parsed(parser, argv):
    return vars(parser.parse_args(argv))


def _eval_like(d:dict, a:dict):
    "The sampling CLIs' defaults against their notebook's cell."
    assert {k: a[k] for k in ('n', 'max_new_tokens', 'temperature', 'top_p', 'seed')} == d['sampling']
    assert (a['backend'], a['prompt_style'], a['chunk_problems'], a['max_prompt_frac']) == (
        d['sampler'], d['prompt_style'], d['chunk_problems'], d['max_prompt_frac'])
    assert (a['timeout'], a['max_error_frac'], a['round']) == (d['verify']['timeout'], d['verify']['max_error_frac'], d['round_idx'])


def test_cli_defaults_are_the_notebook_defaults():
    from ei_nb.average import average_parser
    from ei_nb.eval import eval_parser
    from ei_nb.sample_job import sample_parser
    from ei_nb.select import select_parser
    d, a = stage_defaults('04_eval'), _parsed(eval_parser(), ['--problems', 'p', '--model', 'm', '--out-dir', 'o'])
    _eval_like(d, a)
    assert (a['verify_backend'], a['allow_test_selection']) == (d['verify']['backend'], d['allow_test_selection'])
    _eval_like(stage_defaults('01_sample_verify'), _parsed(sample_parser(), ['--problems', 'p', '--model', 'm', '--out', 'o']))
    d, a = stage_defaults('00_select'), _parsed(select_parser(), ['--pool', 'p', '--results', 'r', '--out', 'o'])
    assert {k: a[k] for k in ('lo', 'hi', 'include_zero', 'max_zero', 'max_problems', 'seed')} == {
        k: d[k] for k in ('lo', 'hi', 'include_zero', 'max_zero', 'max_problems', 'seed')}
    d, a = stage_defaults('03_average'), _parsed(average_parser(), ['--anchor', 'a', '--finetuned', 'f', '--out', 'o'])
    assert (a['ft_weight'], a['threads'], a['force']) == (d['ft_weight'], d['threads'], d['force'])


def test_a_changed_cell_default_moves_the_cli_default(tmp_path, monkeypatch):
    "The CLI reads the cell (no copy of the default): edit the cell and `ei select`'s default follows."
    from ei_nb.select import select_parser
    nb = json.loads((ROOT/'nbs'/'00_select.ipynb').read_text())
    cell = next(c for c in nb['cells'] if 'parameters' in c['metadata'].get('tags', []))
    cell['source'] = [re.sub(r'^max_problems = \d+', 'max_problems = 7', l) for l in cell['source']]
    (tmp_path/'00_select.ipynb').write_text(json.dumps(nb))
    monkeypatch.setenv('EI_NBS', str(tmp_path))
    assert _parsed(select_parser(), ['--pool', 'p', '--results', 'r', '--out', 'o'])['max_problems'] == 7


@pytest.mark.parametrize('w, ok', [(0.0, True), (0.7, True), (1.0, True), (-0.1, False), (1.5, False)])
def test_ft_weight_has_one_range(w, ok, tmp_path):
    "`ft_weight` in [0, 1] for the config (`params_check`), `ei average` and the library (`_check_args`): 0 keeps the anchor."
    import argparse
    from ei_nb.average import _check_args, average_parser
    from ei_nb.params_check import rule_for
    assert rule_for('average', 'ft_weight').ok(w) == ok
    cfg = load_config(ROOT/'configs'/'demo.toml', [f'average.ft_weight={w}'], warn=lambda *a: None)
    if ok: validate_config(cfg, check_paths=False)
    else:
        with pytest.raises(BadInput, match=r'ft_weight = .*\[0, 1\]'): validate_config(cfg, check_paths=False)
    parse = lambda: average_parser().parse_args(['--anchor', 'a', '--finetuned', 'f', '--out', 'o', '--ft-weight', str(w)])
    if ok: assert parse().ft_weight == w
    else:
        with pytest.raises(SystemExit): parse()
    if ok: assert _check_args(w, 4 << 20, 1, False)[0] == w
    else:
        with pytest.raises(BadInput, match=r'\[0, 1\]'): _check_args(w, 4 << 20, 1, False)


def test_parameter_objects_refuse_unknown_keys():
    "The objects a stage builds from its injected dicts name a misspelt key."
    from ei_nb.correct import CorrectionRules
    from ei_nb.conjecture import ConjectureRules
    from ei_nb.samplers import SampleParams
    from ei_nb.verify import VerifierSettings
    with pytest.raises(BadInput, match="unknown key 'temprature'"): SampleParams.from_dict({'n': 2, 'temprature': 1.0})
    with pytest.raises(BadInput, match="unknown setting 'lean_project'"): VerifierSettings.from_params({'lean_project': ''})
    with pytest.raises(BadInput, match="unknown key 'max_per_problems'"): CorrectionRules.from_dict({'max_per_problems': 1})
    with pytest.raises(BadInput, match="unknown key 'n_prompt'"): ConjectureRules.from_dict({'n_prompt': 1})
    d = stage_defaults('00b_conjecture')   # the cell's groups build the objects as they are
    assert ConjectureRules.from_dict(d['conjecture']).n_prompts == d['conjecture']['n_prompts']
    assert SampleParams.from_dict(d['sampling']).max_new_tokens == d['sampling']['max_new_tokens']


@pytest.mark.parametrize('config', sorted(p.name for p in (ROOT/'configs').glob('*.toml')))
def test_every_config_loads_and_its_keys_reach_the_groups(config):
    "The TOML keys stay flat; every config loads, validates, and its [eval]/[sample_verify] keys land in `sampling`."
    from ei_nb.sources import Sources
    cfg = validate_config(load_config(ROOT/'configs'/config, warn=lambda *a: None), check_paths=False)
    raw = __import__('tomllib').loads((ROOT/'configs'/config).read_text())
    src = Sources(cfg, '/tmp/ei-one-home-run')
    for stage, section in (('04_eval', 'eval'), ('01_sample_verify', 'sample_verify')):
        p = src.grouped(stage)
        assert 'n' not in p and set(p['sampling']) == {'n', 'max_new_tokens', 'temperature', 'top_p', 'seed'}
        for k, v in raw.get(section, {}).items():
            if k in p['sampling']: assert p['sampling'][k] == v, (section, k)

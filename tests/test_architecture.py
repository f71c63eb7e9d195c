"""The package's rooms stay walkable: every module sits in one room of the map below and imports only from its own
room or the rooms under it (no cycles, imports inside functions counted); no module over 600 lines, no function over
50, no line over 120 characters, no stage runner over 12 parameters, no `@patch` onto a class the package defines,
and the package's own modules are imported at the top of a module except the few named in `LAZY`."""
import ast, graphlib
from pathlib import Path
import pytest

PKG = Path(__file__).resolve().parents[1]/'ei_nb'
MODULES = {p.stem: p for p in sorted(PKG.glob('*.py')) if p.stem not in ('__init__', '_modidx')}
MAX_MODULE, MAX_FUNCTION, MAX_LINE, MAX_RUNNER_PARAMS = 600, 50, 120, 12

# The map of CONTRIBUTING.md, bottom up: a module may import its own room and the rooms listed before it.
ROOMS = {
    'records':  'core lean_lex cli params_check layout prompts tiny rows ckernel jsonl_scan frames near_dup',
    'verifier': 'lean_tokens lean_commands policy_rules policy lean_reply sandbox lean_backends lean_replay verifier known_proofs doctor_probes '
                'verify lean_ray',
    'sampling': 'samplers vllm_server remote_samplers sample_job',
    'stages':   'train dpo average_io average sft select eval sample_verify correct conjecture sharpen stop_rule report',
    'tools':    'arith demo pool setup_lean confirm_inputs confirm audit_html',
    'run':      'config eta sources markers stage_process inputs step dryrun doctor_checks doctor_node doctor '
                'driver sweep '
                'run_command',
}
ROOM_OF = {m: r for r, ms in ROOMS.items() for m in ms.split()}
RANK = {r: i for i, r in enumerate(ROOMS)}
# Package modules that may be imported inside a function, and why (everything else is imported at the top).
LAZY = {'audit_html': 'imports nbformat at import time (about 1 s), which only `ei report` and the run need',
        # `eval` is imported by `ei select` and `ei stats`, which check no proof: the verifier stack (0.3 s) waits
        'sample_job': 'the sampling and verifying stack, for `eval` (see above)',
        'verify': 'the verifier settings and back-ends, for `eval` (see above)',
        'lean_reply': "the replay verdict's check, for `eval` (see above)"}


def imported_modules(path:Path) -> set:
    "The `ei_nb` modules that `path` imports anywhere (top level or inside a function)."
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:            # from .x import y, from . import x
            out |= {node.module.split('.')[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == 'ei_nb':  # from ei_nb import x
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith('ei_nb.'):
            out.add(node.module.split('.')[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split('.')[1] for a in node.names if a.name.startswith('ei_nb.')}
    return (out & set(MODULES)) - {path.stem}


def import_graph() -> dict: return {m: imported_modules(p) for m, p in MODULES.items()}


def test_the_import_graph_has_no_cycle():
    try: order = list(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as e: pytest.fail(f'import cycle: {" -> ".join(e.args[1])}')
    assert set(order) == set(MODULES)


def test_a_cycle_hidden_in_a_function_would_be_found(tmp_path):
    "The check itself: `core` importing `layout` inside a function (layout imports core) is a cycle."
    hidden = tmp_path/'core.py'
    hidden.write_text(MODULES['core'].read_text() + '\ndef _late():\n    from .layout import RunLayout\n    from ei_nb import cli\n')
    assert imported_modules(hidden) >= {'layout', 'cli'}
    g = import_graph(); assert 'core' in g['layout']
    with pytest.raises(graphlib.CycleError): list(graphlib.TopologicalSorter({**g, 'core': imported_modules(hidden)}).static_order())


@pytest.mark.parametrize('name', sorted(MODULES))
def test_module_and_function_sizes(name):
    text = MODULES[name].read_text()
    assert len(text.splitlines()) <= MAX_MODULE, f'ei_nb/{name}.py has {len(text.splitlines())} lines (at most {MAX_MODULE}): split it'
    long = [f'{n.name} ({n.end_lineno - n.lineno + 1} lines)' for n in ast.walk(ast.parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION]
    assert not long, f'ei_nb/{name}.py: functions over {MAX_FUNCTION} lines: {", ".join(long)}'


def test_no_patch_onto_the_package_own_classes():
    own = {n.name for p in MODULES.values() for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)}
    patched = []
    for name, p in MODULES.items():
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.FunctionDef) and any(getattr(d, 'id', None) == 'patch' for d in n.decorator_list):
                ann = n.args.args[0].annotation if n.args.args else None
                if getattr(ann, 'id', None) in own: patched.append(f'{name}.{n.name} onto {ann.id}')
    assert not patched, f'@patch onto a class ei_nb defines (make it a method): {patched}'


def test_every_module_has_a_room():
    assert not (unplaced := sorted(set(MODULES) - set(ROOM_OF))), f'modules in no room of ROOMS (add them to the map): {unplaced}'
    assert not (gone := sorted(set(ROOM_OF) - set(MODULES))), f'ROOMS names modules that do not exist: {gone}'


def upward_imports(graph:dict) -> list:
    "`a -> b (room a -> room b)` for each import of a module from a room above its own."
    return [f'{a} -> {b} ({ROOM_OF[a]} -> {ROOM_OF[b]})' for a, deps in sorted(graph.items()) for b in sorted(deps)
            if a in ROOM_OF and b in ROOM_OF and RANK[ROOM_OF[b]] > RANK[ROOM_OF[a]]]


def test_imports_only_go_down_the_rooms():
    assert not (up := upward_imports(import_graph())), f'imports into a higher room: {up}'


def test_an_upward_import_would_be_found():
    "The check itself: `report` (stages) importing `driver` (run) is flagged."
    assert upward_imports({'report': {'driver', 'core'}}) == ['report -> driver (stages -> run)']


def local_package_imports(path:Path) -> list:
    "`function: module` for each `ei_nb` module imported inside a function of `path`."
    out = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)): continue
        for n in ast.walk(fn):
            if isinstance(n, (ast.Import, ast.ImportFrom)) and n is not fn:
                out += [f'{fn.name}: {m}' for m in imported_modules_of(n)]
    return out


def imported_modules_of(node) -> set:
    "The `ei_nb` modules one import statement names."
    if isinstance(node, ast.ImportFrom) and node.level:
        return {node.module.split('.')[0]} if node.module else {a.name for a in node.names}
    if isinstance(node, ast.ImportFrom) and node.module == 'ei_nb': return {a.name for a in node.names}
    if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('ei_nb.'): return {node.module.split('.')[1]}
    if isinstance(node, ast.Import): return {a.name.split('.')[1] for a in node.names if a.name.startswith('ei_nb.')}
    return set()


@pytest.mark.parametrize('name', sorted(MODULES))
def test_package_modules_are_imported_at_the_top(name):
    bad = [i for i in local_package_imports(MODULES[name]) if i.split(': ')[1] in MODULES and i.split(': ')[1] not in LAZY]
    assert not bad, f'ei_nb/{name}.py imports package modules inside functions (move them to the top): {bad}'


@pytest.mark.parametrize('name', sorted(MODULES))
def test_lines_fit_in_120_characters(name):
    # nbdev writes `__all__` wrapped at 120 and then puts `__all__ = ` before it: that line alone may be longer
    long = [i + 1 for i, l in enumerate(MODULES[name].read_text().splitlines())
            if len(l) > MAX_LINE and not l.startswith('__all__ = ')]
    assert not long, f'ei_nb/{name}.py: {len(long)} lines over {MAX_LINE} characters (first at lines {long[:5]})'


def stage_runners() -> dict:
    "`{module.run_x: parameter count}` of the `run_*` functions of the stages room."
    out = {}
    for m in ROOMS['stages'].split():
        for n in ast.parse(MODULES[m].read_text()).body if m in MODULES else []:
            if isinstance(n, ast.FunctionDef) and n.name.startswith('run_'):
                a = n.args
                out[f'{m}.{n.name}'] = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return out


def test_stage_runners_take_at_most_12_parameters():
    runners = stage_runners()
    assert 'eval.run_eval' in runners, 'the check found no stage runner'
    assert not (big := {k: v for k, v in runners.items() if v > MAX_RUNNER_PARAMS}), \
        f'stage runners over {MAX_RUNNER_PARAMS} parameters (take SamplingParams / VerifierSettings): {big}'

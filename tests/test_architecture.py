"""The package's rooms stay walkable: imports only go downward (no cycles, imports inside functions counted),
no module over 600 lines, no function over 50, no `@patch` onto a class the package defines."""
import ast, graphlib
from pathlib import Path
import pytest

PKG = Path(__file__).resolve().parents[1]/'ei_nb'
MODULES = {p.stem: p for p in sorted(PKG.glob('*.py')) if p.stem not in ('__init__', '_modidx')}
MAX_MODULE, MAX_FUNCTION = 600, 50


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

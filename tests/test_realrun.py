"""From a bare node to a round: `ei setup-lean` (plan, idempotence, self-check through the REPL stand-in),
`ei doctor` (the demo config passes; missing pieces fail with their fix; the REPL rows against the stand-in),
`ei pool` (real statements, miniF2F removed), the `openai` sampler through the CLI and across a dying endpoint,
and the reference configs. No network, no Lean: the REPL is tests/fake_repl.py, the OpenAI server a local stand-in."""
import http.server, json, os, random, stat, subprocess, sys, threading
from pathlib import Path
import numpy as np
import pytest

from ei_nb.core import read_problems, shared_data, statement_key, StageFailed

ROOT = Path(__file__).resolve().parent.parent
FAKE_REPL = ROOT / 'tests' / 'fake_repl.py'


def ei(*args, env=None, cwd=ROOT):
    "Run `ei ARGS`; return (exit code, the JSON of the last stdout line or None, stderr)."
    e = {**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1', **(env or {})}
    r = subprocess.run([sys.executable, '-c', 'from ei_nb.cli import _entry; _entry()', *map(str, args)],
                       capture_output=True, text=True, env=e, cwd=cwd, timeout=600)
    lines = r.stdout.strip().splitlines()
    return r.returncode, (json.loads(lines[-1]) if lines else None), r.stderr


def script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# A REPL built from the tag without commit 4fc1e6d: it answers, but into a block-buffered stdout it never flushes,
# so a reader on the pipe waits forever (the bug the cherry-pick fixes).
UNFLUSHED_REPL = """import json, os, sys
sys.stdout = os.fdopen(1, 'w', buffering=1 << 16)   # block-buffered whatever PYTHONUNBUFFERED says
block = []
for line in sys.stdin:
    if line.strip(): block.append(line); continue
    if block: sys.stdout.write(json.dumps({'env': 0}) + '\\n\\n'); block = []
"""


def unflushed_repl(path: Path) -> Path:
    (path.parent / 'unflushed_repl.py').write_text(UNFLUSHED_REPL)
    return script(path, f'#!/bin/sh\nexec {sys.executable} {path.parent / "unflushed_repl.py"}\n')


# `lake env CMD...` runs CMD (what the real lake does, minus the Lean paths); `lake exe cache get` finds nothing for the fork's
# hashes (exit 1); `lake build` in a project without Mathlib.olean "builds" 3 modules with Lake's progress lines (failing
# once, halfway, when FAKE_LAKE_FAIL_ONCE names a file that does not exist yet), then writes the olean.
FAKE_LAKE = """#!/bin/sh
if [ "$1" = env ]; then shift; exec "$@"; fi
if [ "$1 $2 $3" = "exe cache get" ]; then echo "Attempting to download 4360 file(s)"; echo "No files to download"; exit 1; fi
if [ "$1" = build ] && [ -f lean-toolchain ] && [ ! -f .lake/build/lib/Mathlib.olean ]; then
  echo "[1/3] Building Mathlib.Init"
  if [ -n "$FAKE_LAKE_FAIL_ONCE" ] && [ ! -f "$FAKE_LAKE_FAIL_ONCE" ]; then touch "$FAKE_LAKE_FAIL_ONCE"; echo "error: killed"; exit 1; fi
  echo "[2/3] Building Mathlib.Logic"; echo "[3/3] Building Mathlib"
  mkdir -p .lake/build/lib && touch .lake/build/lib/Mathlib.olean; exit 0
fi
echo "fake lake $*"
"""


def git(*args, cwd):
    subprocess.run(['git', '-c', 'user.name=t', '-c', 'user.email=t@t', *args], cwd=cwd, check=True, capture_output=True)


# -- a machine where everything is already set up: fake elan + toolchain + lake, git checkouts, oleans, REPL

@pytest.fixture
def node(tmp_path):
    "ELAN_HOME with a fake elan/lake/lean and the toolchain folder, a Mathlib checkout with oleans, a built REPL."
    elan = tmp_path / 'elan'
    script(elan / 'bin' / 'elan', '#!/bin/sh\necho "fake elan $*"\n')
    # `lake env CMD...` runs CMD (what the real lake does, minus the Lean paths)
    script(elan / 'bin' / 'lake', FAKE_LAKE)
    script(elan / 'bin' / 'lean', '#!/bin/sh\necho "Lean (version 4.9.0-rc1, x86_64-unknown-linux-gnu, commit dcccfb73cb24, Release)"\n')
    (elan / 'toolchains' / 'leanprover--lean4---v4.9.0-rc1').mkdir(parents=True)
    project = tmp_path / 'lean' / 'mathlib4'
    project.mkdir(parents=True)
    (project / 'lean-toolchain').write_text('leanprover/lean4:v4.9.0-rc1\n')
    git('init', '-q', cwd=project); git('add', '-A', cwd=project); git('commit', '-q', '-m', 'mathlib', cwd=project)
    commit = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=project, capture_output=True, text=True).stdout.strip()
    (project / '.lake/build/lib').mkdir(parents=True); (project / '.lake/build/lib/Mathlib.olean').write_bytes(b'olean')
    repl = tmp_path / 'lean' / 'repl'
    (repl / 'REPL').mkdir(parents=True)
    (repl / 'REPL' / 'Main.lean').write_text('def loop := do\n  IO.println ""\n')
    git('init', '-q', cwd=repl); git('add', '-A', cwd=repl); git('commit', '-q', '-m', 'tag', cwd=repl); git('tag', 'v4.9.0-rc1', cwd=repl)
    (repl / 'REPL' / 'Main.lean').write_text('def loop := do\n  let out ← IO.getStdout\n  out.putStr "\\n"\n  out.flush\n')
    git('commit', '-q', '-am', 'flush', cwd=repl)
    script(repl / '.lake' / 'build' / 'bin' / 'repl', f'#!/bin/sh\nexec {sys.executable} {FAKE_REPL} "$@"\n')
    from ei_nb.lean_replay import REPLAY_FILES, replay_sources          # the kernel replay tool, built beside the REPL (issue 28)
    (tmp_path / 'lean' / 'ei-replay').mkdir()
    for f in REPLAY_FILES: (tmp_path / 'lean' / 'ei-replay' / f).write_bytes((replay_sources() / f).read_bytes())
    script(tmp_path / 'lean' / 'ei-replay' / '.lake' / 'build' / 'bin' / 'ei-replay', f'#!/bin/sh\nexec {sys.executable} {ROOT / "tests" / "fake_replay.py"} "$@"\n')
    env = {'ELAN_HOME': str(elan), 'PATH': f"{elan / 'bin'}{os.pathsep}{os.environ['PATH']}",
           'EI_REPL_BIN': str(repl / '.lake' / 'build' / 'bin' / 'repl'),
           'EI_SANDBOX_RO': f'{sys.prefix}:{ROOT / "tests"}'}   # the stand-ins' Python and scripts, seen by the sandbox
    tree = lambda ref: subprocess.run(['git', 'rev-parse', f'{ref}^{{tree}}'], cwd=repl, capture_output=True, text=True).stdout.strip()
    trees = (tree('v4.9.0-rc1'), tree('HEAD'))      # this stand-in REPL's tag and patched trees (the real ones: setup_lean.REPL_TREE)
    return {'elan': elan, 'project': project, 'repl': repl, 'commit': commit, 'env': env, 'trees': trees,
            'args': ('--mathlib-commit', commit, '--repl-trees', ','.join(trees))}


def test_setup_lean_dry_run_lists_every_command(tmp_path):
    rc, out, err = ei('setup-lean', '--project', tmp_path / 'lean/mathlib4', '--dry-run', env={'ELAN_HOME': str(tmp_path / 'none')})
    assert rc == 0, err
    assert out['dry_run'] and set(out['steps']) == {'elan', 'toolchain', 'mathlib', 'mathlib-cache', 'mathlib-build', 'repl', 'repl-flush',
                                                     'repl-build', 'replay-build'}
    assert 'a failure here is expected for the fork' in err and 'getRootHash' in err and 'CPU-hours' in err
    assert set(out['steps'].values()) == {'planned'}
    for cmd in ('elan toolchain install leanprover/lean4:v4.9.0-rc1', 'clone https://github.com/xinhjBrant/mathlib4',
                'checkout 2f65ba7f1a9144b20c8e7358513548e317d26de1', 'lake exe cache get', 'checkout v4.9.0-rc1',
                'cherry-pick -x 4fc1e6d1dda170e8f0a6b698dd5f7e17a9cf52b4', 'lake build', 'theorem t : 2 + 2 = 4 := by norm_num'):
        assert cmd in err, cmd
    assert not (tmp_path / 'lean').exists()   # nothing was run


def test_setup_lean_checks_and_skips_then_proves_through_the_repl(node):
    args = ('setup-lean', '--project', node['project'], *node['args'])
    for _ in range(2):   # idempotent: the second run finds the same
        rc, out, err = ei(*args, env=node['env'])
        assert rc == 0, err
        assert set(out['steps'].values()) == {'present'}, out['steps']
        assert out['selfcheck']['verdict'] == 'pass'
        assert "'t' depends on axioms: [propext, Classical.choice, Quot.sound]" == out['selfcheck']['axioms']
        assert 'REPL reply: {' in err and 'axioms:' in err
    assert out['repl_bin'] == node['env']['EI_REPL_BIN'] and out['lake'] == str(node['elan'] / 'bin' / 'lake')
    assert f"export PATH={node['elan'] / 'bin'}:$PATH" in err and 'paths.lake' in err   # what makes `lake` work in this shell


def test_setup_lean_runs_only_missing_steps(node):
    from ei_nb.setup_lean import setup_lean
    import shutil
    shutil.rmtree(node['elan'] / 'toolchains')
    ran = []
    def run(argv, cwd, env, log, step=None):   # the toolchain install, done by hand
        ran.append(argv); (node['elan'] / 'toolchains' / 'leanprover--lean4---v4.9.0-rc1').mkdir(parents=True)
    old = os.environ.get('EI_REPL_BIN')
    out = setup_lean(node['project'], elan=node['elan'], run=run, mathlib_commit=node['commit'], repl_trees=node['trees'], timeout=60, log=lambda *a: None)
    assert ran == [['elan', 'toolchain', 'install', 'leanprover/lean4:v4.9.0-rc1']]
    assert out['steps']['toolchain'] == 'done' and out['steps']['mathlib'] == 'present'
    assert setup_lean(node['project'], elan=node['elan'], run=None, mathlib_commit=node['commit'], repl_trees=node['trees'],
                      log=lambda *a: None)['steps']['toolchain'] == 'present'


def test_setup_lean_refuses_a_checkout_at_another_commit(node):
    rc, out, err = ei('setup-lean', '--project', node['project'], env=node['env'])   # the reference commit, not this one
    assert rc == 2 and out is None
    assert 'not 2f65ba7f1a91' in err


def test_setup_lean_refuses_a_repl_checkout_at_another_tree(node):
    "The REPL is checked by its tree (the tag + the flush commit), not by a history that merely contains the tag."
    rc, out, err = ei('setup-lean', '--project', node['project'], '--mathlib-commit', node['commit'], env=node['env'])   # the real trees
    assert rc == 2 and 'neither the REPL tag v4.9.0-rc1 (tree 72c5a64a86d0)' in err and '(tree 45bc40f043dd)' in err
    (node['repl'] / 'REPL' / 'Main.lean').write_text('-- edited\n')
    rc, out, err = ei('setup-lean', '--project', node['project'], *node['args'], env=node['env'])
    assert rc == 2 and 'local edits' in err


def test_setup_lean_builds_mathlib_after_the_expected_cache_miss_and_a_rerun_resumes(node, tmp_path):
    (node['project'] / '.lake' / 'build' / 'lib' / 'Mathlib.olean').unlink()
    env = {**node['env'], 'FAKE_LAKE_FAIL_ONCE': str(tmp_path / 'failed-once')}
    rc, out, err = ei('setup-lean', '--project', node['project'], *node['args'], env=env)
    assert rc == 3 and 'lake build failed with exit 1; rerun `ei setup-lean` to resume the build' in err
    assert 'No files to download' in err and 'failed (exit 1): expected for the fork' in err   # the cache miss did not stop it
    assert 'CPU-hours' in err and 'lake build: 1/3 (33%)' in err                              # the estimate, then the progress
    rc, out, err = ei('setup-lean', '--project', node['project'], *node['args'], env=env)
    assert rc == 0, err
    assert out['steps']['mathlib-cache'] == 'present' and out['steps']['mathlib-build'] == 'done'   # the cache is not asked again
    assert 'lake build: 3/3 (100%)' in err and 'Building Mathlib.Logic' in (node['project'] / '.lake' / 'ei-build.log').read_text()


def test_setup_lean_kimina_writes_the_environment_of_the_checking_server(node, tmp_path):
    rc, out, err = ei('setup-lean', '--project', node['project'], *node['args'], '--kimina', env=node['env'])
    assert rc == 0, err
    env_file = Path(out['kimina']['env_file'])
    from ei_nb.setup_lean import read_env_file
    e = read_env_file(env_file)
    # issue 36: kimina's REPLs run through the sandbox wrapper `ei setup-lean` writes, which execs the REPL
    wrapper = Path(e['LEAN_SERVER_REPL_PATH'])
    assert f"-- {node['env']['EI_REPL_BIN']} \"$@\"" in wrapper.read_text() and e['LEAN_SERVER_PROJECT_DIR'] == str(node['project'])
    assert e['LEAN_SERVER_PORT'] == '12332' and e['LEAN_SERVER_PORT'] != '8000' and len(e['LEAN_SERVER_API_KEY']) >= 24
    assert e['PATH'] == f"{node['elan'] / 'bin'}:$PATH"                                   # the server starts REPLs with `lake env`
    assert f'export EI_LEAN_SERVER_KEY={e["LEAN_SERVER_API_KEY"]}' in err and 'python -m server' in err and 'setup.sh' in err
    rc, out, err = ei('setup-lean', '--project', node['project'], *node['args'], '--kimina', env=node['env'])
    assert read_env_file(env_file)['LEAN_SERVER_API_KEY'] == e['LEAN_SERVER_API_KEY']      # a rerun keeps the key


def test_setup_lean_fails_when_the_repl_does_not_flush(node):
    unflushed_repl(Path(node['env']['EI_REPL_BIN']))
    rc, out, err = ei('setup-lean', '--project', node['project'], *node['args'], '--timeout', '2', env=node['env'])
    assert rc == 3 and 'self-check failed' in err and '4fc1e6d' in err   # the verifier names the no-flush REPL and its fix


# -- ei doctor

def test_doctor_passes_on_the_demo_config(tmp_path):
    rc, out, err = ei('doctor', '--config', 'configs/demo.toml', '--run-dir', tmp_path / 'demo')
    assert rc == 0, err
    assert out['ok'] and out['counts']['FAIL'] == 0
    rows = {r['check']: r for r in out['rows']}
    assert 'written by the demo stage' in rows['pool']['detail'] and rows['lean']['status'] == 'WARN'
    assert all(r['status'] in ('OK', 'WARN', 'FAIL') for r in out['rows'])
    assert 'OK    jupyter kernel' in err


def test_doctor_fails_with_the_fix_on_the_reference_config_here(tmp_path):
    rc, out, err = ei('doctor', '--config', 'configs/goedel8b.toml', '--run-dir', tmp_path / 'g', '--no-lean',
                      '--set', f'paths.pool="{tmp_path}/pool.jsonl"')
    assert rc == 3 and out is not None and not out['ok']
    rows = {r['check']: r for r in out['rows']}
    assert rows['base model']['status'] == 'FAIL' and 'hf download Goedel-LM' in rows['base model']['fix']   # not huggingface-cli
    assert rows['pool']['status'] == 'FAIL' and 'ei pool' in rows['pool']['fix']
    assert rows['gpus']['status'] == 'FAIL'      # the managed server's 4 data-parallel engines, no CUDA here
    assert rows['scored']['status'] == 'OK'       # miniF2F-valid, none of the test split
    assert rows['vllm serve']['status'] == 'FAIL' and "pip install 'ei_nb[vllm]'" in rows['vllm serve']['fix']   # no vllm here
    assert '--data-parallel-size 4' in rows['server command']['detail'] and '--generation-config vllm' in rows['server command']['detail']
    assert 'not ready:' in err
    assert rows['nvidia driver']['status'] == 'WARN' and rows['torch cuda']['status'] == 'WARN'   # no GPU on this machine
    assert rows['lean workers']['status'] == 'WARN' and 'Lean-bound' in rows['lean workers']['detail']   # 8 workers, 4,000 x 8
    assert rows['kernel replay']['status'] == 'OK'
    rc, out, err = ei('doctor', '--config', 'configs/goedel8b.toml', '--run-dir', tmp_path / 'g', '--no-lean', '--set',
                      f'paths.pool="{tmp_path}/pool.jsonl"', '--set', 'verify.replay=false', '--set', 'eta.lean_workers=64')
    rows = {r['check']: r for r in out['rows']}
    assert rows['kernel replay']['status'] == 'WARN' and 'NOT replayed' in rows['kernel replay']['detail']
    assert rows['lean workers']['status'] == 'OK'


def test_doctor_checks_the_pool_against_protected(tmp_path):
    from ei_nb.doctor import Context, check_problems
    from ei_nb.config import load_config
    from ei_nb.core import write_records
    mf = read_problems(shared_data('minif2f_dsp15.jsonl'))
    write_records(tmp_path / 'pool.jsonl', [{**mf[-1], 'name': 'renamed_copy', 'split': 'train'}], 'problem')
    cfg = load_config(ROOT / 'configs/goedel8b.toml', [f'paths.pool="{tmp_path}/pool.jsonl"'], warn=lambda *a: None)
    rows = {r['check']: r for r in check_problems(Context(cfg, tmp_path / 'run'))}
    assert rows['pool']['status'] == 'FAIL' and '1 are protected' in rows['pool']['detail']   # nothing left to train on


def test_doctor_lean_rows_against_the_repl_stand_in(node, tmp_path, monkeypatch):
    "The run's own verifier: 8 REPLs at once under the memory limit on a known proof, a false theorem, the statement probe."
    from ei_nb.doctor import check_lean, Context
    from ei_nb.config import load_config
    for k, v in node['env'].items(): monkeypatch.setenv(k, v)
    cfg = load_config(ROOT / 'configs/goedel8b.toml', [f'paths.lean_project="{node["project"]}"'], warn=lambda *a: None)
    rows = {r['check']: r for r in check_lean(Context(cfg, tmp_path / 'run'), timeout=30)}
    assert {k: r['status'] for k, r in rows.items()} == {
        'sandbox': 'OK', 'lake': 'OK', 'lean toolchain': 'OK', 'lean version': 'OK', 'mathlib oleans': 'OK',
        'repl: a known proof, 8 at once under 10240 MiB each': 'OK', 'repl: a false theorem': 'OK', 'repl: statement probe': 'OK'}, rows
    assert rows['lake']['detail'] == str(node['elan'] / 'bin' / 'lake')                # found through $ELAN_HOME/bin
    unflushed_repl(Path(node['env']['EI_REPL_BIN']))
    rows = check_lean(Context(cfg, tmp_path / 'run'), timeout=2)
    bad = [r for r in rows if r['status'] == 'FAIL']
    assert len(bad) == 1 and 'did not answer the header' in bad[0]['detail'] and '4fc1e6d' in bad[0]['detail'] and 'EI_REPL_BIN' in bad[0]['fix']


def test_doctor_finds_lake_only_where_the_run_looks(tmp_path, monkeypatch):
    from ei_nb.doctor import check_lean, Context
    from ei_nb.config import load_config
    project = tmp_path / 'mathlib4'; project.mkdir()
    monkeypatch.setenv('ELAN_HOME', str(tmp_path / 'no-elan')); monkeypatch.setenv('HOME', str(tmp_path)); monkeypatch.delenv('EI_LAKE', raising=False)
    monkeypatch.setenv('PATH', '/usr/bin:/bin')
    cfg = load_config(ROOT / 'configs/goedel8b.toml', [f'paths.lean_project="{project}"'], warn=lambda *a: None)
    (lake,) = [r for r in check_lean(Context(cfg, tmp_path / 'run')) if r['check'] == 'lake']
    assert lake['status'] == 'FAIL' and 'paths.lake, then $ELAN_HOME/bin/lake, then ~/.elan/bin/lake, then on the PATH' in lake['fix']
    assert 'export PATH=$HOME/.elan/bin:$PATH' in lake['fix']


def test_doctor_refuses_the_in_process_vllm_sampler_with_data_parallel(tmp_path):
    from ei_nb.doctor import Context, check_samplers
    from ei_nb.config import load_config
    cfg = load_config(ROOT / 'configs/goedel8b.toml', ['sample_verify.sampler="vllm"', 'sample_verify.data_parallel_size=4'], warn=lambda *a: None)
    (r,) = [r for r in check_samplers(Context(cfg, tmp_path / 'run')) if r['check'] == '[sample_verify] sampler vllm']
    assert r['status'] == 'FAIL' and 'PR #27282' in r['fix'] and 'sampler = "served"' in r['fix']


def test_doctor_checks_the_server_length_against_the_longest_prompt_and_the_cap(tiny_model_dir, tmp_path):
    from ei_nb.doctor import Context, check_samplers
    from ei_nb.config import load_config
    from ei_nb.core import write_records
    import shutil
    base = tmp_path / 'model'; shutil.copytree(tiny_model_dir, base)
    (base / 'generation_config.json').write_text(json.dumps({'temperature': 0.6, 'top_k': 20, 'top_p': 0.95}))
    write_records(tmp_path / 'pool.jsonl', [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'valid'][:5], 'problem')
    sets = [f'paths.base_model="{base}"', f'paths.pool="{tmp_path}/pool.jsonl"', 'serve.max_model_len=4096']
    rows = {r['check']: r for r in check_samplers(Context(load_config(ROOT / 'configs/goedel8b.toml', sets, warn=lambda *a: None), tmp_path / 'r'))}
    assert rows['01_sample_verify: max model len']['status'] == 'FAIL' and 'serve.max_model_len >= 16' in rows['01_sample_verify: max model len']['fix']
    assert rows['04_eval: max model len']['status'] == 'FAIL'                                   # 30,000 new tokens do not fit in 4,096
    assert "'top_k': 20" in rows['generation_config.json']['detail'] and 'not used' in rows['generation_config.json']['detail']
    sets[-1] = 'serve.max_model_len=32768'
    rows = {r['check']: r for r in check_samplers(Context(load_config(ROOT / 'configs/goedel8b.toml', sets, warn=lambda *a: None), tmp_path / 'r'))}
    assert rows['01_sample_verify: max model len']['status'] == 'OK' and rows['04_eval: max model len']['status'] == 'OK'


# -- ei pool

def _statement_rows():
    "Real statements: the lean-workbook files (proofs cut off, `sorry` instead) and ten miniF2F problems."
    from ei_nb.demo import split_lean_file
    rows = []
    for line in open(shared_data('lean_workbook_goedel_proofs_kimina_verdicts.jsonl'), encoding='utf-8'):
        r = json.loads(line)
        s = split_lean_file(r['code'])
        if s and r['id'].startswith('lean_workbook'):
            rows.append({'name': r['id'], 'header': s['header'], 'informal_prefix': s['informal_prefix'],
                         'formal_statement': s['formal_statement'].rstrip() + ' sorry'})
    mf = read_problems(shared_data('minif2f_dsp15.jsonl'))
    rows += [{'name': f'renamed_{q["name"]}', 'header': q['header'], 'informal_prefix': q.get('informal_prefix', ''),
              'formal_statement': q['formal_statement']} for q in mf[::50]]
    rows.append({**rows[0], 'name': 'duplicate_of_first'})
    rows.append({'name': 'bad', 'header': '', 'informal_prefix': '', 'formal_statement': 'theorem bad : True := trivial'})
    rows.append({'name': 'cheat', 'header': '', 'informal_prefix': '', 'formal_statement': 'theorem cheat (h : 1 = 1 := by native_decide) : True := by'})
    return rows


def test_pool_from_a_parquet_file(tmp_path):
    import pyarrow as pa, pyarrow.parquet as pq
    rows = _statement_rows()
    src = tmp_path / 'statements.parquet'
    pq.write_table(pa.Table.from_pylist(rows), src)
    mf = shared_data('minif2f_dsp15.jsonl')
    rc, out, err = ei('pool', '--source', src, '--protected', mf, '--out', tmp_path / 'pool.jsonl', '--n', 50, '--seed', 3)
    assert rc == 0, err
    n_mf = len(read_problems(mf)[::50])
    assert out['read'] == len(rows) and out['normalised'] == len(rows) - 1           # `:= trivial` is not `:= by`
    assert out['statement_ok'] == out['normalised'] - 1                              # native_decide in the statement
    assert out['unique'] == out['statement_ok'] - 1                                  # the duplicate
    assert out['not_protected'] == out['unique'] - n_mf and out['sampled'] == 50
    for step in ('rows', 'normalised', 'statement parser', 'distinct', 'not protected', 'sampled'): assert step in err
    pool = read_problems(tmp_path / 'pool.jsonl')
    keys = {statement_key(q['formal_statement']) for q in read_problems(mf)}
    assert not any(statement_key(p['formal_statement']) in keys for p in pool)
    assert all(p['formal_statement'].rstrip().endswith(':= by') and p['header'].startswith('import Mathlib') for p in pool)
    # the same seed gives the same pool; another seed another one
    rc, _, _ = ei('pool', '--source', src, '--protected', mf, '--out', tmp_path / 'again.jsonl', '--n', 50, '--seed', 3)
    assert (tmp_path / 'again.jsonl').read_bytes() == (tmp_path / 'pool.jsonl').read_bytes()
    ei('pool', '--source', src, '--protected', mf, '--out', tmp_path / 'other.jsonl', '--n', 50, '--seed', 4)
    assert {p['name'] for p in read_problems(tmp_path / 'other.jsonl')} != {p['name'] for p in pool}


def test_the_pool_is_keyed_once_when_written_and_select_reads_its_keys(tmp_path):
    "`ei pool` keys its file (issue 34): `ei select` compares the cached digests, it does not key the statements again."
    import pyarrow as pa, pyarrow.parquet as pq
    from ei_nb.near_dup import digests_entry, statement_digests
    src, mf, env = tmp_path / 'statements.parquet', shared_data('minif2f_dsp15.jsonl'), {'EI_HASH_CACHE': str(tmp_path / 'cache')}
    pq.write_table(pa.Table.from_pylist(_statement_rows()), src)
    rc, _, err = ei('pool', '--source', src, '--out', tmp_path / 'pool.jsonl', env=env)   # no --protected: miniF2F stays
    assert rc == 0, err
    pool = read_problems(tmp_path / 'pool.jsonl')
    os.environ['EI_HASH_CACHE'] = env['EI_HASH_CACHE']
    try: entry = digests_entry(tmp_path / 'pool.jsonl')
    finally: del os.environ['EI_HASH_CACHE']
    assert (np.frombuffer(entry.read_bytes(), '<i8').reshape(-1, 2) == statement_digests(pool)).all()
    (tmp_path / 'v.jsonl').write_text(''.join(json.dumps({'name': p['name'], 'sample_idx': i, 'verdict': v}) + '\n'
                                             for p in pool for i, v in enumerate(('pass', 'fail'))))
    def selected():
        rc, out, err = ei('select', '--pool', tmp_path / 'pool.jsonl', '--results', tmp_path / 'v.jsonl', '--protected', mf,
                          '--out', tmp_path / 'sel.jsonl', '--max-problems', 10000, env=env)
        assert rc == 0, err
        return {p['name'] for p in read_problems(tmp_path / 'sel.jsonl')}
    renamed = {p['name'] for p in pool if p['name'].startswith('renamed_')}
    assert renamed and not renamed & selected()                     # the miniF2F statements under other names are removed
    entry.write_bytes(np.zeros(2 * len(pool), '<i8').tobytes())    # keys that match nothing: select believes the cache
    assert renamed <= selected()


def test_pool_through_datasets_from_a_dataset_folder(tmp_path):
    pytest.importorskip('datasets')
    import pyarrow as pa, pyarrow.parquet as pq
    from ei_nb.pool import build_pool
    folder = tmp_path / 'Goedel-Pset-like'; folder.mkdir()
    rows = _statement_rows()[:30]
    pq.write_table(pa.Table.from_pylist(rows), folder / 'train-00000-of-00001.parquet')
    pool, counts = build_pool([str(folder)], log=lambda *a: None)
    assert counts['read'] == 30 and len(pool) == 30


def test_pool_refuses_an_unknown_file_type_and_an_empty_result(tmp_path):
    (tmp_path / 'x.csv').write_text('a,b\n')
    rc, out, err = ei('pool', '--source', tmp_path / 'x.csv', '--out', tmp_path / 'p.jsonl')
    assert rc == 2 and 'unknown file type' in err
    (tmp_path / 'e.jsonl').write_text(json.dumps({'name': 'x', 'formal_statement': 'theorem x : True := trivial'}) + '\n')
    rc, out, err = ei('pool', '--source', tmp_path / 'e.jsonl', '--out', tmp_path / 'p.jsonl')
    assert rc == 2 and 'no problem left' in err and not (tmp_path / 'p.jsonl').exists()


# -- the openai sampler against a local stand-in of `vllm serve`

class Standin(http.server.BaseHTTPRequestHandler):
    "GET /v1/models and POST /v1/completions in vLLM's reply format; text drawn from the request's seed."
    model, fail_after, served = '', None, 0
    def log_message(self, *a): pass
    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code); self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        self._send(200, {'object': 'list', 'data': [{'id': self.model, 'object': 'model', 'root': self.model}]})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        cls = type(self); cls.served += 1
        if cls.fail_after is not None and cls.served > cls.fail_after: return self._send(503, {'error': 'node lost'})
        if body['model'] != self.model: return self._send(404, {'error': 'no such model'})
        rng = random.Random(body['seed'])
        texts = [' '.join(rng.choice(['intro x', 'simp', 'nlinarith [sq_nonneg x]', 'norm_num']) for _ in range(rng.randint(1, 4)))
                 for _ in range(body['n'])]
        self._send(200, {'id': 'cmpl-1', 'object': 'text_completion', 'created': 0, 'model': self.model,
                         'choices': [{'index': j, 'text': t, 'logprobs': None, 'finish_reason': 'stop', 'stop_reason': None}
                                     for j, t in enumerate(texts)],
                         'usage': {'prompt_tokens': 1, 'completion_tokens': 1, 'total_tokens': 2}})


@pytest.fixture
def serve():
    servers = []
    def start(model, fail_after=None):
        cls = type('S', (Standin,), {'model': str(model), 'fail_after': fail_after, 'served': 0})
        srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), cls)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f'http://127.0.0.1:{srv.server_port}', cls
    yield start
    for s in servers: s.shutdown()


def test_ei_sample_with_the_openai_sampler(tiny_model_dir, serve, tmp_path):
    from ei_nb.core import write_records
    problems = [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'valid'][:4]
    write_records(tmp_path / 'problems.jsonl', problems, 'problem')
    (a, ca), (b, cb) = serve(tiny_model_dir), serve(tiny_model_dir)
    rc, out, err = ei('sample', '--backend', 'openai', '--problems', tmp_path / 'problems.jsonl', '--model', tiny_model_dir,
                      '--out', tmp_path / 's.jsonl', '--n', 3, '--max-new-tokens', 64, '--chunk-problems', 2,
                      env={'EI_OPENAI_ENDPOINTS': f'{a},{b}/v1'})
    assert rc == 0, err
    assert out['n_samples'] == 12 and ca.served == 2 and cb.served == 2      # round robin over the two endpoints
    rows = [json.loads(l) for l in (tmp_path / 's.jsonl').read_text().splitlines()]
    assert all(r['n_tokens'] > 1 and not r['capped'] for r in rows)


def test_a_dead_endpoint_costs_at_most_one_chunk(tiny_model_dir, serve, tmp_path):
    from ei_nb.samplers import SampleParams, run_pipeline
    from ei_nb.remote_samplers import OpenAISampler
    problems = [p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['split'] == 'valid'][:6]
    url, cls = serve(tiny_model_dir, fail_after=3)     # the node dies during the second chunk of two problems
    smp = OpenAISampler(tiny_model_dir, [url], retries=2, backoff=0.01, log=lambda *a: None)
    params, path = SampleParams(n=2, max_new_tokens=32, seed=0), tmp_path / 'samples.jsonl'
    with pytest.raises(StageFailed, match='every endpoint failed'):
        run_pipeline(problems, smp, path, params, 1, chunk_problems=2)
    kept = [json.loads(l) for l in path.read_text().splitlines()]
    assert len(kept) == 4                               # the first chunk is on disk, the second is lost
    cls.fail_after = None                               # the node is back
    r = run_pipeline(problems, OpenAISampler(tiny_model_dir, [url], log=lambda *a: None), path, params, 1, chunk_problems=2)
    assert r['n_resumed'] == 4 and r['n_generated'] == 8 and r['n_samples'] == 12
    fresh = run_pipeline(problems, OpenAISampler(tiny_model_dir, [url], log=lambda *a: None), tmp_path / 'fresh.jsonl', params, 1, chunk_problems=2)
    assert (tmp_path / 'fresh.jsonl').read_text() == path.read_text()   # resumed = uninterrupted


# -- the reference configs and the CLI

@pytest.mark.parametrize('name', ['goedel8b.toml', 'goedel8b_two_node.toml'])
def test_reference_configs_load(name):
    from ei_nb.config import load_config, validate_config
    cfg = load_config(ROOT / 'configs' / name, warn=lambda *a: None)
    validate_config(cfg, check_paths=False)
    assert cfg['paths']['pool'] == 'data/pool.jsonl' and cfg['paths']['lean_project'] == 'lean/mathlib4'
    assert cfg['stages']['01_sample_verify']['sampler'] == 'served' and cfg['stages']['04_eval']['sampler'] == 'served'
    assert cfg['verify']['max_error_frac'] == 0.1 and cfg['serve']['generation_config'] == 'vllm'
    if 'two_node' in name:
        assert (cfg['serve']['backend'], cfg['serve']['data_parallel_size'], cfg['serve']['data_parallel_size_local']) == ('ray', 8, 4)
        assert 'EI_OPENAI_ENDPOINTS' not in cfg['run']['env'] and 'EI_LEAN_SERVER_ENDPOINTS' not in cfg['run']['env']
        env = cfg['run']['env']
        got = (cfg['verify']['backend'], env['EI_RAY_ADDRESS'], env['EI_RAY_WORKERS_PER_NODE'])
        assert got == ('ray', 'auto', '16')
    else: assert (cfg['serve']['backend'], cfg['serve']['data_parallel_size']) == ('local', 4)


@pytest.mark.parametrize('name, flags', [('goedel8b.toml', '--data-parallel-size 4 --tensor-parallel-size 1 --seed 0 --generation-config vllm --max-model-len 40960'),
                                         ('goedel8b_two_node.toml', '--data-parallel-size 8 --tensor-parallel-size 1 --seed 0 --generation-config vllm '
                                                                    '--max-model-len 40960 --data-parallel-backend ray --data-parallel-size-local 4')])
def test_the_dry_run_shows_the_server_commands(name, flags, tmp_path):
    r = subprocess.run([sys.executable, '-c', 'from ei_nb.cli import _entry; _entry()', 'run', '--config', f'configs/{name}', '--run-dir',
                        str(tmp_path / 'r'), '--dry-run'], capture_output=True, text=True, cwd=ROOT, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert r.returncode == 0, r.stderr
    cmds = [l.split('server: ', 1)[1] for l in r.stdout.splitlines() if 'server: ' in l]
    assert len(cmds) == 2 + 3 * 2                                     # round 0: 01 and 04; three rounds of 01 and 04
    assert cmds[0] == f'vllm serve {ROOT / "models/Goedel-Prover-V2-8B"} --host 127.0.0.1 --port PORT {flags}'
    assert cmds[-1] == f'vllm serve {tmp_path / "r" / "round_03" / "model"} --host 127.0.0.1 --port PORT {flags}'


def test_new_commands_are_in_ei_help():
    r = subprocess.run([sys.executable, '-c', 'from ei_nb.cli import _entry; _entry()', '--help'], capture_output=True, text=True,
                       env={**os.environ, 'PYTHONPATH': str(ROOT)})
    for cmd in ('setup-lean', 'doctor', 'pool'): assert f'  {cmd}' in r.stderr


def test_doctor_rows_of_the_two_node_config(tmp_path, monkeypatch):
    "The Ray backend's cluster row, and a real /verify round trip with the key on each checking server (tests/test_kimina_lines.py)."
    from ei_nb.doctor import Context, check_samplers, check_lean, check_cpus
    from ei_nb.config import load_config
    from tests.test_kimina_lines import kimina
    import socket
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); closed = f'http://127.0.0.1:{s.getsockname()[1]}'   # nothing listens there
    monkeypatch.setenv('PATH', str(script(tmp_path / 'bin' / 'ray', '#!/bin/sh\necho "ray: no cluster here" >&2; exit 1\n').parent) + os.pathsep + os.environ['PATH'])
    cfg = load_config(ROOT / 'configs/goedel8b_two_node.toml', ['verify.backend=server'], warn=lambda *a: None)
    rows = {r['check']: r for r in check_samplers(Context(cfg, tmp_path / 'run'))}
    assert rows['ray cluster']['status'] == 'FAIL' and 'ray start --head' in rows['ray cluster']['fix']
    assert '--data-parallel-backend ray --data-parallel-size-local 4' in rows['server command']['detail']
    with kimina('file') as (live, h):
        monkeypatch.setenv('EI_LEAN_SERVER_ENDPOINTS', f'{live},{closed}')
        rows = {r['check']: r for r in check_lean(Context(cfg, tmp_path / 'run'), timeout=30)}
    assert rows['server: a known proof, 32 at once']['status'] == 'OK' and rows['server: a false theorem']['status'] == 'OK'
    assert rows['server: statement probe']['status'] == 'OK'
    assert rows[f'server {live}: message lines']['detail'].startswith('from the top of the file')
    assert rows[f'server {closed}: message lines']['status'] == 'WARN'       # it never answered: its proofs went to the live one
    assert check_cpus(Context(cfg, tmp_path / 'run'))[0]['status'] == 'OK'       # 32 checks in flight run on the servers


def test_doctor_rows_of_the_two_node_config_come_from_each_ray_node(tmp_path, monkeypatch):
    "verify.backend ray: check_lean hands the run's verifier and [verify] to ei_nb.lean_ray (see test_verify_ray.py)."
    import ei_nb.doctor as D
    from ei_nb.config import load_config
    seen = []
    rows = lambda s, section: seen.append((s, section)) or [D.row('ray node x', 'OK', '16')]
    monkeypatch.setattr(D, 'lean_worker_rows', rows)
    cfg = load_config(ROOT / 'configs/goedel8b_two_node.toml', warn=lambda *a: None)
    assert [r['check'] for r in D.check_lean(D.Context(cfg, tmp_path / 'run'), timeout=5)] == ['ray node x']
    (s, section), = seen
    got = (s.backend, s.project, section['ray_address'], section['workers_per_node'])
    assert got == ('ray', str(ROOT / 'lean/mathlib4'), 'auto', 16)
    assert D.check_cpus(D.Context(cfg, tmp_path / 'run'))[0]['status'] == 'OK'     # Lean runs on the Ray nodes


def test_doctor_says_when_the_checking_server_refuses_the_key(tmp_path, monkeypatch):
    from ei_nb.doctor import Context, check_lean
    from ei_nb.config import load_config
    from tests.test_verifier_guard import checker
    with checker('401') as (url, h):
        monkeypatch.setenv('EI_LEAN_SERVER_ENDPOINTS', url); monkeypatch.setenv('EI_LEAN_SERVER_KEY', 'wrong')
        cfg = load_config(ROOT / 'configs/goedel8b_two_node.toml', ['verify.backend=server'], warn=lambda *a: None)
        rows = check_lean(Context(cfg, tmp_path / 'run'), timeout=5)
    assert [r['status'] for r in rows] == ['FAIL'] and 'HTTP 401' in rows[0]['detail'] and 'EI_LEAN_SERVER_KEY' in rows[0]['detail']


def test_the_dry_run_of_the_reference_config_prints_the_lean_bound_estimate():
    "Round 0 samples the 4,000-problem pool: ~200 worker-h of Lean, ~25 h on the config's 8 workers, ~3 h on 64 (issue 34)."
    rc, out, err = ei('run', '--config', ROOT / 'configs' / 'goedel8b.toml', '--dry-run')
    assert rc == 0, err
    p = subprocess.run([sys.executable, '-c', 'from ei_nb.cli import _entry; _entry()', 'run', '--config',
                        str(ROOT / 'configs' / 'goedel8b.toml'), '--dry-run'], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}, timeout=600)
    r0 = p.stdout.split('round 0  01_sample_verify', 1)[1].splitlines()[1].strip()
    assert r0 == 'Lean-bound: 201 worker-h, 25 h on 8 workers, 3.1 h on 64; generation 4.0 h', r0
    assert out['bound']['0:01_sample_verify'] == 'Lean-bound' and 'estimates' in p.stdout
    rc, wide, err = ei('run', '--config', ROOT / 'configs' / 'goedel8b.toml', '--dry-run', '--set', 'eta.lean_workers=64')
    assert rc == 0 and wide['bound']['0:01_sample_verify'] == 'GPU-bound' and wide['eta_s'] < out['eta_s'] / 3


def test_doctor_reads_the_driver_from_nvidia_smi_and_names_the_driver_torch_needs(tmp_path, monkeypatch):
    "A stand-in nvidia-smi answers `--query-gpu=driver_version --format=csv,noheader` as the real one does (one line per GPU)."
    from ei_nb.doctor_node import driver_version, gpu_stack_rows
    smi = script(tmp_path / 'bin' / 'nvidia-smi', '#!/bin/sh\n[ "$1" = "--query-gpu=driver_version" ] && '
                 '[ "$2" = "--format=csv,noheader" ] || exit 9\necho 575.57.08\necho 575.57.08\n')
    monkeypatch.setenv('PATH', f'{smi.parent}{os.pathsep}{os.environ["PATH"]}')
    assert driver_version() == '575.57.08'
    rows = gpu_stack_rows(4, driver_version(), {'torch': '2.9.0+cu130', 'cuda': '13.0', 'available': False})
    assert [r['status'] for r in rows] == ['FAIL', 'FAIL'] and '>= 580' in rows[0]['fix']
    smi.write_text('#!/bin/sh\nexit 1\n')
    assert driver_version() == ''                             # there, but not answering: a WARN row, not a crash


def test_replay_off_in_the_config_reaches_the_verifier_and_stage_json(monkeypatch):
    "`[verify] replay = false` (issue 34): the stage kernels get EI_REPLAY=0, the verifier replays nothing and says so,"
    "and the stage.json of a stage that checks proofs says plainly that its passes were not replayed."
    from types import SimpleNamespace
    from ei_nb.config import load_config
    from ei_nb.layout import write_stage_json
    from ei_nb.verify import VerifierSettings, _replay_pool
    cfg = load_config(ROOT / 'configs/goedel8b.toml', ['verify.replay=false'], warn=lambda *a: None)
    assert cfg['run']['env']['EI_REPLAY'] == '0'
    assert 'EI_REPLAY' not in load_config(ROOT / 'configs/goedel8b.toml', warn=lambda *a: None)['run']['env']
    monkeypatch.setenv('EI_REPLAY', '0')
    assert _replay_pool(VerifierSettings(backend='repl'), SimpleNamespace(pickles='pickle'), {}) is None
    rec = write_stage_json(None, '01_sample_verify', {}, {}, {'verify_backend': 'repl'}, {'work': 1}, 1.0)
    assert 'NOT replayed' in rec['kernel_replay']
    assert 'kernel_replay' not in write_stage_json(None, '02_sft', {}, {}, {'lr': 1e-5}, {'work': 1}, 1.0)
    monkeypatch.delenv('EI_REPLAY')
    assert 'kernel_replay' not in write_stage_json(None, '01_sample_verify', {}, {}, {'verify_backend': 'repl'}, {'work': 1}, 1.0)

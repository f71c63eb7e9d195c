"""Hostile input and a hostile filesystem through the public `ei` command (issue 12).

Every case runs `ei ...` as a user would (a subprocess), then checks the exit code, that stderr is one
clear line naming the file/argument (never a traceback), and that nothing on disk changed: the sha256 of
every file in the work folder (inputs and any earlier output, hidden temp files included) is the same
before and after. Full and read-only disks are real tiny tmpfs mounts when this process may mount them
(root in a container); otherwise the fault is injected (os.fsync / os.open raising ENOSPC / EROFS) and
the test says so in its id.
"""
import errno, hashlib, json, os, shutil, subprocess, sys, textwrap
from pathlib import Path

import pytest

from ei_nb.core import shared_data, read_problems

REPO = Path(__file__).resolve().parent.parent
HEADER = "import Mathlib\n\n"
BOM = b'\xef\xbb\xbf'


def ei(*argv, cwd=None, timeout=60, env=None, pre=''):
    "Run the `ei` console script (or, with `pre`, the same entry point after `pre` ran): CompletedProcess."
    e = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1', **(env or {}))
    if pre:
        code = pre + '\nfrom ei_nb.cli import _entry\nimport sys\nsys.argv = ["ei"] + sys.argv[1:]\n_entry()'
        cmd = [sys.executable, '-c', code, *map(str, argv)]
    else: cmd = [shutil.which('ei') or 'ei', *map(str, argv)]
    return subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)


def snapshot(d: Path) -> dict:
    "sha256 of every regular file under `d` (hidden ones too), by relative path; FIFOs and dirs by kind."
    out = {}
    for p in sorted(d.rglob('*')):
        if p.is_symlink(): out[str(p.relative_to(d))] = 'link->' + os.readlink(p)
        elif p.is_file(): out[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else: out[str(p.relative_to(d))] = 'dir' if p.is_dir() else 'special'
    return out


def refused(res, before, d, *words, rc=2):
    "The command failed cleanly: exit `rc`, one error line containing `words`, no traceback, no JSON result, disk unchanged."
    assert res.returncode == rc, (res.returncode, res.stderr[-2000:])
    assert 'Traceback' not in res.stderr, res.stderr
    for w in words: assert w in res.stderr, (w, res.stderr)
    assert not res.stdout.strip(), res.stdout
    assert snapshot(d) == before, 'files changed on disk'


def rows(*recs) -> bytes: return b''.join(json.dumps(r).encode() + b'\n' for r in recs)


@pytest.fixture
def work(tmp_path):
    "A pool of 4 problems, their verdicts (4 samples each) and sample records, in one folder."
    names = [f'p{i}' for i in range(4)]
    pool = [{'name': n, 'split': 'train', 'header': HEADER, 'formal_statement': f'theorem {n} : {i} = {i} := by'} for i, n in enumerate(names)]
    verdicts = [{'name': n, 'sample_idx': j, 'verdict': 'pass' if j < i else 'fail', 'reason': None, 'verify_s': 0.5}
                for i, n in enumerate(names) for j in range(4)]
    samples = [{'name': n, 'sample_idx': j, 'round': 0, 'completion': ' rfl', 'n_tokens': 2, 'capped': False} for n in names for j in range(4)]
    (tmp_path/'pool.jsonl').write_bytes(rows(*pool))
    (tmp_path/'verdicts.jsonl').write_bytes(rows(*verdicts))
    (tmp_path/'samples.jsonl').write_bytes(rows(*samples))
    return tmp_path


def _verdict_line(**kw) -> bytes:
    return json.dumps({'name': 'p0', 'sample_idx': 9, 'verdict': 'fail', **kw}).encode() + b'\n'


# ---------------------------------------------------------------- input files
BAD_VERDICT_FILES = {
    'non_utf8': (lambda ok: ok + b'{"name": "p\xff", "sample_idx": 9, "verdict": "fail"}\n', ':17:', 'not UTF-8'),
    'duplicate_key': (lambda ok: ok + b'{"name": "p0", "sample_idx": 9, "verdict": "fail", "verdict": "pass"}\n', ":17: field 'verdict': duplicate key"),
    'duplicate_key_unread_number': (lambda ok: ok + b'{"name": "p0", "sample_idx": 9, "verdict": "fail", "verify_s": 1, "verify_s": 2}\n', "field 'verify_s': duplicate key"),
    'verify_s_1e400': (lambda ok: ok + b'{"name": "p0", "sample_idx": 9, "verdict": "fail", "verify_s": 1e400}\n', ":17: field 'verify_s'", 'finite'),
    'verify_s_NaN': (lambda ok: ok + b'{"name": "p0", "sample_idx": 9, "verdict": "fail", "verify_s": NaN}\n', ':17:', 'NaN'),
    'verify_s_true': (lambda ok: ok + b'{"name": "p0", "sample_idx": 9, "verdict": "fail", "verify_s": true}\n', ":17: field 'verify_s'", 'bool'),
    'sample_idx_bool': (lambda ok: ok + b'{"name": "p0", "sample_idx": true, "verdict": "fail"}\n', ":17: field 'sample_idx'"),
    'truncated_json': (lambda ok: ok + b'{"name": "p0", "sample_idx": 9\n', ':17:', 'invalid JSON'),
}


def _cmd(command, d, verdicts):
    return {'stats': ['stats', '--verified', verdicts, '--k', '1,4'],
            'select': ['select', '--pool', d/'pool.jsonl', '--results', verdicts, '--out', d/'out.jsonl', '--hi', '0.9'],
            'mcnemar': ['mcnemar', '--a', verdicts, '--b', d/'verdicts.jsonl'],
            'sft-data': ['sft-data', '--problems', d/'pool.jsonl', '--samples', d/'samples.jsonl', '--verdicts', verdicts,
                         '--out', d/'out.jsonl', '--tokenizer', d/'no_tokenizer']}[command]


SLOW = pytest.mark.slow   # the same reader under every other command: run with -m slow
def _commands(fast, *others): return [fast, *(pytest.param(c, marks=SLOW) for c in others)]


@pytest.mark.parametrize('command', _commands('stats', 'select', 'mcnemar', 'sft-data'))
@pytest.mark.parametrize('case', sorted(BAD_VERDICT_FILES))
def test_bad_verdict_file(work, command, case):
    make, *words = BAD_VERDICT_FILES[case]
    (work/'bad.jsonl').write_bytes(make((work/'verdicts.jsonl').read_bytes()))
    before = snapshot(work)
    refused(ei(*_cmd(command, work, work/'bad.jsonl')), before, work, 'bad.jsonl', *words)


def test_duplicate_key_in_samples_refused_by_verify(work):
    "`verify` used to keep the last value of a key given twice; now it names line and key."
    (work/'s2.jsonl').write_bytes((work/'samples.jsonl').read_bytes() +
                                  b'{"name": "p0", "sample_idx": 9, "round": 0, "completion": " sorry", "completion": " rfl", "n_tokens": 2, "capped": false}\n')
    before = snapshot(work)
    refused(ei('verify', '--problems', work/'pool.jsonl', '--samples', work/'s2.jsonl', '--out', work/'v.jsonl'),
            before, work, "s2.jsonl:17: field 'completion': duplicate key")


@pytest.mark.parametrize('command', _commands('stats', 'select', 'sft-data'))
def test_directory_as_input(work, command):
    (work/'adir').mkdir()
    before = snapshot(work)
    refused(ei(*_cmd(command, work, work/'adir')), before, work, 'adir', 'is a directory, not a regular file')


@pytest.mark.parametrize('command', _commands('stats', 'select', 'verify'))
def test_fifo_refused_without_hanging(work, command):
    "Nobody writes to the FIFO: reading it would block forever. It is refused at once (timeout = a hang)."
    os.mkfifo(work/'fifo')
    before = snapshot(work)
    argv = (['verify', '--problems', work/'pool.jsonl', '--samples', work/'fifo', '--out', work/'v.jsonl'] if command == 'verify'
            else _cmd(command, work, work/'fifo'))
    refused(ei(*argv, timeout=60), before, work, 'fifo', 'FIFO or pipe')


def test_process_substitution_refused_clearly(work):
    "`<(cat f)` is a pipe: a command that reads its input twice would see it empty the second time; refused with the reason."
    before = snapshot(work)
    cmd = f'{shutil.which("ei") or "ei"} stats --verified <(cat {work/"verdicts.jsonl"})'
    res = subprocess.run(['bash', '-c', cmd], env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=60)
    refused(res, before, work, '/dev/fd/', 'FIFO or pipe', 'write it to a file first')


def test_missing_and_unreadable_inputs(work):
    before = snapshot(work)
    refused(ei('stats', '--verified', work/'nope.jsonl'), before, work, 'nope.jsonl: no such file')


def test_very_long_line_is_read(work):
    "A valid verdict with a 24 MB proof (longer than pyarrow's block) is read: the exact reader takes over."
    big = work/'long.jsonl'
    big.write_bytes((work/'verdicts.jsonl').read_bytes() + _verdict_line(proof='x' * (24 << 20)))
    res = ei('stats', '--verified', big, '--k', '1')
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.splitlines()[-1])['n_problems'] == 4


@pytest.mark.parametrize('command', _commands('select', 'stats', 'mcnemar'))
def test_bom_crlf_no_final_newline_same_result(work, command):
    "A byte-order mark, CRLF line ends and no newline after the last line give the same result as the clean file."
    clean = work/'verdicts.jsonl'
    odd = work/'odd.jsonl'
    odd.write_bytes(BOM + clean.read_bytes().replace(b'\n', b'\r\n')[:-2])
    a, b = ei(*_cmd(command, work, clean)), None
    if command == 'select': shutil.move(work/'out.jsonl', work/'out_clean.jsonl')
    b = ei(*_cmd(command, work, odd))
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout.splitlines()[-1] == b.stdout.splitlines()[-1]
    if command == 'select': assert (work/'out.jsonl').read_bytes() == (work/'out_clean.jsonl').read_bytes()


# ---------------------------------------------------------------- arguments
BAD_ARGS = {
    'stats --k 0': (['stats', '--verified', '{d}/verdicts.jsonl', '--k', '0'], 'argument --k'),
    'stats --k -1': (['stats', '--verified', '{d}/verdicts.jsonl', '--k', '-1'], 'argument --k'),
    'stats --k 1,x': (['stats', '--verified', '{d}/verdicts.jsonl', '--k', '1,x'], 'argument --k'),
    'stats --k 8 > n': (['stats', '--verified', '{d}/verdicts.jsonl', '--k', '8'], 'pass@8', 'fewer than 8 samples'),
    'select --max-problems -1': (['select', '--pool', '{d}/pool.jsonl', '--results', '{d}/verdicts.jsonl', '--out', '{d}/o.jsonl', '--max-problems', '-1'], 'argument --max-problems'),
    'select --max-zero -1': (['select', '--pool', '{d}/pool.jsonl', '--results', '{d}/verdicts.jsonl', '--out', '{d}/o.jsonl', '--max-zero', '-1'], 'argument --max-zero'),
    'select --lo > --hi': (['select', '--pool', '{d}/pool.jsonl', '--results', '{d}/verdicts.jsonl', '--out', '{d}/o.jsonl', '--lo', '0.8', '--hi', '0.5'], '--lo 0.8 --hi 0.5'),
    'select --hi 1.5': (['select', '--pool', '{d}/pool.jsonl', '--results', '{d}/verdicts.jsonl', '--out', '{d}/o.jsonl', '--hi', '1.5'], 'argument --hi'),
    'select --lo nan': (['select', '--pool', '{d}/pool.jsonl', '--results', '{d}/verdicts.jsonl', '--out', '{d}/o.jsonl', '--lo', 'nan'], 'argument --lo'),
    'sample --n 0': (['sample', '--problems', '{d}/pool.jsonl', '--model', '{d}/m', '--out', '{d}/s.jsonl', '--n', '0'], 'argument --n'),
    'sample --top-p 0': (['sample', '--problems', '{d}/pool.jsonl', '--model', '{d}/m', '--out', '{d}/s.jsonl', '--top-p', '0'], 'argument --top-p'),
    'sample --temperature inf': (['sample', '--problems', '{d}/pool.jsonl', '--model', '{d}/m', '--out', '{d}/s.jsonl', '--temperature', 'inf'], 'argument --temperature'),
    'eval --n 0': (['eval', '--problems', '{d}/pool.jsonl', '--model', '{d}/m', '--out-dir', '{d}/e', '--n', '0'], 'argument --n'),
    'eval --timeout 0': (['eval', '--problems', '{d}/pool.jsonl', '--model', '{d}/m', '--out-dir', '{d}/e', '--timeout', '0'], 'argument --timeout'),
    'sft-data --max-per-problem 0': (['sft-data', '--problems', '{d}/pool.jsonl', '--samples', '{d}/samples.jsonl', '--verdicts', '{d}/verdicts.jsonl', '--out', '{d}/o.jsonl', '--max-per-problem', '0'], 'argument --max-per-problem'),
    'train --epochs 0': (['train', '--model', '{d}/m', '--data', '{d}/samples.jsonl', '--out-dir', '{d}/t', '--epochs', '0'], 'argument --epochs'),
    'average --ft-weight 1.5': (['average', '--anchor', '{d}/a', '--finetuned', '{d}/b', '--out', '{d}/c', '--ft-weight', '1.5'], 'argument --ft-weight'),
    'average --ft-weight 1.5': (['average', '--anchor', '{d}/a', '--finetuned', '{d}/b', '--out', '{d}/c', '--ft-weight', '1.5'], 'argument --ft-weight'),
}


@pytest.mark.parametrize('case', sorted(BAD_ARGS))
def test_bad_argument(work, case):
    argv, *words = BAD_ARGS[case]
    before = snapshot(work)
    refused(ei(*[a.format(d=work) for a in argv]), before, work, *words)


# ---------------------------------------------------------------- outputs
def test_out_is_an_input_through_any_path(work):
    "The same file by inode: a hard link, a symlink, a path with `..`: refused before anything is read."
    os.link(work/'pool.jsonl', work/'hard.jsonl'); (work/'link.jsonl').symlink_to(work/'verdicts.jsonl'); (work/'sub').mkdir()
    before = snapshot(work)
    sel = ['select', '--pool', work/'pool.jsonl', '--results', work/'verdicts.jsonl', '--hi', '0.9', '--out']
    for out in (work/'hard.jsonl', work/'link.jsonl', work/'sub'/'..'/'pool.jsonl'):
        refused(ei(*sel, out), before, work, 'is the input', 'refusing to overwrite an input')
    refused(ei(*_cmd('sft-data', work, work/'verdicts.jsonl')[:-4], '--out', work/'link.jsonl', '--tokenizer', work),
            before, work, 'is the input')
    refused(ei('sample', '--problems', work/'pool.jsonl', '--model', work/'m', '--out', work/'hard.jsonl'), before, work, 'is the input')


def test_out_is_a_directory_or_below_a_file(work):
    (work/'outdir').mkdir()
    before = snapshot(work)
    sel = ['select', '--pool', work/'pool.jsonl', '--results', work/'verdicts.jsonl', '--hi', '0.9', '--out']
    refused(ei(*sel, work/'outdir'), before, work, 'outdir', 'Is a directory')
    refused(ei(*sel, work/'pool.jsonl'/'x.jsonl'), before, work, 'pool.jsonl is a file, not a directory')


def _mount_tmpfs(path: Path, opts: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which('mount'): return False
    return subprocess.run(['mount', '-t', 'tmpfs', '-o', opts, 'tmpfs', str(path)], capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    "A real 64 KiB tmpfs (full after 64 KiB), or None when this process may not mount."
    d = tmp_path/'small'
    ok = _mount_tmpfs(d, 'size=64k')
    yield d if ok else None
    if ok: subprocess.run(['umount', str(d)])


@pytest.fixture
def readonly_disk(tmp_path):
    d = tmp_path/'ro'
    ok = _mount_tmpfs(d, 'ro,size=64k')
    yield d if ok else None
    if ok: subprocess.run(['umount', str(d)])


def _big_pool(work, n=400):
    "A pool whose selection is far larger than 64 KiB (long headers)."
    pool = [{'name': f'q{i}', 'split': 'train', 'header': HEADER + '-- ' + 'h' * 400 + '\n', 'formal_statement': f'theorem q{i} : {i} = {i} := by'} for i in range(n)]
    verd = [{'name': f'q{i}', 'sample_idx': j, 'verdict': 'pass' if j == 0 else 'fail'} for i in range(n) for j in range(2)]
    (work/'bigpool.jsonl').write_bytes(rows(*pool)); (work/'bigv.jsonl').write_bytes(rows(*verd))


def test_full_disk(work, small_disk):
    "The selection does not fit: one line naming the path and 'No space left on device', exit 2; the earlier output is kept."
    _big_pool(work)
    out_dir = small_disk or work/'small'
    out_dir.mkdir(exist_ok=True)
    (out_dir/'sel.jsonl').write_text('earlier output\n')
    pre = '' if small_disk else textwrap.dedent('''
        import os, errno
        _fsync = os.fsync
        def fsync(fd):   # injected: a full disk reported at fsync (delayed allocation)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.fsync = fsync''')
    before, before_out = snapshot(work), snapshot(out_dir)
    res = ei('select', '--pool', work/'bigpool.jsonl', '--results', work/'bigv.jsonl', '--out', out_dir/'sel.jsonl', '--max-problems', '400',
             '--hi', '0.9', pre=pre)
    refused(res, before, work, str(out_dir/'sel.jsonl'), 'cannot write: No space left on device')
    assert snapshot(out_dir) == before_out   # nothing half-written, no temp file left, the earlier output intact
    assert (out_dir/'sel.jsonl').read_text() == 'earlier output\n'


def test_read_only_output(work, readonly_disk):
    pre = '' if readonly_disk else textwrap.dedent('''
        import os, errno
        _open = os.open
        def open_(path, flags, *a, **k):   # injected: a read-only filesystem refuses file creation
            if flags & os.O_CREAT and "/ro/" in str(path): raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return _open(path, flags, *a, **k)
        os.open = open_''')
    out_dir = readonly_disk or work/'ro'
    out_dir.mkdir(exist_ok=True)
    before = snapshot(work)
    res = ei('select', '--pool', work/'pool.jsonl', '--results', work/'verdicts.jsonl', '--out', out_dir/'sel.jsonl', '--hi', '0.9', pre=pre)
    refused(res, before, work, str(out_dir/'sel.jsonl'), 'cannot write: Read-only file system')


def test_stale_temp_removed_by_next_write(work):
    "A temp file left by a SIGKILLed writer (dead pid, older than this process) is removed; another target's temp is not."
    stale = work/f'.sel.jsonl.ei{2**22 + 7}.k1ll3d.tmp'; stale.write_text('half')
    other = work/f'.other.jsonl.ei{2**22 + 7}.k1ll3d.tmp'; other.write_text('half')
    for p in (stale, other): os.utime(p, (1, 1))
    res = ei('select', '--pool', work/'pool.jsonl', '--results', work/'verdicts.jsonl', '--out', work/'sel.jsonl', '--hi', '0.9')
    assert res.returncode == 0, res.stderr
    assert not stale.exists() and other.exists()


def test_sigkill_mid_write_then_rerun_cleans_up(work):
    "A real SIGKILL inside the atomic write leaves a temp file; the next run of the same command removes it."
    pre = textwrap.dedent('''
        import os, signal, ei_nb.core as core
        _fsync = os.fsync
        def fsync(fd):   # die while the temp file exists, before the rename
            os.kill(os.getpid(), signal.SIGKILL)
        os.fsync = fsync''')
    argv = ['select', '--pool', work/'pool.jsonl', '--results', work/'verdicts.jsonl', '--out', work/'sel.jsonl', '--hi', '0.9']
    assert ei(*argv, pre=pre).returncode == -9
    left = [p.name for p in work.iterdir() if p.name.startswith('.sel.jsonl.ei')]
    assert len(left) == 1 and not (work/'sel.jsonl').exists()
    assert ei(*argv).returncode == 0
    assert [p.name for p in work.iterdir() if p.name.startswith('.sel.jsonl.')] == []


# ---------------------------------------------------------------- faults vs bugs
def test_bug_keeps_its_traceback(work):
    "Only known faults are one line: a bug (here a command whose function crashes) still prints its traceback."
    pre = 'import ei_nb.cli as c\nc.COMMANDS["boom"] = ("json:loads", "a command with a bug")'
    res = ei('boom', pre=pre)
    assert res.returncode == 1 and 'Traceback' in res.stderr and 'TypeError' in res.stderr


def test_ei_debug_adds_traceback(work):
    res = ei('stats', '--verified', work/'nope.jsonl', env={'EI_DEBUG': '1'})
    assert res.returncode == 2 and 'Traceback' in res.stderr and 'nope.jsonl: no such file' in res.stderr


# ---------------------------------------------------------------- confirm registration
def test_confirm_status_detects_edited_registration(tmp_path):
    from tests.confirm_doubles import synthetic_confirmation
    from ei_nb.core import atomic_write_json
    cdir = synthetic_confirmation(tmp_path/'run', n_problems=4, n=4)
    ok = ei('confirm', 'status', '--run-dir', tmp_path/'run')
    assert json.loads(ok.stdout.splitlines()[-1])['mismatches'] == []
    reg = json.loads((cdir/'registration.json').read_text())
    atomic_write_json(cdir/'registration.json', {**reg, 'n': 2})
    st = ei('confirm', 'status', '--run-dir', tmp_path/'run')
    assert st.returncode == 3 and 'edited after registration' in st.stderr, (st.returncode, st.stderr)
    before = snapshot(tmp_path)
    res = ei('confirm', 'run', '--run-dir', tmp_path/'run', '--force-rerun', '--reason', 'x', '--no-report')
    refused(res, before, tmp_path, 'registration.json was edited after registration', rc=3)


# ---------------------------------------------------------------- run parameters
@pytest.mark.parametrize('section,key,value,words', [
    ('average', 'ft_weight', '1.5', '[average] ft_weight = 1.5'), ('select', 'lo', '0.9', '[select] lo = 0.9: must be below hi'),
    ('sample_verify', 'n', '0', '[sample_verify] n = 0'), ('eval', 'temperature', 'inf', '[eval] temperature = inf'),
    ('verify', 'timeout', '-1', '[verify] timeout = -1'), ('sft', 'warmup_ratio', '1.5', '[sft] warmup_ratio = 1.5'),
    ('report', 'alpha', '1.0', '[report] alpha = 1.0'), ('run', 'rounds', '0', '[run] rounds = 0')])
def test_validate_config_names_section_key_value(section, key, value, words):
    "`ei run` calls this before anything runs; here on configs/demo.toml with one `--set` override each."
    from ei_nb.config import load_config, validate_config
    quiet = dict(nbs=REPO/'nbs', warn=lambda *a: None)
    validate_config(load_config(REPO/'configs'/'demo.toml', **quiet))
    with pytest.raises(Exception) as e:
        validate_config(load_config(REPO/'configs'/'demo.toml', sets=[f'{section}.{key}={value}'], **quiet))
    assert words in str(e.value) and getattr(e.value, 'exit_code', None) == 2, str(e.value)

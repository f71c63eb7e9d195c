"""ei_nb.average (03_average): bit-exactness against an independent float64 reference, sharding, refusals,
crash safety, idempotence, tied embeddings, bounded memory and a round trip through transformers."""
import json, os, shutil, signal, subprocess, sys, time
from pathlib import Path

import numpy as np
import pytest

from ei_nb.average import INDEX, SINGLE, average_checkpoints, load_checkpoint, read_header, save_safetensors
from ei_nb.average_io import ALIGN
from ei_nb.average_io import kernel_name
from ei_nb.cli import main
from ei_nb.core import BadInput, sha256_file

FORMATS = {'BF16': (8, 7), 'F16': (5, 10), 'F32': (8, 23)}
ENTRY = [sys.executable, '-c', 'from ei_nb.cli import _entry; _entry()']
quiet = lambda *a: None


# ---------------------------------------------------------------- an independent reference (no bit tricks)

def decode(bits, dtype):
    "float64 values of raw bits."
    if dtype == 'BF16': return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.view({'F16': np.float16, 'F32': np.float32, 'F64': np.float64}[dtype]).astype(np.float64)


def nearest(r, dtype):
    "Bits of the representable value nearest to r (ties to even), found with frexp/floor on the target grid."
    if dtype == 'F64': return r.view(np.uint64)
    E, M = FORMATS[dtype]
    B = (1 << (E - 1)) - 1
    with np.errstate(all='ignore'):
        _, e = np.frexp(np.abs(r))
        ulp = np.ldexp(1.0, np.maximum(e - 1, 1 - B) - M)
        q = np.floor(np.abs(r) / ulp)
        k = np.abs(r) / ulp - q
        q = q + ((k > 0.5) | ((k == 0.5) & (q % 2 == 1)))
        v = np.copysign(q * ulp, r)
        v = np.where(np.abs(v) >= 2.0 ** (B + 1), np.copysign(np.inf, r), v)
    if dtype == 'BF16': return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return v.astype(np.float16).view(np.uint16) if dtype == 'F16' else v.astype(np.float32).view(np.uint32)


def reference(a, b, dtype, w):
    "Reference bits of (1-w)*a + w*b in float64, rounded once; and where it is NaN."
    with np.errstate(all='ignore'): r = (1 - w) * decode(a, dtype) + w * decode(b, dtype)
    return nearest(r, dtype), np.isnan(r)


def assert_exact(out_bits, a, b, dtype, w):
    ref, nan = reference(a, b, dtype, w)
    got_nan = np.isnan(decode(out_bits, dtype))
    bad = ((out_bits != ref) & ~nan) | (nan != got_nan)
    assert int(bad.sum()) == 0, f'{int(bad.sum())} of {bad.size} {dtype} elements differ from the float64 reference'


# ---------------------------------------------------------------- helpers

UINT = {'BF16': np.uint16, 'F16': np.uint16, 'F32': np.uint32, 'F64': np.uint64}


def weights(rng, n, dtype, specials=True):
    "Raw bits of n realistic weights (std 0.02), with arbitrary bit patterns (NaN, inf, subnormals, -0) mixed in."
    x = rng.standard_normal(n) * 0.02
    if dtype == 'BF16': bits = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    else: bits = x.astype({'F16': np.float16, 'F32': np.float32, 'F64': np.float64}[dtype]).view(UINT[dtype])
    if specials:
        k = min(n, 5000)
        bits[:k] = rng.integers(0, np.iinfo(bits.dtype).max, k, dtype=bits.dtype, endpoint=True)
    return bits


def make_model(d, tensors, shards=0, config=None, reverse=True):
    "A model dir from {name: (dtype, bits)}; `shards` > 0 splits it (tensor order reversed inside each shard)."
    d = Path(d); d.mkdir(parents=True, exist_ok=True)
    (d / 'config.json').write_text(json.dumps(config or {'tie_word_embeddings': False}))
    (d / 'tokenizer.json').write_text('{"fake": true}')
    if not shards:
        save_safetensors(d / SINGLE, tensors, {'format': 'pt'}); return d
    names, wm = list(tensors), {}
    for i, part in enumerate(np.array_split(np.arange(len(names)), shards)):
        fn = f'model-{i + 1:05d}-of-{shards:05d}.safetensors'
        save_safetensors(d / fn, {names[j]: tensors[names[j]] for j in (part[::-1] if reverse else part)}, {'format': 'pt'})
        wm.update({names[j]: fn for j in part})
    (d / INDEX).write_text(json.dumps({'metadata': {'total_size': 1}, 'weight_map': wm}))
    return d


def tensor_bits(d, name):
    r = load_checkpoint(d).tensors[name]
    with open(r.path, 'rb') as f: f.seek(r.start); raw = f.read(r.nbytes)
    return np.frombuffer(raw, UINT[r.dtype])


def leftovers(parent):
    return [p.name for p in Path(parent).iterdir() if '.avg-' in p.name]


def cli(capsys, *argv):
    rc = main(['average', *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------- bit-exactness

@pytest.fixture(scope='module')
def pairs(tmp_path_factory):
    "Per dtype: an anchor (one file) and a fine-tuned model (3 shards), ~1M-element tensors, specials included."
    root, rng, out = tmp_path_factory.mktemp('pairs'), np.random.default_rng(0), {}
    for dtype in ('BF16', 'F16', 'F32'):
        shapes = {'big.weight': (1024, 1025), 'odd.weight': (3, 333), 'small.bias': (7,), 'mid.weight': (517, 129)}
        a = {k: (dtype, weights(rng, int(np.prod(s)), dtype).reshape(s)) for k, s in shapes.items()}
        f = {k: (dtype, weights(rng, int(np.prod(s)), dtype).reshape(s)) for k, s in shapes.items()}
        out[dtype] = (make_model(root / dtype / 'anchor', a), make_model(root / dtype / 'ft', f, shards=3), a, f)
    return out


@pytest.mark.parametrize('dtype', ['BF16', 'F16', 'F32'])
@pytest.mark.parametrize('w', [0.7, 1 / 3, 0.5, 0.05])
@pytest.mark.parametrize('chunk', [ALIGN, 3 * ALIGN, 4 << 20])
def test_bit_exact(pairs, tmp_path, dtype, w, chunk):
    A, F, a, f = pairs[dtype]
    r = average_checkpoints(A, F, tmp_path / 'out', w, threads=3, chunk=chunk, log=quiet)
    assert r['tensors'] == 4 and not r['skipped']
    for name in a:
        assert_exact(tensor_bits(tmp_path / 'out', name), a[name][1].reshape(-1), f[name][1].reshape(-1), dtype, w)


@pytest.mark.parametrize('kernel,direct', [('numpy', True), ('c', False), ('auto', True)])
def test_kernels_and_io_paths_agree(pairs, tmp_path, kernel, direct):
    "The numpy fallback, the C kernel, buffered and O_DIRECT I/O all write the same bytes."
    A, F, a, f = pairs['BF16']
    r = average_checkpoints(A, F, tmp_path / 'out', 1 / 3, threads=2, chunk=2 * ALIGN, kernel=kernel, direct=direct, log=quiet)
    ref = average_checkpoints(A, F, tmp_path / 'ref', 1 / 3, log=quiet)
    assert [s['sha256'] for s in r['shards']] == [s['sha256'] for s in ref['shards']]
    for name in a: assert_exact(tensor_bits(tmp_path / 'out', name), a[name][1].reshape(-1), f[name][1].reshape(-1), 'BF16', 1 / 3)


def test_cold_inputs_read_with_o_direct(pairs, tmp_path):
    "Inputs evicted from the page cache take the O_DIRECT path and give the same bytes as cached ones."
    A, F, a, f = pairs['F16']
    hot = average_checkpoints(A, F, tmp_path / 'hot', 0.7, log=quiet)
    for p in list(Path(A).glob('*.safetensors')) + list(Path(F).glob('*.safetensors')):
        fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    cold = average_checkpoints(A, F, tmp_path / 'cold', 0.7, log=quiet)
    assert [s['sha256'] for s in hot['shards']] == [s['sha256'] for s in cold['shards']]


def test_portable_c_kernel_is_exact(pairs, tmp_path):
    "The kernel built without AVX2 (what other CPUs run: scalar C) gives the same bits as the reference."
    import ctypes, shutil as sh
    from ei_nb.average_io import DTYPE_KIND
    from ei_nb.ckernel import kernel_source
    if not sh.which('gcc'): pytest.skip('no gcc')
    (tmp_path / 'k.c').write_text(kernel_source('average'))
    subprocess.run(['gcc', '-O3', '-ffp-contract=off', '-shared', '-fPIC', '-o', str(tmp_path / 'k.so'), str(tmp_path / 'k.c')], check=True)
    lib = ctypes.CDLL(str(tmp_path / 'k.so'))
    lib.ei_avg.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_double, ctypes.c_double, ctypes.c_void_p]
    assert lib.ei_avg_simd() == 0
    for dtype in ('BF16', 'F16', 'F32'):
        _, _, a, f = pairs[dtype]
        x, y = a['big.weight'][1].reshape(-1), f['big.weight'][1].reshape(-1)
        for w in (0.7, 1 / 3):
            out = y.copy()
            lib.ei_avg(DTYPE_KIND[dtype], 0, x.ctypes.data, out.ctypes.data, x.size, 1 - w, w, None)
            assert_exact(out, x, y, dtype, w)


def test_reference_catches_double_rounding(pairs):
    "The data is large enough that rounding through float32 (torch's casts, any float32 path) is caught."
    import torch
    _, _, a, f = pairs['BF16']
    x, y = a['big.weight'][1].reshape(-1)[5000:], f['big.weight'][1].reshape(-1)[5000:]
    for w in (0.7, 1 / 3):
        ref, _ = reference(x, y, 'BF16', w)
        r64 = (1 - w) * torch.from_numpy(decode(x, 'BF16')) + w * torch.from_numpy(decode(y, 'BF16'))
        torch_cast = r64.to(torch.bfloat16).view(torch.uint16).numpy()
        f32 = r64.float().to(torch.bfloat16).view(torch.uint16).numpy()
        assert (torch_cast != ref).sum() > 0 and (f32 != ref).sum() > 0
    _, _, a, f = pairs['F16']
    x, y = a['big.weight'][1].reshape(-1)[5000:], f['big.weight'][1].reshape(-1)[5000:]
    ref, _ = reference(x, y, 'F16', 1 / 3)
    r64 = (2 / 3) * torch.from_numpy(decode(x, 'F16')) + (1 / 3) * torch.from_numpy(decode(y, 'F16'))
    assert (r64.to(torch.float16).view(torch.uint16).numpy() != ref).sum() > 0


def test_elements_split_across_windows(tmp_path):
    "A 4- or 8-byte element cut by a window edge (after an odd-length bf16 tensor) is still exact."
    rng = np.random.default_rng(3)
    mk = lambda: {'a': ('BF16', weights(rng, 1001, 'BF16')), 'b': ('F32', weights(rng, 3001, 'F32')),
                  'c': ('BF16', weights(rng, 3, 'BF16')), 'd': ('F64', weights(rng, 2049, 'F64', specials=False)),
                  'e': ('F16', weights(rng, 5000, 'F16'))}
    a, f = mk(), mk()
    A, F = make_model(tmp_path / 'a', a), make_model(tmp_path / 'f', f)
    assert read_header(F / SINGLE)[1] % 4 == 0 and (1001 * 2) % 4 == 2      # so 'b' starts off its 4-byte grid
    for w in (0.7, 1 / 3):
        out = tmp_path / f'o{w:.2f}'
        average_checkpoints(A, F, out, w, chunk=ALIGN, threads=4, log=quiet)
        for name, (dt, bits) in a.items():
            assert_exact(tensor_bits(out, name), bits, f[name][1], dt, w)


def test_weights_zero_and_one_copy_bytes(pairs, tmp_path):
    A, F, a, f = pairs['BF16']
    average_checkpoints(A, F, tmp_path / 'one', 1.0, log=quiet)
    for fn in load_checkpoint(F).files: assert sha256_file(tmp_path / 'one' / fn) == sha256_file(Path(F) / fn)
    average_checkpoints(A, F, tmp_path / 'zero', 0.0, log=quiet)
    for name in a: assert (tensor_bits(tmp_path / 'zero', name) == a[name][1].reshape(-1)).all()


# ---------------------------------------------------------------- layout

def test_output_follows_finetuned_sharding(tmp_path):
    rng = np.random.default_rng(4)
    t = lambda *s: ('BF16', weights(rng, int(np.prod(s)), 'BF16').reshape(s))
    names = [f'layer{i}.weight' for i in range(7)]
    a = {n: t(64, 33 + i) for i, n in enumerate(names)}
    f = {n: t(64, 33 + i) for i, n in enumerate(names)}
    A1, A4 = make_model(tmp_path / 'a1', a), make_model(tmp_path / 'a4', a, shards=4)
    F3, F1 = make_model(tmp_path / 'f3', f, shards=3, reverse=False), make_model(tmp_path / 'f1', f)
    from safetensors import safe_open
    for A, F, out in ((A1, F3, tmp_path / 'o3'), (A4, F1, tmp_path / 'o1'), (A4, F3, tmp_path / 'o43')):
        average_checkpoints(A, F, out, 0.7, chunk=ALIGN, log=quiet)
        got, ft = load_checkpoint(out), load_checkpoint(F)
        assert got.files == ft.files
        for fn in ft.files: assert read_header(out / fn) == read_header(Path(F) / fn)
        if ft.index:
            idx = json.loads((out / INDEX).read_text())
            assert idx['weight_map'] == ft.index['weight_map']
            assert idx['metadata']['total_size'] == sum(r.nbytes for r in got.tensors.values())
        else:
            assert not (out / INDEX).exists()
        for n in names:
            assert_exact(tensor_bits(out, n), a[n][1].reshape(-1), f[n][1].reshape(-1), 'BF16', 0.7)
            with safe_open(got.tensors[n].path, 'pt') as fh: assert tuple(fh.get_tensor(n).shape) == a[n][1].shape
        assert (out / 'tokenizer.json').exists() and (out / 'config.json').exists()
        rec = json.loads((out / 'average.json').read_text())
        assert rec['ft_weight'] == 0.7 and [s['file'] for s in rec['shards']] == ft.files
        assert all(s['sha256'] == sha256_file(out / s['file']) for s in rec['shards'])


# ---------------------------------------------------------------- refusals

@pytest.fixture
def small(tmp_path):
    rng = np.random.default_rng(5)
    t = lambda *s: ('BF16', weights(rng, int(np.prod(s)), 'BF16').reshape(s))
    base = {'x.weight': t(8, 8), 'y.weight': t(8)}
    return tmp_path, make_model(tmp_path / 'anchor', base), base, t


@pytest.mark.parametrize('case,message', [
    ('extra', 'tensor z.weight is in the fine-tuned model but not in the anchor'),
    ('missing', 'tensor y.weight is in the anchor but not in the fine-tuned model'),
    ('shape', 'tensor x.weight: shape [8, 8] in the anchor, [8, 4] in the fine-tuned model'),
    ('dtype', 'tensor x.weight: dtype BF16 in the anchor, F16 in the fine-tuned model'),
    ('int', 'tensor y.weight has dtype I64: only floating tensors'),
])
def test_refusals(small, capsys, case, message):
    tmp, A, base, t = small
    ft = dict(base)
    if case == 'extra': ft['z.weight'] = t(2)
    if case == 'missing': del ft['y.weight']
    if case == 'shape': ft['x.weight'] = t(8, 4)
    if case == 'dtype': ft['x.weight'] = ('F16', np.zeros((8, 8), np.uint16))
    if case == 'int':
        ft['y.weight'] = ('I64', np.arange(8, dtype=np.int64)); A = make_model(tmp / 'anchor_int', ft)
    F = make_model(tmp / 'ft', ft, shards=2)
    rc, out, err = cli(capsys, '--anchor', A, '--finetuned', F, '--out', tmp / 'out')
    assert rc == 2 and message in err and out == ''
    assert not (tmp / 'out').exists() and leftovers(tmp) == []


def test_refuses_bad_arguments(small, capsys):
    tmp, A, base, t = small
    assert cli(capsys, '--anchor', A, '--finetuned', A, '--out', tmp / 'o', '--ft-weight', '1.5')[0] == 2
    assert cli(capsys, '--anchor', A, '--finetuned', tmp / 'nope', '--out', tmp / 'o')[0] == 2
    assert cli(capsys, '--anchor', A, '--finetuned', A, '--out', A)[0] == 2
    (tmp / 'busy').mkdir(); (tmp / 'busy' / 'keep.txt').write_text('mine')
    rc, _, err = cli(capsys, '--anchor', A, '--finetuned', A, '--out', tmp / 'busy')
    assert rc == 2 and 'not an earlier average' in err and (tmp / 'busy' / 'keep.txt').exists()
    assert cli(capsys, '--anchor', A, '--finetuned', A, '--out', tmp / 'busy', '--force')[0] == 0
    assert not (tmp / 'busy' / 'keep.txt').exists() and (tmp / 'busy' / SINGLE).exists()
    assert not (tmp / 'o').exists() and leftovers(tmp) == []


# ---------------------------------------------------------------- crash safety and idempotence

@pytest.fixture(scope='module')
def medium(tmp_path_factory):
    "Two 32 MB bf16 models: long enough to interrupt with 4 KiB windows and the numpy kernel."
    root, rng = tmp_path_factory.mktemp('medium'), np.random.default_rng(6)
    mk = lambda: {f'w{i}': ('BF16', weights(rng, 4 << 20, 'BF16', specials=False)) for i in range(4)}
    return make_model(root / 'a', mk()), make_model(root / 'f', mk(), shards=2)


def _start_slow(A, F, out):
    env = dict(os.environ, EI_AVERAGE_KERNEL='numpy')
    return subprocess.Popen(ENTRY + ['average', '--anchor', str(A), '--finetuned', str(F), '--out', str(out),
                                     '--threads', '1', '--chunk-kib', '4'], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for_tmp(parent, proc, timeout=60):
    t = time.time()
    while time.time() - t < timeout and proc.poll() is None:
        if leftovers(parent): time.sleep(0.3); return True
        time.sleep(0.005)
    return False


@pytest.mark.parametrize('sig', [signal.SIGKILL, signal.SIGTERM])
def test_killed_midway_leaves_nothing_at_out(medium, tmp_path, sig):
    A, F = medium
    out = tmp_path / 'model'
    p = _start_slow(A, F, out)
    assert _wait_for_tmp(tmp_path, p), 'the run finished before it could be interrupted'
    assert p.poll() is None
    p.send_signal(sig); p.wait(60)
    assert not out.exists()
    if sig == signal.SIGTERM:
        assert p.returncode == 143 and leftovers(tmp_path) == []      # cleaned up on the way out
    else:
        assert leftovers(tmp_path)                                      # a dead process's temp dir, beside out
    r = average_checkpoints(A, F, out, 0.7, log=quiet)                   # the next run works and sweeps it
    assert not r['skipped'] and leftovers(tmp_path) == []
    assert sorted(p.name for p in out.iterdir()) == sorted(['average.json', 'config.json', 'tokenizer.json', INDEX]
                                                          + load_checkpoint(F).files)


def test_idempotent(medium, tmp_path, capsys):
    A, F = medium
    out = tmp_path / 'model'
    rc, o1, _ = cli(capsys, '--anchor', A, '--finetuned', F, '--out', out)
    first = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    rc2, o2, err = cli(capsys, '--anchor', A, '--finetuned', F, '--out', out)
    assert rc == rc2 == 0 and 'already holds this average' in err and 'skipping' in err
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == first
    r1, r2 = json.loads(o1.splitlines()[-1]), json.loads(o2.splitlines()[-1])
    assert list(r1) == ['tensors', 'bytes_written', 'seconds', 'gb_per_s'] and r1['bytes_written'] > 0 and r2['bytes_written'] == 0
    # a damaged output is not trusted: it is recomputed, to the same bytes
    shard = out / load_checkpoint(F).files[0]
    data = bytearray(shard.read_bytes()); data[-1] ^= 1; shard.write_bytes(bytes(data))
    r3 = average_checkpoints(A, F, out, 0.7, log=quiet)
    assert not r3['skipped'] and shard.read_bytes() == first[shard.name][0]
    # another weight replaces an earlier average
    r4 = average_checkpoints(A, F, out, 0.5, log=quiet)
    assert not r4['skipped'] and json.loads((out / 'average.json').read_text())['ft_weight'] == 0.5
    assert leftovers(tmp_path) == []


def test_memory_is_bounded_by_the_buffers_not_the_model(tmp_path):
    "A 128 MB tensor averages in under 100 MiB of memory (peak RSS read from /proc in the child)."
    rng = np.random.default_rng(7)
    mk = lambda: {'huge': ('BF16', rng.integers(0x3c00, 0x3d00, 64 << 20, dtype=np.uint16))}
    A, F = make_model(tmp_path / 'a', mk()), make_model(tmp_path / 'f', mk())
    code = ('import re, sys; from ei_nb.average import average_checkpoints; '
            f'average_checkpoints({str(A)!r}, {str(F)!r}, {str(tmp_path / "o")!r}, 0.7, threads=2, chunk=4 << 20, log=lambda *a: None); '
            'print(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))')
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    peak_mib = int(p.stdout.split()[-1]) / 1024
    assert peak_mib < 100, f'peak RSS {peak_mib:.0f} MiB for a 128 MB tensor'


# ---------------------------------------------------------------- tiny Qwen3 models: tied weights, transformers

@pytest.fixture(scope='module')
def qwen(tmp_path_factory):
    "Tiny bf16 Qwen3 models, tied and untied, two seeds each."
    from ei_nb.tiny import build_tiny_model
    root = tmp_path_factory.mktemp('qwen')
    return {(tied, seed): build_tiny_model(root / f'{"tied" if tied else "untied"}{seed}', seed=seed, tie_word_embeddings=tied,
                                           dtype='bfloat16', vocab_size=256)
            for tied in (True, False) for seed in (0, 1)}


def _load(d):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)


def _expected(anchor_sd, ft_sd, name, w):
    import torch
    a = anchor_sd.get(name, anchor_sd.get('model.embed_tokens.weight') if name == 'lm_head.weight' else None)
    bits = lambda t: t.contiguous().view(torch.uint16).numpy().reshape(-1)
    return nearest((1 - w) * decode(bits(a), 'BF16') + w * decode(bits(ft_sd[name]), 'BF16'), 'BF16')


@pytest.mark.parametrize('anchor_tied,ft_tied', [(True, True), (False, False), (True, False)])
def test_tied_embeddings_round_trip(qwen, tmp_path, anchor_tied, ft_tied):
    "Averaged tiny Qwen3 models load with from_pretrained, tied as transformers ties them, every weight exact."
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer
    A, F, out, w = qwen[anchor_tied, 0], qwen[ft_tied, 1], tmp_path / 'avg', 0.7
    r = average_checkpoints(A, F, out, w, log=quiet)
    names = set(load_checkpoint(out).tensors)
    assert ('lm_head.weight' in names) == (not ft_tied)
    assert any('ties it to model.embed_tokens.weight' in n for n in r['tied']) == (anchor_tied and not ft_tied)
    m = _load(out)
    sd = m.state_dict()
    a_sd, f_sd = load_file(A / SINGLE), load_file(F / SINGLE)
    for name in names: assert (sd[name].view(torch.uint16).numpy().reshape(-1) == _expected(a_sd, f_sd, name, w)).all(), name
    head, emb = m.get_output_embeddings().weight, m.get_input_embeddings().weight
    assert (head.data_ptr() == emb.data_ptr()) == ft_tied
    if not ft_tied: assert (head.view(torch.uint16).numpy().reshape(-1) == _expected(a_sd, f_sd, 'lm_head.weight', w)).all()
    tok = AutoTokenizer.from_pretrained(out)
    with torch.no_grad(): logits = m(**tok(['theorem foo : 1 + 1 = 2 := by'], return_tensors='pt')).logits
    assert torch.isfinite(logits).all()


def test_untied_anchor_with_tied_finetuned(qwen, tmp_path):
    "The output (tied, like the fine-tuned model) holds one matrix: accepted only if the anchor's two are identical."
    import torch
    from safetensors.torch import load_file, save_file
    A, F = qwen[False, 0], qwen[True, 1]
    with pytest.raises(BadInput, match='lm_head.weight: the fine-tuned model ties it to model.embed_tokens.weight'):
        average_checkpoints(A, F, tmp_path / 'refused', 0.7, log=quiet)
    assert not (tmp_path / 'refused').exists()
    same = tmp_path / 'anchor_same'; shutil.copytree(A, same)
    sd = load_file(same / SINGLE); sd['lm_head.weight'] = sd['model.embed_tokens.weight'].clone()
    save_file(sd, str(same / SINGLE), {'format': 'pt'})
    r = average_checkpoints(same, F, tmp_path / 'ok', 0.7, log=quiet)
    assert 'lm_head.weight' not in load_checkpoint(tmp_path / 'ok').tensors and any('not written' in n for n in r['tied'])
    assert torch.isfinite(_load(tmp_path / 'ok').lm_head.weight.float()).all()


def test_float32_model_round_trip(tiny_model_dir, tmp_path):
    "The conftest's float32 tiny model averaged with a perturbed copy: F32 path exact, loads with transformers."
    import torch
    from safetensors.torch import load_file, save_file
    F = tmp_path / 'ft'; shutil.copytree(tiny_model_dir, F)
    sd = load_file(F / SINGLE); g = torch.Generator().manual_seed(0)
    save_file({k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in sd.items()}, str(F / SINGLE), {'format': 'pt'})
    average_checkpoints(tiny_model_dir, F, tmp_path / 'avg', 1 / 3, log=quiet)
    a_sd, f_sd, m = load_file(tiny_model_dir / SINGLE), load_file(F / SINGLE), _load(tmp_path / 'avg')
    out = load_file(tmp_path / 'avg' / SINGLE)
    for k in a_sd:
        x, y = a_sd[k].view(torch.int32).numpy().view(np.uint32).reshape(-1), f_sd[k].view(torch.int32).numpy().view(np.uint32).reshape(-1)
        assert_exact(out[k].view(torch.int32).numpy().view(np.uint32).reshape(-1), x, y, 'F32', 1 / 3)
    assert m is not None


# ---------------------------------------------------------------- the kernel cache loads nothing it cannot vouch for

PLANTED_C = r'''
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
__attribute__((constructor)) static void planted(void) {
  const char *p = getenv("EI_PLANTED_MARKER");
  if (p) { FILE *f = fopen(p, "w"); if (f) { fputs("the planted library ran\n", f); fclose(f); } }
}
int ei_avg_simd(void) { return 1; }
int ei_avg(int kind, int mode, const void *a, void *b, size_t n, double ca, double cb, double *s) { return 0; }
'''

# averages 1.0 and 2.0 (bf16) with weight 0.5 through the C kernel: 1.5 is 0x3fc0; the planted ei_avg leaves 0x4000
PROBE = ('import json, numpy as np; from ei_nb.average import avg_into; from ei_nb.average_io import kernel_name; '
         'a, b = np.full(8, 0x3f80, np.uint16), np.full(8, 0x4000, np.uint16); name = kernel_name("c"); '
         'avg_into("BF16", a.view(np.uint8), b.view(np.uint8), 0.5, kernel="c"); '
         'print(json.dumps({"kernel": name, "out": int(b[0])}))')


@pytest.fixture
def planted(tmp_path):
    "A shared library whose constructor writes a marker file: what another local user would plant."
    cc = shutil.which('cc') or shutil.which('gcc')
    if not cc: pytest.skip('no C compiler: cannot build the planted library (and the numpy path loads nothing)')
    (tmp_path / 'planted.c').write_text(PLANTED_C)
    so = tmp_path / 'planted.so'
    subprocess.run([cc, '-shared', '-fPIC', '-o', str(so), str(tmp_path / 'planted.c')], check=True, capture_output=True)
    return so


def _probe(tmp_path, cache):
    env = dict(os.environ, EI_CACHE=str(cache), TMPDIR=str(tmp_path / 'tmp'), EI_PLANTED_MARKER=str(tmp_path / 'marker'))
    env.pop('EI_AVERAGE_KERNEL', None)
    p = subprocess.run([sys.executable, '-c', PROBE], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def _old_names():
    "The file names the old cache used, computed its way: sha256 of source, compiler, flags and CPU flags."
    from ei_nb.ckernel import kernel_source
    try: cpu = next((l for l in open('/proc/cpuinfo') if l.startswith(('flags', 'Features'))), '')
    except OSError: cpu = ''
    base = ['-O3', '-ffp-contract=off', '-fno-fast-math', '-shared', '-fPIC']
    return [f'average-{__import__("hashlib").sha256(chr(10).join([kernel_source("average"), os.environ.get("CC", "gcc"), *base, *f, cpu]).encode()).hexdigest()[:16]}'
            for f in (['-march=native'], [])]


def _plant(d, so):
    "Put the planted library under every name the cache could look for, each with a record that matches it."
    for stem in _old_names():
        shutil.copy(so, d / f'{stem}.so')
        (d / f'{stem}.json').write_text(json.dumps({'sha256': sha256_file(so)}))


@pytest.mark.parametrize('how', ['world-writable', 'other-uid', 'symlink'])
def test_planted_library_in_the_old_tmp_path_is_not_loaded(planted, tmp_path, how):
    "Home cache unusable (its parent is a file); a library planted in the old predictable $TMPDIR path is never loaded."
    (tmp_path / 'tmp').mkdir(); (tmp_path / 'home').write_text('a file, so no cache can be made under it')
    old = tmp_path / 'tmp' / f'ei_nb-kernels-{os.getuid()}'
    target = tmp_path / 'elsewhere' if how == 'symlink' else old
    target.mkdir(mode=0o700)
    _plant(target, planted)
    if how == 'world-writable': os.chmod(old, 0o777)
    if how == 'symlink': os.symlink(target, old)
    if how == 'other-uid':
        if os.getuid() != 0: pytest.skip('giving the directory to another uid needs root')
        os.chown(old, 65534, 65534); os.chmod(old, 0o755)
    before = sorted(p.name for p in target.iterdir())
    r = _probe(tmp_path, tmp_path / 'home' / 'cache')
    assert not (tmp_path / 'marker').exists(), 'the planted library was loaded'
    assert r == {'kernel': r['kernel'], 'out': 0x3fc0} and r['kernel'] in ('avx2', 'c')   # a kernel we built ourselves
    assert sorted(p.name for p in target.iterdir()) == before                            # their files left alone
    assert sorted(p.name for p in (tmp_path / 'tmp').iterdir()) == [old.name]             # our fresh build removed


def test_world_writable_home_cache_is_refused(planted, tmp_path):
    "A cache dir that others can write to is not used, not even its library with a matching record; nor is it 'fixed'."
    (tmp_path / 'tmp').mkdir()
    cache = tmp_path / 'cache'; (cache / 'kernels').mkdir(parents=True)
    _plant(cache / 'kernels', planted); os.chmod(cache / 'kernels', 0o777)
    r = _probe(tmp_path, cache)
    assert not (tmp_path / 'marker').exists() and r['out'] == 0x3fc0
    assert os.stat(cache / 'kernels').st_mode & 0o777 == 0o777


def test_tampered_cached_library_is_rebuilt_not_loaded(planted, tmp_path):
    (tmp_path / 'tmp').mkdir()
    cache = tmp_path / 'cache'
    assert _probe(tmp_path, cache)['out'] == 0x3fc0                                       # builds and records
    kdir = cache / 'kernels'
    assert os.stat(kdir).st_mode & 0o777 == 0o700
    libs = sorted(kdir.glob('average-*.so'))
    assert libs and all(json.loads(p.with_suffix('.json').read_text())['sha256'] == sha256_file(p) for p in libs)
    for p in libs: shutil.copy(planted, p)                                                # swapped, record kept
    r = _probe(tmp_path, cache)
    assert not (tmp_path / 'marker').exists(), 'the tampered library was loaded'
    assert r['out'] == 0x3fc0
    for p in libs:
        assert sha256_file(p) != sha256_file(planted)                                     # rebuilt in place
        assert json.loads(p.with_suffix('.json').read_text())['sha256'] == sha256_file(p)

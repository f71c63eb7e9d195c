"""Benchmark: `ei average` against mergekit's `linear` merge and a naive torch baseline, side by side, cold cache.

Builds two bf16 checkpoints with Llama-7B-shaped layers (embedding + 3 decoder layers + final norm, tied head:
1.48 GB each, random weights), sharded differently (4 shards each), then runs in fresh subprocesses, dropping the
page cache before each run (where permitted: root):

- `io`:       the I/O lower bound: read both checkpoints, then write one of the same size, O_DIRECT (best of 2 and 8
              threads for each), so the bound is the sum of the two times;
- `ei`:       `ei average --anchor A --finetuned F --ft-weight 0.7 --out O`;
- `mergekit`: `mergekit-yaml CONFIG O --no-copy-tokenizer` with `merge_method: linear` (weights 0.3 / 0.7);
- `naive`:    `safetensors.torch.load_file` both models, average in torch float32, `save_file` each shard.

Prints a table (seconds, GB/s, peak RSS, ratio to mergekit and to the I/O bound), how many bf16 elements of
each output differ from the float64 reference (rounded once), and the projected time for an 8B model (16.4 GB).

    python bench/bench_average.py [--workdir DIR] [--repeats 3] [--baseline-repeats 1] [--threads N] [--mergekit PATH] [--layers 3]

mergekit pins its own transformers, so install it in a separate venv:
`python -m venv /tmp/mk && /tmp/mk/bin/pip install torch==2.13.0 mergekit` (the default --mergekit path).
"""
import argparse, json, os, shutil, statistics, struct, subprocess, sys, tempfile, threading, time, mmap
from pathlib import Path

HIDDEN, INTER, VOCAB, LAYERS = 4096, 11008, 32000, 3
GB8B = 16.4e9


def shapes():
    yield 'model.embed_tokens.weight', (VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f'model.layers.{i}.'
        yield p + 'input_layernorm.weight', (HIDDEN,)
        for n in 'qkvo': yield p + f'self_attn.{n}_proj.weight', (HIDDEN, HIDDEN)
        yield p + 'post_attention_layernorm.weight', (HIDDEN,)
        yield p + 'mlp.gate_proj.weight', (INTER, HIDDEN)
        yield p + 'mlp.up_proj.weight', (INTER, HIDDEN)
        yield p + 'mlp.down_proj.weight', (HIDDEN, INTER)
    yield 'model.norm.weight', (HIDDEN,)


def config():
    return {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_size': HIDDEN, 'intermediate_size': INTER,
            'num_hidden_layers': LAYERS, 'num_attention_heads': 32, 'num_key_value_heads': 32, 'vocab_size': VOCAB,
            'max_position_embeddings': 4096, 'rms_norm_eps': 1e-5, 'hidden_act': 'silu', 'tie_word_embeddings': True,
            'torch_dtype': 'bfloat16', 'dtype': 'bfloat16', 'bos_token_id': 1, 'eos_token_id': 2, 'rope_theta': 10000.0}


def write_checkpoint(d: Path, seed: int, n_shards: int, shift: float):
    "Random bf16 weights (std 0.02, norms near 1), split into `n_shards` at boundaries shifted by `shift` of a shard."
    import numpy as np
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(1 << 24, dtype=np.float32) * 0.02).view(np.uint32) >> 16
    pool = pool.astype(np.uint16)
    items = list(shapes())
    sizes = [2 * int(np.prod(s)) for _, s in items]
    total, shards, cur, acc = sum(sizes), [[]], 0, 0
    bounds = [(k + shift) * total / n_shards for k in range(1, n_shards)]
    for (name, shape), n in zip(items, sizes):
        if len(shards) <= len(bounds) and acc + n / 2 > bounds[len(shards) - 1] and shards[-1]: shards.append([])
        shards[-1].append((name, shape)); acc += n
    d.mkdir(parents=True, exist_ok=True)
    wm = {}
    for k, part in enumerate(shards):
        fn = f'model-{k + 1:05d}-of-{len(shards):05d}.safetensors'
        header, pos = {'__metadata__': {'format': 'pt'}}, 0
        for name, shape in part:
            n = 2 * int(np.prod(shape)); header[name] = {'dtype': 'BF16', 'shape': list(shape), 'data_offsets': [pos, pos + n]}; pos += n
            wm[name] = fn
        raw = json.dumps(header, separators=(',', ':')).encode(); raw += b' ' * (-len(raw) % 8)
        with open(d / fn, 'wb') as f:
            f.write(struct.pack('<Q', len(raw)) + raw)
            for name, shape in part:
                n = int(np.prod(shape))
                for i in range(0, n, 1 << 22):
                    m = min(1 << 22, n - i)
                    o = int(rng.integers(0, pool.size - m))
                    x = pool[o:o + m] ^ rng.integers(0, 8, m, dtype=np.uint16)
                    if len(shape) == 1: x = (x & 0x007f) | 0x3f80        # norm weights: 1.0 .. 2.0
                    f.write(x.tobytes())
    (d / 'model.safetensors.index.json').write_text(json.dumps({'metadata': {'total_size': total}, 'weight_map': wm}, indent=2))
    (d / 'config.json').write_text(json.dumps(config(), indent=2))
    return total


def drop_caches():
    subprocess.run(['sync'])
    try: Path('/proc/sys/vm/drop_caches').write_text('3\n'); return True
    except OSError: return False


# A child forked from this (large) process would report this process's RSS as its own peak (Linux keeps the
# high-water mark across fork and exec), so each run is started by this small launcher, which reports its child's.
LAUNCH = """import os, sys, time
t = time.perf_counter(); pid = os.fork()
if pid == 0: os.execvp(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
sys.stderr.write(f'\\n__bench__ {time.perf_counter() - t} {ru.ru_maxrss}\\n'); sys.exit(os.waitstatus_to_exitcode(status))"""


def run(cmd, env=None):
    "Run `cmd`; wall seconds, peak RSS (MiB) of its process, exit status, stdout, stderr."
    p = subprocess.run([sys.executable, '-S', '-c', LAUNCH, *cmd], capture_output=True, env=env)
    err = p.stderr.decode(errors='replace')
    line = [l for l in err.splitlines() if l.startswith('__bench__ ')]
    if not line: return float('nan'), float('nan'), p.returncode or 1, p.stdout.decode(errors='replace'), err
    _, dt, kib = line[-1].split()
    return float(dt), int(kib) / 1024, p.returncode, p.stdout.decode(errors='replace'), err


def child_io(a: str, f: str, size: int, out: str, chunk: int = 8 << 20):
    "Read every weight file of both dirs, then write `size` bytes, O_DIRECT; the best of 2 and 8 threads for each."
    jobs = [(p, o) for d in (a, f) for p in sorted(Path(d).glob('*.safetensors')) for o in range(0, p.stat().st_size, chunk)]
    def pool(fn, items, threads):
        it, lock = iter(items), threading.Lock()
        def w():
            buf = mmap.mmap(-1, chunk); buf.write(b'\1' * chunk)
            while True:
                with lock: x = next(it, None)
                if x is None: return
                fn(buf, x)
        ts = [threading.Thread(target=w) for _ in range(threads)]
        for t in ts: t.start()
        for t in ts: t.join()
    fds = {}
    def rd(buf, x):
        p, o = x
        os.preadv(fds[p], [buf], o)
    for p, _ in jobs: fds.setdefault(p, os.open(p, os.O_RDONLY | os.O_DIRECT))
    t_read = t_write = float('inf')
    for threads in (2, 8):
        t0 = time.perf_counter(); pool(rd, jobs, threads); t_read = min(t_read, time.perf_counter() - t0)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        t0 = time.perf_counter()
        pool(lambda buf, o: os.pwrite(fd, buf, o), range(0, -(-size // chunk) * chunk, chunk), threads)
        os.fsync(fd); os.close(fd); t_write = min(t_write, time.perf_counter() - t0)
        os.unlink(out)
    read_bytes = sum(p.stat().st_size for p in fds)
    print(json.dumps({'read_s': t_read, 'write_s': t_write, 'read_gbps': read_bytes / t_read / 1e9, 'write_gbps': size / t_write / 1e9}))


def child_naive(a: str, f: str, out: str, w: float):
    import torch
    from safetensors.torch import load_file, save_file
    A = {k: v for p in sorted(Path(a).glob('*.safetensors')) for k, v in load_file(p).items()}
    F = {p.name: load_file(p) for p in sorted(Path(f).glob('*.safetensors'))}
    Path(out).mkdir()
    for name, sd in F.items():
        save_file({k: ((1 - w) * A[k].float() + w * v.float()).to(v.dtype) for k, v in sd.items()}, str(Path(out) / name), {'format': 'pt'})
    shutil.copy(Path(f) / 'model.safetensors.index.json', out); shutil.copy(Path(f) / 'config.json', out)


def mismatches(a: str, f: str, outs: dict, w: float, tensors=None):
    "bf16 elements of each output that differ from the float64 reference rounded once, on a few tensors (per 10,000)."
    import numpy as np
    from ei_nb.average import load_checkpoint, round_f64
    tensors = tensors or ('model.layers.0.self_attn.q_proj.weight', f'model.layers.{LAYERS - 1}.mlp.down_proj.weight')
    def bits(d, name):
        r = load_checkpoint(d).tensors[name]
        with open(r.path, 'rb') as fh: fh.seek(r.start); return np.frombuffer(fh.read(r.nbytes), np.uint16)
    dec = lambda x: (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    res = {k: 0 for k in outs}; n = 0
    for name in tensors:
        ref = round_f64((1 - w) * dec(bits(a, name)) + w * dec(bits(f, name)), 'BF16')
        n += ref.size
        for k, d in outs.items(): res[k] += int((bits(d, name) != ref).sum())
    return {k: (v, n) for k, v in res.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--workdir', default=None, help='where the checkpoints go (default: a temp dir, removed after)')
    ap.add_argument('--repeats', type=int, default=3, help='runs of io and ei (medians are reported)')
    ap.add_argument('--baseline-repeats', type=int, default=1, help='runs of mergekit and naive')
    ap.add_argument('--threads', type=int, default=None, help='ei average --threads (default: its own)')
    ap.add_argument('--ft-weight', type=float, default=0.7)
    ap.add_argument('--layers', type=int, default=LAYERS, help=f'decoder layers (default {LAYERS}: 1.48 GB per checkpoint; 1 is 0.67 GB)')
    ap.add_argument('--mergekit', default=os.environ.get('MERGEKIT_YAML') or shutil.which('mergekit-yaml') or '/tmp/mk/bin/mergekit-yaml')
    ap.add_argument('--skip', default='', help='comma-separated runs to skip: mergekit,naive')
    ap.add_argument('--child', nargs='*', help=argparse.SUPPRESS)
    args = ap.parse_args()
    globals()['LAYERS'] = args.layers
    if args.child:
        kind, *rest = args.child
        if kind == 'io': return child_io(rest[0], rest[1], int(rest[2]), rest[3])
        if kind == 'naive': return child_naive(rest[0], rest[1], rest[2], float(rest[3]))
    work = Path(args.workdir or tempfile.mkdtemp(prefix='bench_average_'))
    work.mkdir(parents=True, exist_ok=True)
    A, F, O = work / 'anchor', work / 'finetuned', work / 'out'
    t = time.perf_counter()
    if not (A / 'config.json').exists(): write_checkpoint(A, 0, 4, 0.0)
    if not (F / 'config.json').exists(): write_checkpoint(F, 1, 4, 0.35)
    size = sum(p.stat().st_size for p in F.glob('*.safetensors'))
    print(f'checkpoints: 2 x {size / 1e9:.3f} GB bf16 (4 shards each, split differently) in {work} '
          f'[{time.perf_counter() - t:.1f} s to build]', flush=True)
    (work / 'linear.yml').write_text(f'merge_method: linear\ndtype: bfloat16\nmodels:\n  - model: {A}\n    parameters:\n      weight: {1 - args.ft_weight}\n'
                                     f'  - model: {F}\n    parameters:\n      weight: {args.ft_weight}\n')
    env = dict(os.environ)
    runs = {'io': [sys.executable, __file__, '--child', 'io', str(A), str(F), str(size), str(work / 'io.bin')],
            'ei': [sys.executable, '-c', 'from ei_nb.cli import _entry; _entry()', 'average', '--anchor', str(A),
                   '--finetuned', str(F), '--ft-weight', str(args.ft_weight), '--out', str(O / 'ei')]
                  + (['--threads', str(args.threads)] if args.threads else []),
            'mergekit': [args.mergekit, str(work / 'linear.yml'), str(O / 'mergekit'), '--no-copy-tokenizer'],
            'naive': [sys.executable, __file__, '--child', 'naive', str(A), str(F), str(O / 'naive'), str(args.ft_weight)]}
    skip = set(filter(None, args.skip.split(',')))
    if 'mergekit' not in skip and not Path(args.mergekit).exists():
        print(f'mergekit-yaml not found at {args.mergekit}: skipping mergekit', flush=True); skip.add('mergekit')
    res = {k: [] for k in runs if k not in skip}
    dropped = True
    for rep in range(args.repeats):
        for name in res:
            reps = args.repeats if name in ('io', 'ei') else min(args.repeats, args.baseline_repeats)
            if rep >= reps: continue
            last = rep == reps - 1
            shutil.rmtree(O / name, ignore_errors=True); O.mkdir(exist_ok=True)
            dropped &= drop_caches()
            dt, rss, rc, out, err = run(runs[name], env)
            if rc != 0: sys.exit(f'{name} failed (exit {rc}):\n{err[-3000:]}')
            res[name].append({'s': dt, 'rss': rss, 'out': out})
            print(f'  {name:<9} run {rep + 1}: {dt:6.2f} s, peak RSS {rss:7.1f} MiB', flush=True)
            if not last and name != 'io': shutil.rmtree(O / name, ignore_errors=True)
    io = [json.loads(r['out'].strip().splitlines()[-1]) for r in res['io']]
    bound = statistics.median(x['read_s'] + x['write_s'] for x in io)
    med = {k: statistics.median(r['s'] for r in v) for k, v in res.items()}
    rss = {k: max(r['rss'] for r in v) for k, v in res.items()}
    mk = med.get('mergekit')
    print(f'\npage cache dropped before each run: {dropped}; I/O: read {statistics.median(x["read_gbps"] for x in io):.2f} GB/s, '
          f'write {statistics.median(x["write_gbps"] for x in io):.2f} GB/s -> lower bound {bound:.2f} s '
          f'(read 2 x {size / 1e9:.2f} GB + write {size / 1e9:.2f} GB); medians of ' +
          ', '.join(f'{len(v)} {k}' for k, v in res.items()) + ' run(s), interleaved\n')
    print(f'| run | seconds | GB/s (output) | peak RSS MiB | x mergekit | x I/O bound |\n|---|---|---|---|---|---|')
    print(f'| I/O lower bound | {bound:.2f} | {size / bound / 1e9:.2f} | {rss["io"]:.0f} | {bound / mk if mk else float("nan"):.3f} | 1.000 |')
    for k in ('ei', 'mergekit', 'naive'):
        if k in med:
            print(f'| {k} | {med[k]:.2f} | {size / med[k] / 1e9:.2f} | {rss[k]:.0f} | {med[k] / mk if mk else float("nan"):.3f} | {med[k] / bound:.3f} |')
    mm = mismatches(str(A), str(F), {k: str(O / k) for k in ('ei', 'mergekit', 'naive') if k in med}, args.ft_weight)
    print('\nbf16 elements differing from the float64 reference (2 tensors): ' +
          ', '.join(f'{k} {v} of {n} ({v / n * 1e4:.2f} per 10,000)' for k, (v, n) in mm.items()))
    print(f'projected time for an 8B model (16.4 GB), from ei\'s {size / med["ei"] / 1e9:.2f} GB/s: {GB8B / (size / med["ei"]):.1f} s')
    verdict = {'ei_s': med['ei'], 'bound_s': bound, 'x_bound': med['ei'] / bound, 'x_mergekit': (med['ei'] / mk) if mk else None,
               'ei_rss_mib': rss['ei'], 'ei_exact': mm['ei'][0] == 0}
    print(json.dumps(verdict))
    if not args.workdir: shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()

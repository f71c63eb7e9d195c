"""Benchmark of the sampling pipeline on CPU: generated tokens/s of the tiny model, and how well verification
hides behind generation.

    OMP_NUM_THREADS=1 python bench/bench_sample.py [--problems 24] [--n 8] [--max-new-tokens 128] [--json out.json]

Three measurements per verification load, all with the same seed (so the same samples):
  generation alone   run_pipeline without a verifier                    -> gen_wall
  verification alone the verifier's stream over the saved samples       -> ver_wall
  pipelined          run_pipeline with the verifier, fresh output       -> wall
efficiency = max(gen, ver_wall) / wall, where gen is the generation time measured inside the pipelined run itself
(the sum of its generate calls), so that load from other processes between runs does not enter the ratio
(1.0 = verification fully hidden; target >= 0.9, i.e. wall within 10% of max(generation, verification)). Lean is not installed here, so the verifier is `DelayVerifier`: a fixed
latency per check on `workers` threads, set so that verification alone takes `ratio` x generation alone
(DESIGN.md's reference node: f_code*t_v / (T/r_gen) = 2.8 s / 4.9 s ~ 0.57). The real `none` backend
(pre-check only) is measured too: its overhead on top of generation alone.
"""
import argparse, json, os, sys, tempfile, time
from pathlib import Path

os.environ.setdefault('OMP_NUM_THREADS', '1')
from ei_nb.core import read_problems, read_samples, shared_data
from ei_nb.samplers import DelayVerifier, SampleParams, TransformersSampler, run_pipeline
from ei_nb.tiny import build_tiny_model
from ei_nb.verify import make_verifier


def verify_alone(verifier, problems, samples_path) -> float:
    "Wall time of the verifier's stream over samples already on disk (no generation)."
    by_name = {p['name']: p for p in problems}
    pairs = [(by_name[s['name']], s) for s in read_samples(samples_path)]
    t = time.perf_counter()
    for _ in verifier.verify_stream(iter(pairs)): pass
    return time.perf_counter() - t


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--problems', type=int, default=24, help='miniF2F-valid problems')
    p.add_argument('--n', type=int, default=8); p.add_argument('--max-new-tokens', type=int, default=128)
    p.add_argument('--chunk-problems', type=int, default=1); p.add_argument('--workers', type=int, default=2)
    p.add_argument('--ratios', default='0.57,1.0', help='verification/generation time ratios to test')
    p.add_argument('--json', help='write the results here')
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix='bench_sample_'))
    model = build_tiny_model(work / 'tiny')
    problems = [q for q in read_problems(shared_data('minif2f_dsp15.jsonl')) if q['split'] == 'valid'][:a.problems]
    smp = TransformersSampler(model)
    params = SampleParams(n=a.n, max_new_tokens=a.max_new_tokens, seed=0)
    kw = dict(chunk_problems=a.chunk_problems)
    run_pipeline(problems[:1], smp, work / 'warmup.jsonl', params, **kw)

    gen = run_pipeline(problems, smp, work / 'gen.jsonl', params, **kw)
    gen_wall, n_samples = gen['timings']['wall_s'], gen['n_samples']
    res = {'torch_threads': int(os.environ.get('OMP_NUM_THREADS', 0)), 'problems': len(problems), 'n': a.n,
           'max_new_tokens': a.max_new_tokens, 'chunk_problems': a.chunk_problems, 'samples': n_samples,
           'tokens': gen['tokens_generated'], 'tokens_per_s': gen['tokens_per_s'], 'capped_frac': gen['capped_frac'],
           'generation_alone_wall_s': gen_wall, 'runs': []}
    print(f"generation alone: {n_samples} samples, {gen['tokens_generated']} tokens in {gen['timings']['generation_s']:.1f} s "
          f"-> {gen['tokens_per_s']:.0f} tok/s (wall {gen_wall:.1f} s)")

    with make_verifier('none') as v:
        r = run_pipeline(problems, smp, work / 'none.jsonl', params, 0, v, work / 'none_v.jsonl', **kw)
    t = r['timings']
    res['backend_none'] = {'wall_s': t['wall_s'], 'generation_s': t['generation_s'], 'overhead': round(t['wall_s'] / t['generation_s'] - 1, 3),
                           'verified_during_generation': r['verified_during_generation']}
    print(f"backend none (pre-check only): wall {t['wall_s']:.1f} s vs its generation {t['generation_s']:.1f} s: overhead {res['backend_none']['overhead']:+.1%}")

    for ratio in map(float, a.ratios.split(',')):
        delay = ratio * gen_wall * a.workers / n_samples
        ver_wall = verify_alone(DelayVerifier(delay, a.workers), problems, work / 'gen.jsonl')
        out = work / f'pipe_{ratio}'
        r = run_pipeline(problems, smp, out / 's.jsonl', params, 0, DelayVerifier(delay, a.workers), out / 'v.jsonl', **kw)
        same = (out / 's.jsonl').read_bytes() == (work / 'gen.jsonl').read_bytes()
        t = r['timings']; best = max(t['generation_s'], ver_wall)
        row = {'ratio': ratio, 'delay_s': round(delay, 4), 'workers': a.workers, 'generation_s': t['generation_s'],
               'verification_alone_s': round(ver_wall, 3), 'sum_s': round(t['generation_s'] + ver_wall, 3), 'pipelined_wall_s': t['wall_s'],
               'efficiency': round(best / t['wall_s'], 3), 'overhead_vs_max': round(t['wall_s'] / best - 1, 3),
               'tail_s': t['tail_s'], 'verified_during_generation': r['verified_during_generation'], 'same_samples': same,
               'recorded': t}
        res['runs'].append(row)
        print(f"ratio {ratio:.2f}: generation {t['generation_s']:.1f} s, verification {ver_wall:.1f} s, sum {row['sum_s']:.1f} s, "
              f"pipelined {t['wall_s']:.1f} s -> efficiency {row['efficiency']:.3f} (wall {row['overhead_vs_max']:+.1%} vs max), "
              f"tail {t['tail_s']:.2f} s, same samples: {same}")
    res['target_met'] = all(r['overhead_vs_max'] <= 0.10 for r in res['runs'])
    if a.json: Path(a.json).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != 'runs'}))
    return res


if __name__ == '__main__':
    main()

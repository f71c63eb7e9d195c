"""Pins on the science that `tests/mutation_check.py` found unguarded: the default keep cap (4 distinct proofs per
problem, shortest first) through `build_sft_rows` and `ei sft-data` with no explicit cap; the chain hash covering
every stage's `seed`; pass@k for 1 < k < n through `ei stats`; and the loss mask, read from `collate`'s output."""
import io, json, math, contextlib
from itertools import combinations
from pathlib import Path

import pytest

from ei_nb.cli import main
from ei_nb.core import iter_jsonl, read_problems, shared_data, write_records


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------- keep rules: the default cap is 4, shortest first

@pytest.fixture(scope='module')
def tok():
    from ei_nb.tiny import tiny_tokenizer
    return tiny_tokenizer()


@pytest.fixture(scope='module')
def six_passes(tmp_path_factory):
    """One real miniF2F problem with 6 accepted, pairwise distinct proofs of different lengths (its real proof with
    0..5 extra `simp`-free comment lines, in shuffled sample order) and 2 failures, so it is not solved n/n."""
    fs = next(fs for _, fs in iter_jsonl(shared_data('minif2f_valid_few_shot_dsp15.jsonl')))
    p = next(p for p in read_problems(shared_data('minif2f_dsp15.jsonl')) if p['name'] == fs['name'])
    stmt = p['header'] + p['informal_prefix'] + p['formal_statement']
    problem = {f: p[f] for f in ('name', 'split', 'formal_statement', 'header', 'informal_prefix')}
    extra = [3, 0, 5, 1, 4, 2]                 # sample k carries extra[k] comment lines: length order != sample order
    codes = [stmt + fs['formal_proof'] + ''.join(f'\n-- step {j} checked' for j in range(e)) for e in extra]
    codes += [stmt + '  sorry', stmt + fs['formal_proof'][:20]]
    samples, verdicts = [], []
    for i, code in enumerate(codes):
        text = f'The proof follows the informal argument.\n\n```lean4\n{code}\n```'
        samples.append({'name': p['name'], 'sample_idx': i, 'round': 1, 'completion': text, 'n_tokens': len(text), 'capped': False})
        ok = i < 6
        verdicts.append({'name': p['name'], 'sample_idx': i, 'verdict': 'pass' if ok else 'fail',
                         'reason': None if ok else 'crafted', 'proof': code, 'verify_s': 0.0})
    d = tmp_path_factory.mktemp('six')
    paths = {k: d / f'{k}.jsonl' for k in ('problems', 'samples', 'verdicts')}
    write_records(paths['problems'], [problem], 'problem')
    write_records(paths['samples'], samples, 'sample'); write_records(paths['verdicts'], verdicts, 'verdict')
    shortest4 = sorted(range(6), key=lambda i: (samples[i]['n_tokens'], i))[:4]
    return paths, [problem], samples, verdicts, shortest4


def test_build_sft_rows_default_keeps_the_four_shortest_distinct_proofs(six_passes, tok):
    from ei_nb.sft import build_sft_rows
    _, problems, samples, verdicts, shortest4 = six_passes
    rows, st = build_sft_rows(problems, samples, verdicts, tok, 1)          # no max_per_problem: the design's default
    assert len({s['completion'] for s in samples[:6]}) == 6
    assert [r['sample_idx'] for r in rows] == shortest4 == [1, 3, 5, 0]
    assert st['dropped_over_cap'] == 2 and st['rows'] == 4


def test_sft_data_cli_default_cap_is_four(six_passes, tmp_path):
    from ei_nb.tiny import tiny_tokenizer
    paths, *_, shortest4 = six_passes
    tiny_tokenizer().save_pretrained(tmp_path / 'tok')
    rc, out, err = run_cli('sft-data', '--problems', paths['problems'], '--samples', paths['samples'],
                           '--verdicts', paths['verdicts'], '--out', tmp_path / 'sft.jsonl', '--tokenizer', tmp_path / 'tok',
                           '--min-rows', 1)
    assert rc == 0, err
    assert json.loads(out.splitlines()[-1])['rows'] == 4
    assert [r['sample_idx'] for r in map(json.loads, (tmp_path / 'sft.jsonl').read_text().splitlines())] == shortest4



def test_row_of_exactly_max_tokens_is_kept(six_passes, tok):
    "`max_tokens` is the longest row kept: a row of exactly that length stays, one token less drops it."
    from ei_nb.sft import build_sft_rows
    _, problems, samples, verdicts, shortest4 = six_passes
    _, st = build_sft_rows(problems, samples, verdicts, tok, 1, max_per_problem=6)
    length = {c['sample_idx']: c['n_tokens'] for c in st['candidates']}
    first = shortest4[0]
    rows, _ = build_sft_rows(problems, samples, verdicts, tok, 1, max_per_problem=1, max_tokens=length[first])
    assert [r['sample_idx'] for r in rows] == [first]
    rows, st = build_sft_rows(problems, samples, verdicts, tok, 1, max_per_problem=1, max_tokens=length[first] - 1)
    assert first not in [r['sample_idx'] for r in rows] and st['dropped_too_long'] >= 1


# ---------------------------------------------------------------- the data stop, at its edges

def test_data_stop_edges():
    from ei_nb.stop_rule import data_stop
    assert data_stop(10, 0) == 'no problem with both an accepted proof and a failure'
    assert data_stop(10, 1, 50) is None and data_stop(10, 1, 49) is not None and data_stop(1, 1) is None

# ---------------------------------------------------------------- the chain hash covers the seed of every stage

def _stage_params():
    from ei_nb.config import notebook_parameters
    nbs = Path(__file__).resolve().parents[1] / 'nbs'
    out = {}
    for nb in sorted(nbs.glob('0[0-6]_*.ipynb')):
        try: out[nb.stem] = {k: v['default'] for k, v in notebook_parameters(nb).items()}
        except Exception: continue
    return out


def test_chain_hash_changes_with_each_stage_seed():
    "A reseeded stage must not look finished: its chain hash, and so every later one, changes with `seed`."
    from ei_nb.markers import VOLATILE, chain_hash
    def reseeded(p):   # the seed of the stage, or of its `sampling` group
        if 'seed' in p: return p | {'seed': p['seed'] + 1}
        return p | {'sampling': p['sampling'] | {'seed': p['sampling']['seed'] + 1}}
    seeded = {s: p for s, p in _stage_params().items() if 'seed' in p or 'seed' in (p.get('sampling') or {})}
    assert {'00_select', '01_sample_verify', '02_sft', '04_eval'} <= set(seeded), sorted(seeded)
    for stage, params in seeded.items():
        params = {k: v for k, v in params.items()}
        h = chain_hash(stage, 1, params, {'x': 'sha'}, 'prev')
        assert chain_hash(stage, 1, reseeded(params), {'x': 'sha'}, 'prev') != h, stage
        if 'verify' in params:                                             # the verifier's speed knobs are in its group
            assert chain_hash(stage, 1, params | {'verify': params['verify'] | {'workers': 99}}, {'x': 'sha'}, 'prev') == h
        assert chain_hash(stage, 1, params, {'x': 'sha'}, h) != h                 # a rerun earlier stage
        assert chain_hash(stage, 1, params, {'x': 'other'}, 'prev') != h          # a changed input file
        for k in VOLATILE & set(params):                                   # speed-only knobs are left out
            assert chain_hash(stage, 1, params | {k: 99}, {'x': 'sha'}, 'prev') == h, (stage, k)


# ---------------------------------------------------------------- pass@k for 1 < k < n through `ei stats`

def test_stats_pass_at_k_between_1_and_n(tmp_path):
    "pass@k = 1 - C(n-c, k)/C(n, k) per problem, averaged; checked against enumeration of every k-subset."
    n, passes = 8, {'p0': 0, 'p1': 1, 'p2': 3, 'p3': 5, 'p4': 8}
    rows = [{'name': name, 'sample_idx': i, 'verdict': 'pass' if i < c else 'fail', 'reason': None if i < c else 'x',
             'proof': None, 'verify_s': 0.0} for name, c in passes.items() for i in range(n)]
    write_records(tmp_path / 'v.jsonl', rows, 'verdict')
    rc, out, err = run_cli('stats', '--verified', tmp_path / 'v.jsonl', '--k', '1,2,3,7')
    assert rc == 0, err
    got = json.loads(out.splitlines()[-1])
    assert got['solved'] == 4 and got['n_problems'] == 5
    for k in (1, 2, 3, 7):
        exact = sum(sum(any(i < c for i in sub) for sub in combinations(range(n), k)) / math.comb(n, k)
                    for c in passes.values()) / len(passes)
        assert got['pass_at_k'][str(k)] == pytest.approx(exact, abs=1e-12), k


# ---------------------------------------------------------------- the loss sees completion tokens only

def test_loss_mask_is_the_completion_of_each_packed_row():
    from ei_nb.rows import collate
    examples = [{'ids': [5, 6, 7, 8, 9], 'n_prompt': 3}, {'ids': [1, 2, 3, 4], 'n_prompt': 1}]
    b = collate(examples, [0, 1])
    assert b['input_ids'].tolist() == [[5, 6, 7, 8, 9, 1, 2, 3, 4]]
    assert b['target_mask'].tolist() == [[False, False, False, True, True, False, True, True, True]]
    assert b['position_ids'].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    one = collate(examples, [1])
    assert one['target_mask'].tolist() == [[False, True, True, True]] and 'position_ids' not in one


def test_completion_loss_is_the_cross_entropy_of_completion_tokens(tiny_model_dir):
    "Summed CE of each completion token predicted from the position before it, prompt tokens left out."
    import torch
    from transformers import AutoModelForCausalLM
    from ei_nb.rows import collate
    from ei_nb.train import completion_loss
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    examples = [{'ids': torch.randint(5, 200, (9,), generator=g).tolist(), 'n_prompt': 4},
                {'ids': torch.randint(5, 200, (6,), generator=g).tolist(), 'n_prompt': 2}]
    with torch.no_grad():
        got = float(completion_loss(model, **collate(examples, [0])))
        logits = model(torch.tensor([examples[0]['ids']])).logits[0]
        ids = examples[0]['ids']
        want = sum(float(torch.nn.functional.cross_entropy(logits[t - 1:t], torch.tensor([ids[t]]))) for t in range(4, len(ids)))
        assert got == pytest.approx(want, rel=1e-4)
        both = float(completion_loss(model, **collate(examples, [0, 1])))              # packed: each row on its own
        assert both == pytest.approx(got + float(completion_loss(model, **collate(examples, [1]))), rel=1e-4)


# ---------------------------------------------------------------- exit codes: 0 ok, 2 bad input, 3 stage failed, 4 data stop, 143 signal

def test_exit_codes_of_the_cli_contract(monkeypatch):
    import ei_nb.cli as cli
    from ei_nb.core import BadInput, DataStop, StageFailed
    def raiser(exc):
        def f(argv): raise exc
        return f
    cmds = {'t-ok': lambda argv: {'ok': True}, 't-bad': raiser(BadInput('x')), 't-failed': raiser(StageFailed('x')),
            't-data': raiser(DataStop('x')), 't-signal': raiser(KeyboardInterrupt('signal 15'))}
    for name in cmds: monkeypatch.setitem(cli.COMMANDS, name, ('unused:unused', 'test'))
    real = cli.resolve
    monkeypatch.setattr(cli, 'resolve', lambda name: cmds[name] if name in cmds else real(name))
    assert {name: run_cli(name)[0] for name in cmds} == {'t-ok': 0, 't-bad': 2, 't-failed': 3, 't-data': 4, 't-signal': 143}
    assert run_cli('no-such-command')[0] == 2
    rc, out, err = run_cli('stop', '--scores', 'five')                                  # a real command's bad input
    assert rc == 2 and out == '' and '--scores' in err


# ---------------------------------------------------------------- McNemar power: rejects when p <= alpha, by enumeration

@pytest.mark.parametrize('n,p_disc,delta,alpha', [(3, 1.0, 0.2, 0.25), (6, 0.5, 0.1, 0.0625), (12, 0.3, 0.1, 0.05)])
def test_mcnemar_power_by_enumeration(n, p_disc, delta, alpha):
    """Power = P(mcnemar_p(b, c) <= alpha) summed over every outcome: d ~ Bin(n, p_disc) discordant problems, B wins
    each with q = (p_disc + delta) / (2 p_disc). At alpha = 1/4 or 1/16 some p-values equal alpha exactly."""
    from ei_nb.report import mcnemar_p, mcnemar_power
    q = (p_disc + delta) / (2 * p_disc)
    pmf = lambda k, m, p: math.comb(m, k) * p**k * (1 - p)**(m - k)
    want = sum(pmf(d, n, p_disc) * pmf(c, d, q) for d in range(1, n + 1) for c in range(d + 1) if mcnemar_p(d - c, c) <= alpha)
    assert mcnemar_power(n, delta, p_disc, alpha) == pytest.approx(want, abs=1e-12)


# ---------------------------------------------------------------- the verdict: exactly one axiom report at our line

def test_judge_fails_when_two_axiom_reports_sit_at_the_appended_line():
    """A second report for the theorem at the line of OUR `#print axioms` (e.g. a clean one faked ahead of the real one)
    makes the verdict fail: which report is the kernel's cannot be told, so neither is trusted."""
    from ei_nb.lean_reply import judge
    info = lambda line, data: {'severity': 'info', 'pos': {'line': line, 'column': 0}, 'data': data}
    fake, real = info(9, "'t' does not depend on any axioms"), info(9, "'t' depends on axioms: [sorryAx]")
    clean = info(9, "'t' depends on axioms: [propext, Classical.choice, Quot.sound]")
    assert judge({'messages': [clean]}, 't', line=9) == ('pass', None)               # one report: judged on its axioms
    assert judge({'messages': [real]}, 't', line=9)[0] == 'fail'
    for msgs in ([fake, real], [fake, clean], [clean, clean]):
        verdict, reason = judge({'messages': msgs}, 't', line=9)
        assert verdict == 'fail' and '2 reports' in reason, (msgs, verdict, reason)

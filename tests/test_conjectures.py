"""The 00b_conjecture stage: lemma extraction on real published proofs, the STP prompt, the checks that keep a copy of
the seed, a protected problem or a cheat out of the pool, record round-trips, and resume after SIGKILL while proving.
Lean is a scripted stand-in (its replies in the REPL's shape); the conjecturer and prover are scripted samplers."""
import json, re, sys
from pathlib import Path
import pytest

from ei_nb.core import read_problems, read_records, shared_data, statement_key, write_records
from ei_nb.conjecture import (EASY_TACTICS, HARD_END, HARD_MARK, LEMMA_MARK, EASY_MARK, add_conjecture_rows, bound_names, choose_pairs,
                              conjecture_counts, proof_lemmas, seed_proofs, uses_lemma)
from ei_nb.lean_lex import code_only
from ei_nb.samplers import SAMPLERS, TransformersSampler

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = [json.loads(l) for l in open(shared_data('deepseek_prover_v2_minif2f_solutions.jsonl'), encoding='utf-8')]
WORKBOOK = [json.loads(l) for l in open(shared_data('lean_workbook_goedel_proofs_kimina_verdicts.jsonl'), encoding='utf-8')]
MINIF2F = {r['name']: r for r in map(json.loads, open(shared_data('minif2f_dsp15.jsonl'), encoding='utf-8'))}


# ---------------------------------------------------------------- lemma extraction on real proofs
def test_lemmas_of_published_proofs_are_never_their_own_names_or_tactics():
    "Over 438 DeepSeek-Prover-V2 files and 102 Goedel lean-workbook files: no extracted name is bound by the proof itself."
    tactics = {'norm_num', 'nlinarith', 'linarith', 'field_simp', 'ring_nf', 'simp_all', 'norm_cast', 'push_cast', 'by_contra',
               'exact_mod_cast', 'interval_cases', 'split_ifs', 'nth_rewrite', 'simp_rw', 'subst_vars', 'native_decide', 'positivity'}
    n_lemmas = 0
    for code in [r['full_code'] for r in SOLUTIONS] + [r['code'] for r in WORKBOOK]:
        names, local = proof_lemmas(code), bound_names(code_only(code))
        n_lemmas += len(names)
        assert not [n for n in names if n in local or n in tactics or re.match(r'h[A-Za-z]?(?:_|\d|[₀-₉])', n) or '_' not in n.split('.')[-1]], (names, code[:300])
    assert n_lemmas > 2000                      # real proofs cite lemmas: thousands across the files


def test_lemmas_of_one_real_proof():
    "A DeepSeek-Prover-V2 proof and a Goedel lean-workbook proof: what they cite, each name where the proof writes it."
    code = next(r['full_code'] for r in SOLUTIONS if r['name'] == 'aime_1983_p1')
    got = proof_lemmas(code)
    for name in got: assert re.search(rf'(?<![\w.]){re.escape(name)}', code_only(code)), name
    assert {'Real.log_pos', 'Real.log_mul'} <= set(got) and 'Real.log' not in got and 'aime_1983_p1' not in got
    wb = next(r for r in WORKBOOK if 'sq_nonneg' in r['code'] and r['verdict'] == 'valid')
    assert 'sq_nonneg' in proof_lemmas(wb['code'])
    assert uses_lemma(wb['code'], 'sq_nonneg') and not uses_lemma(wb['code'], 'Nat.succ_le_iff')


def test_pairs_respect_the_lemma_cap_and_the_pair_rule():
    from ei_nb.demo import workbook_problems
    wb = [(p, s) for p, s, v in workbook_problems() if v == 'valid']
    seeds = seed_proofs([p for p, _ in wb], [{'name': p['name'], 'sample_idx': 0, 'verdict': 'pass', 'proof': p['header'] + p['formal_statement'] + s}
                                             for p, s in wb])
    for n in (10, 40, 200):
        pairs = choose_pairs(seeds, n, 0.1, seed=3)
        counts = {}
        for _, l in pairs: counts[l] = counts.get(l, 0) + 1
        assert max(counts.values()) <= max(1, -(-n // 10)) and len(pairs) <= n
        assert len({(statement_key(s['problem']['formal_statement']), l) for s, l in pairs}) == len(pairs)
        assert all(l in s['lemmas'] for s, l in pairs)


# ---------------------------------------------------------------- the stage, with a stand-in Lean and scripted samplers
class StandInLean:
    """Lean's replies, scripted. `#check` knows every name; elaboration fails on `undefined_thing`; the cheap bundle closes
    only `2 + 2 = 4`; a proof fails when it mentions `foo`, else passes with its axioms report (and the statement probe)."""
    identity = {'backend': 'stand-in'}
    elaborations = 0                                   # statements sent with `sorry` (the first of the two Lean checks)
    def run(self, header, sent, timeout):
        line = lambda i, sev, data: {'severity': sev, 'pos': {'line': i, 'column': 0}, 'data': data}
        if ':= by sorry' in sent and 'ei_reference_statement' not in sent: StandInLean.elaborations += 1
        if sent.startswith('#check'):
            return {'messages': [line(i, 'info', f'{l.split()[1]} (a : ℝ) : 0 ≤ a ^ 2') for i, l in enumerate(sent.splitlines(), 1)]}
        if 'ei_reference_statement' in sent: return {'messages': [line(sent.count('\n'), 'info', 'ei-statement-type: T')]}
        if 'undefined_thing' in sent or 'foo' in sent: return {'messages': [line(2, 'error', "unknown identifier")]}
        if EASY_TACTICS in sent:
            return {'messages': [] if '2 + 2 = 4' in sent else [line(2, 'error', 'unsolved goals')]}
        if '#print axioms' not in sent:
            return {'messages': [line(1, 'warning', "declaration uses 'sorry'")]}
        at = sent.rindex('#print axioms'); n = sent[:at].count('\n') + 1
        name = sent[at:].split()[2].removeprefix('_root_.')          # `#print axioms _root_.NAME`: Lean prints the root NAME
        return {'messages': [line(n, 'info', f"'{name}' depends on axioms: [propext]"), line(n + 1, 'info', 'ei-statement-type: T')]}
    def close(self): pass

def stand_in(settings): return StandInLean()

PROTECTED = MINIF2F['mathd_algebra_182']

def conjectures_for(prompt:str) -> list[str]:
    "What the scripted conjecturer writes after `theorem` for a prompt: good ones, the seed again, a protected problem, a cheat, ..."
    seed = prompt.split(EASY_MARK + '\n', 1)[1].split(':=', 1)[0]
    return [' good_one (a b : ℝ) (h : 0 < a) : 0 ≤ (a - b) ^ 2 + a\n' + HARD_END,
            ' ' + seed.split(None, 2)[2].replace(' ', '  ') + '\n' + HARD_END,                       # the seed, reformatted
            ' ' + PROTECTED['formal_statement'].split(None, 2)[2] + '\n' + HARD_END,                 # a protected problem
            ' sneaky (a : ℝ) (h : sorryAx Prop) : 0 ≤ a ^ 2\n' + HARD_END,                           # a cheat in the statement
            ' good_two (x y : ℝ) : 0 ≤ (x + y) ^ 2 + (x - y) ^ 2 := by\n  nlinarith\n' + HARD_END,
            ' typo (x : ℝ) : undefined_thing x = 1\n' + HARD_END,                                    # does not elaborate
            ' trivial_one : 2 + 2 = 4\n' + HARD_END,                                                 # closed by norm_num
            ' good_three (c : ℝ) : 0 ≤ c ^ 2 + c ^ 4\n' + HARD_END,
            ' rambling (c : ℝ) : 0 ≤ c', ]                                                            # cut off by the cap

class Scripted(TransformersSampler):
    "The tiny model's tokenizer; scripted conjectures, and proofs of which the first of each conjecture passes and uses sq_nonneg."
    name = 'scripted'
    def generate(self, prompts, params, seeds):
        out = []
        for p in prompts:
            if p.endswith(HARD_MARK + '\ntheorem'):
                texts = conjectures_for(p)
                out.append([{'completion': texts[i % len(texts)], 'n_tokens': 12, 'capped': i % len(texts) == len(texts) - 1} for i in range(params.n)])
            else:
                answers = ['  nlinarith [sq_nonneg (a - b), sq_nonneg c]'] + ['  linarith [foo]'] * (params.n - 1)
                out.append([{'completion': a, 'n_tokens': 9, 'capped': False} for a in answers])
        return out

class SlowScripted(Scripted):
    def generate(self, prompts, params, seeds):
        import time
        if not prompts[0].endswith(HARD_MARK + '\ntheorem'): time.sleep(1.5)    # slow only while proving
        return super().generate(prompts, params, seeds)


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    from ei_nb.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp('m')/'tiny')


def pool_files(d:Path):
    "A pool of one lean-workbook problem whose verified proof uses sq_nonneg (and other lemmas), its pass verdict, a protected file."
    from ei_nb.demo import workbook_problems
    p, s = next((p, s) for p, s, v in workbook_problems() if v == 'valid' and proof_lemmas(p['formal_statement'] + s)[:1] == ['sq_nonneg'])
    d.mkdir(parents=True, exist_ok=True)
    write_records(d/'pool.jsonl', [p], 'problem')
    write_records(d/'verdicts.jsonl', [{'name': p['name'], 'sample_idx': 0, 'verdict': 'pass', 'reason': None, 'proof': p['header'] + p['formal_statement'] + s}], 'verdict')
    write_records(d/'protected.jsonl', [{'name': PROTECTED['name'], 'formal_statement': PROTECTED['formal_statement']}])
    return p


RULES = dict(n_prompts=1, conj_per_prompt=9, conj_hi=0.25, lemma_frac=0.1, elegance_quantile=0.2, conj_max_new_tokens=24,
             easy_timeout=10, seed_min_rate=0.0, max_tokens=18432)


def run_conj(tiny, pool, verdicts, out, round_idx=1, extra=(), verifier=None, protected=(), **kw):
    "`run_conjecture` with the test's scripted sampler, completion prompts and `RULES` (any field overridden by `kw`)."
    from dataclasses import fields
    from ei_nb.conjecture import ConjectureRules, run_conjecture
    from ei_nb.samplers import SampleParams
    from ei_nb.sample_job import SamplerSetup
    rules = ConjectureRules(**{**RULES, **{k: kw.pop(k) for k in list(kw) if k in {f.name for f in fields(ConjectureRules)}}})
    sampling = SampleParams(**{'n': 8, 'max_new_tokens': 12, **{k: kw.pop(k) for k in ('n', 'max_new_tokens', 'seed') if k in kw}})
    setup = SamplerSetup(kw.pop('sampler', 'scripted'), None, kw.pop('prompt_style', 'completion'), kw.pop('chunk_problems', 4), 0.5)
    assert not kw, kw
    return run_conjecture(pool, verdicts, tiny, out, round_idx, sampling, verifier, setup, rules, extra, protected, log=lambda *a: None)


def conjecture(tiny, d:Path, out:Path, sampler=Scripted, backend='tests.test_conjectures:stand_in', **kw):
    from ei_nb.verify import verifier_of
    from ei_nb.sft import read_protected
    SAMPLERS['scripted'] = sampler
    pool_files(d)
    return run_conj(tiny, d/'pool.jsonl', d/'verdicts.jsonl', out, kw.pop('round_idx', 1), kw.pop('extra', ()),
                    verifier_of(backend, workers=2, timeout=5), read_protected(d/'protected.jsonl'), **kw)


def test_only_new_faithful_provable_conjectures_enter_the_pool(tiny, tmp_path):
    res = conjecture(tiny, tmp_path, tmp_path/'r1')
    cands = [json.loads(l) for l in open(tmp_path/'r1'/'conjecture_candidates.jsonl')]
    assert [c['status'] for c in cands] == ['accepted', 'seed', 'protected', 'rule', 'accepted', 'not_elaborated', 'too_easy', 'accepted', 'unparsed']
    assert cands[3]['reason'].startswith('sorry:')
    assert (res['generated'], res['parsed'], res['elaborated'], res['to_prove']) == (9, 8, 4, 3)
    kept = read_problems(tmp_path/'r1'/'conjectures.jsonl')
    # pass rate 1/8 (< 1/4) with sq_nonneg used: all three proved; the elegance quantile (one lemma, 3 conjectures) drops none below the 20% point
    assert res['proved'] == 3 and res['kept'] == len(kept) == 3 and res['keep_rule'] == '0 < p < conj_hi' and res['n'] == 8
    assert res['proof_rows'] == 3                                   # STP's direct route: each conjecture's one distinct proof
    pool = read_problems(tmp_path/'pool.jsonl')
    banned = {statement_key(pool[0]['formal_statement']), statement_key(PROTECTED['formal_statement'])}
    for k in kept:
        assert k['source'] == 'conjecture' and k['lemma'] == 'sq_nonneg' and k['seed'] == pool[0]['name'] and k['round'] == 1
        assert re.fullmatch(r'conj_r01_[0-9a-f]{10}', k['name']) and k['formal_statement'].startswith(f"theorem {k['name']} ")
        assert statement_key(k['formal_statement']) not in banned and 'sorry' not in k['formal_statement']
    from ei_nb.layout import write_stage_json                      # what the notebook writes: the counts in its stage.json
    write_stage_json(tmp_path/'r1'/'stage.json', '00b_conjecture', {}, {}, {}, {k: res[k] for k in ('generated', 'kept')}, 0, detail=res)
    assert conjecture_counts(tmp_path/'r1'/'stage.json') == {'generated': 9, 'parsed': 8, 'elaborated': 4, 'proved': 3, 'kept': 3, 'rows': 3}


def test_records_round_trip_and_rows_are_sft_rows(tiny, tmp_path):
    from ei_nb.rows import read_sft_rows
    conjecture(tiny, tmp_path, tmp_path/'r1')
    out = tmp_path/'r1'
    kept = read_problems(out/'conjectures.jsonl')
    write_records(tmp_path/'again.jsonl', kept, 'problem')
    assert read_problems(tmp_path/'again.jsonl') == kept                                    # problem records, extra fields kept
    prompts = {p['name']: p for p in read_problems(out/'conjecture_prompts.jsonl')}
    both_kinds = read_sft_rows(out/'conjecture_rows.jsonl')
    rows = [r for r in both_kinds if r['kind'] == 'conjecture']
    assert len(rows) == len(kept) and {r['name'] for r in rows} == {k['name'] for k in kept}
    proofs = [r for r in both_kinds if r['kind'] == 'conjecture_proof']
    from ei_nb.prompts import render_prompt
    from ei_nb.rows import load_tokenizer
    for r in proofs:   # the prover's rows: the ordinary prover prompt of the conjecture problem, its verified proof
        k = next(k for k in kept if k['name'] == r['name'])
        assert r['prompt'] == render_prompt(k, load_tokenizer(tiny), 'completion') and 'sq_nonneg' in r['completion']
    for r in rows:
        assert r['kind'] == 'conjecture' and r['prompt'] == prompts[r['conjecture']['prompt']]['turn_prompt']
        assert r['prompt'].endswith('<hard theorem>\ntheorem') and r['completion'].endswith('\n' + HARD_END) and r['eos']
        assert LEMMA_MARK in r['prompt'] and 'sq_nonneg' in r['prompt'].split(LEMMA_MARK)[1].split(EASY_MARK)[0]
        # the statement written is the kept conjecture (under the model's own name; the key is name-free)
        kept_stmt = next(k for k in kept if k['name'] == r['name'])['formal_statement']
        assert statement_key('theorem' + r['completion'].removesuffix('\n' + HARD_END)) == statement_key(kept_stmt)
    both, counts = add_conjecture_rows([{'name': 'r', 'n_tokens': 1}] * 27, rows, 0.1)
    assert counts == {'conjecture_rows': 3, 'conjecture_rows_over_frac': 0, 'conjecture_proof_rows': 0, 'conjecture_proof_rows_over_frac': 0} and len(both) == 30
    both, counts = add_conjecture_rows([{'name': 'r', 'n_tokens': 1}] * 27, both_kinds, 0.1)
    assert (counts['conjecture_proof_rows'], counts['conjecture_rows']) == (3, 3) and len(both) == 33


def test_a_later_round_never_conjectures_an_earlier_conjecture_again(tiny, tmp_path):
    conjecture(tiny, tmp_path, tmp_path/'r1')
    res = conjecture(tiny, tmp_path, tmp_path/'r2', round_idx=2, extra=[tmp_path/'r1'/'conjectures.jsonl'])
    cands = [json.loads(l) for l in open(tmp_path/'r2'/'conjecture_candidates.jsonl')]
    assert [c['status'] for c in cands if c['status'] in ('pool', 'accepted')] == ['pool'] * 3 and res['kept'] == 0


def test_without_lean_nothing_is_elaborated_or_kept(tiny, tmp_path):
    "The demo's `known` back-end: the stage runs, counts what it could, and keeps nothing (no new statement can be verified)."
    from ei_nb.demo import known_good_proofs
    write_records(tmp_path/'known.jsonl', known_good_proofs())
    from ei_nb.verify import verifier_of
    from ei_nb.sft import read_protected
    SAMPLERS['scripted'] = Scripted
    pool_files(tmp_path)
    res = run_conj(tiny, tmp_path/'pool.jsonl', tmp_path/'verdicts.jsonl', tmp_path/'out', 1, (),
                   verifier_of('known', known_proofs=tmp_path/'known.jsonl'), read_protected(tmp_path/'protected.jsonl'), n=4)
    assert res['elaborated'] is None and res['lean'] is False and res['kept'] == 0 and res['rows'] == 0
    assert res['to_prove'] == 5 and res['verdict_counts'] == {'unchecked': 4 * 5}     # the 3 good + typo + trivial: Lean would sort them
    assert (tmp_path/'out'/'conjectures.jsonl').read_text() == ''


def test_no_seed_no_prompt_and_no_failure(tiny, tmp_path):
    "A pool whose verdicts have no pass: nothing to conjecture from; the stage still writes every file (and raises no data stop)."
    pool_files(tmp_path)
    write_records(tmp_path/'verdicts.jsonl', [{'name': read_problems(tmp_path/'pool.jsonl')[0]['name'], 'sample_idx': 0, 'verdict': 'fail',
                                              'reason': 'lean error: x', 'proof': 'x'}], 'verdict')
    SAMPLERS['scripted'] = Scripted
    res = run_conj(tiny, tmp_path/'pool.jsonl', tmp_path/'verdicts.jsonl', tmp_path/'out', 1, n_prompts=4)
    assert (res['seeds'], res['prompts'], res['generated'], res['kept']) == (0, 0, 0, 0)
    for f in ('conjecture_prompts', 'conjecture_candidates', 'conjecture_problems', 'conjecture_samples', 'conjecture_verdicts', 'conjectures', 'conjecture_rows'):
        assert (tmp_path/'out'/f'{f}.jsonl').exists(), f
    res = run_conj(tiny, tmp_path/'pool.jsonl', '', tmp_path/'out2', 1, n_prompts=4)     # round 1: no verdicts yet
    assert (res['seeds'], res['prompts'], res['kept']) == (0, 0, 0) and (tmp_path/'out2'/'conjectures.jsonl').read_text() == ''


def test_sigkill_while_proving_then_rerun_gives_identical_files(tiny, tmp_path):
    "Killed while proving the second of three conjectures (one per chunk); the rerun resumes to the files of an uninterrupted run."
    import signal, subprocess, time
    from ei_nb.core import iter_jsonl
    kw = dict(chunk_problems=1)
    a = conjecture(tiny, tmp_path/'a', tmp_path/'a'/'out', **kw)
    child = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; "
             f"import tests.test_conjectures as T; T.conjecture(Path({str(tiny)!r}), Path({str(tmp_path/'b')!r}), "
             f"Path({str(tmp_path/'b'/'out')!r}), sampler=T.SlowScripted, **{kw!r})")
    proc = subprocess.Popen([sys.executable, '-c', child], stderr=subprocess.PIPE, text=True)
    got, t0 = tmp_path/'b'/'out'/'conjecture_samples.jsonl', time.time()
    while not (got.exists() and got.read_text().count('\n') >= 8):           # one conjecture's 8 proofs written
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.time() - t0 < 120; time.sleep(0.05)
    proc.send_signal(signal.SIGKILL); proc.wait()
    assert not (tmp_path/'b'/'out'/'conjectures.jsonl').exists() and got.read_text().count('\n') < 24     # killed inside the stage
    b = conjecture(tiny, tmp_path/'b', tmp_path/'b'/'out', **kw)
    files = ('conjecture_prompts.jsonl', 'conjecture_generations.jsonl', 'conjecture_candidates.jsonl', 'conjecture_problems.jsonl',
             'conjecture_samples.jsonl', 'conjecture_verdicts.jsonl', 'conjectures.jsonl', 'conjecture_rows.jsonl')
    for f in files:
        rows = lambda d: [{k: v for k, v in r.items() if k != 'verify_s'} for _, r in iter_jsonl(tmp_path/d/'out'/f)]
        assert rows('a') == rows('b'), f
    same = lambda r: {k: v for k, v in r.items() if k not in ('timings', 'n_generated')}
    assert same(a) == same(b) and b['n_generated'] < a['n_generated']


def test_the_notebook_parameters_match_the_interface():
    "The parameter names the driver injects (01c's verifier keys and the stage's own) are all in the parameters cell."
    from ei_nb.config import flat_parameters, notebook_parameters
    params = notebook_parameters(ROOT/'nbs'/'00b_conjecture.ipynb')
    assert {'problems_path', 'extra_problems_paths', 'verdicts_path', 'model_dir', 'out_dir', 'round_idx', 'prompt_style', 'protected_paths',
            'verify', 'stage_json', 'sampler', 'tensor_parallel_size', 'data_parallel_size', 'conjecture', 'sampling'} <= set(params)
    assert {'n_prompts', 'n', 'conj_hi', 'lemma_frac', 'elegance_quantile', 'max_new_tokens', 'temperature', 'top_p',
            'seed'} <= set(flat_parameters(params, {'verify'}))          # the keys of [conjecture] in a config
    assert set(params['verify']['default']) == {'backend', 'project', 'workers', 'timeout', 'known_proofs', 'max_error_frac'}


def test_lean_checks_speak_the_repl_protocol(tmp_path):
    "`elaborate` and `lemma_statements` through the real REPL pool, talking to the fake REPL (recorded v4.9.0-rc1 reply shapes)."
    from ei_nb.conjecture import elaborate, lemma_statements
    from ei_nb.verify import make_verifier
    (tmp_path/'lean-toolchain').write_text('leanprover/lean4:v4.9.0-rc1\n')
    fake = str(Path(__file__).with_name('fake_repl.py'))
    p = MINIF2F['mathd_algebra_182']
    conj = {'name': 'c', 'header': p['header'], 'formal_statement': 'theorem c (y : ℂ) : 7 * (3 * y + 2) = 21 * y + 14 := by'}
    with make_verifier('repl', project=tmp_path, timeout=5, mem_mb=256, workers=1, repl_cmd=[sys.executable, fake]) as v:
        assert elaborate({**conj, 'formal_statement': 'theorem c (y : ℂ) : y = y -- FAKE:error\n := by'}, v.backend, 5, 5)[0] == 'not_elaborated'
        assert elaborate({**conj, 'formal_statement': 'theorem c (y : ℂ) : y = y -- FAKE:replerror\n := by'}, v.backend, 5, 5)[0] == 'not_elaborated'
        assert elaborate(conj, v.backend, 5, 5) == ('too_easy', EASY_TACTICS)          # the fake REPL accepts everything: the bundle "closes" it
        slow = {**conj, 'formal_statement': 'theorem c (y : ℂ) : y = y -- FAKE:slow=3\n := by'}
        assert elaborate(slow, v.backend, 5, 1) == ('accepted', None)                   # the bundle ran out of time: not too easy
        assert lemma_statements(['sq_nonneg'], p['header'], v.backend, 5) == {}            # no `#check` answer: no statement


def test_a_rerun_reuses_the_lean_checks_made_the_same_way_only(tiny, tmp_path):
    conjecture(tiny, tmp_path, tmp_path/'out')
    first, n0 = (tmp_path/'out'/'conjecture_candidates.jsonl').read_bytes(), StandInLean.elaborations
    conjecture(tiny, tmp_path, tmp_path/'out')
    assert StandInLean.elaborations == n0 and (tmp_path/'out'/'conjecture_candidates.jsonl').read_bytes() == first
    conjecture(tiny, tmp_path, tmp_path/'out', easy_timeout=7)                    # another budget: checked again
    assert StandInLean.elaborations == n0 + 5          # the five statements past the pre-Lean checks: 3 good, the typo, the trivial one


def test_the_stage_is_planned_first_and_wired_only_when_enabled(tmp_path):
    """demo_conjectures.toml runs 00b first in every round: its verdicts are merged into 00's measurement, its kept
    conjectures join 00's pool (this round's and every earlier round's), its rows reach 02; demo.toml has none of it."""
    from ei_nb.config import load_config; from ei_nb.sources import Sources; from ei_nb.dryrun import plan
    cfgs = Path(__file__).resolve().parents[1]/'configs'
    for name, on in (('demo_conjectures.toml', True), ('demo.toml', False)):
        run = Sources(load_config(cfgs/name), tmp_path/name)
        R = lambda r: tmp_path/name/f'round_{r:02d}'
        steps = [(s['round'], s['stage']) for s in plan(run)]
        for r in (1, 2):
            assert ((r, '00b_conjecture') in steps) == on, steps
            if on: assert steps.index((r, '00b_conjecture')) + 1 == steps.index((r, '00_select'))
        sel = run.params(2, '00_select')
        assert sel['extra_pool_paths'] == ([str(R(1)/'conjectures.jsonl'), str(R(2)/'conjectures.jsonl')] if on else [])
        assert sel['newer_results_paths'] == [str(R(1)/'verdicts.jsonl')] + ([str(R(2)/'conjecture_verdicts.jsonl')] if on else [])
        assert run.params(2, '02_sft')['conjecture_rows_path'] == (str(R(2)/'conjecture_rows.jsonl') if on else '')
        if on:
            c2 = run.params(2, '00b_conjecture')
            assert c2['verdicts_path'] == str(R(1)/'verdicts.jsonl')            # seeds: the freshest verified proofs
            assert c2['extra_problems_paths'] == [str(R(1)/'conjectures.jsonl')]
            assert run.params(1, '00b_conjecture')['extra_problems_paths'] == []


def test_the_dry_run_counts_the_stage(tmp_path):
    "`ei run --dry-run` lists 00b in every round with an ETA from the compute model (n_prompts x conj_per_prompt x (1 + n) samples at most)."
    import subprocess
    cfg = Path(__file__).resolve().parents[1]/'configs'/'demo_conjectures.toml'
    entry = 'import sys; from ei_nb.cli import _entry; sys.argv[0] = "ei"; _entry()'
    p = subprocess.run([sys.executable, '-c', entry, 'run', '--config', str(cfg), '--run-dir', str(tmp_path/'run'), '--dry-run'],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [l.split() for l in (p.stdout + p.stderr).splitlines() if l.split()[2:3] == ['00b_conjecture']]
    assert [l[1] for l in lines] == ['1', '2'] and all('ETA' in l and l[l.index('ETA') + 1] != '0:00:00' for l in lines), lines


# ---------------------------------------------------------------- issue 30: STP's rules
def _proving(rates:dict, n:int=8, proofs=None, lemma:str='sq_nonneg'):
    "Conjecture problems and proving records with the given passes out of n (distinct proofs unless `proofs` says otherwise)."
    p = MINIF2F['mathd_algebra_182']
    cps, smp, ver = [], [], []
    for name, c in rates.items():
        stmt = f'theorem {name} (a b : ℝ) : 0 ≤ (a - b) ^ 2 + a ^ 2 := by'
        cps.append({'name': name, 'split': 'conjecture', 'header': p['header'], 'formal_statement': stmt, 'source': 'conjecture',
                    'lemma': lemma, 'seed': 's', 'round': 1})
        for k in range(n):
            body = (proofs or {}).get(name, {}).get(k, f'  nlinarith [sq_nonneg (a - b), sq_nonneg a]  -- {k}')
            smp.append({'name': name, 'sample_idx': k, 'round': 1, 'completion': f'```lean4\n{stmt}\n{body}\n```', 'n_tokens': 9, 'capped': False})
            ver.append({'name': name, 'sample_idx': k, 'verdict': 'pass' if k < c else 'fail', 'reason': None if k < c else 'lean error: x',
                        'proof': p['header'] + stmt + '\n' + body})
    return cps, smp, ver


def test_the_keep_rule_is_strict_and_states_its_n():
    "Issue 30, point 6: STP keeps `get_succ_rate(...) < CONJECTURE_THRESHOLD` (RL_utils.py @ 2b5fe8b): 1/8 kept, 2/8 and 1/4 (n = 4) easy."
    from ei_nb.conjecture import select_conjectures
    cps, smp, ver = _proving({'one': 1, 'two': 2})
    assert select_conjectures(cps, smp, ver, 0.25)[1] == {'one': 'kept', 'two': 'easy'}
    cps, smp, ver = _proving({'quarter': 1}, n=4)
    assert select_conjectures(cps, smp, ver, 0.25)[1] == {'quarter': 'easy'}


def test_conjecture_proofs_become_prover_rows_as_stp(tiny):
    """Issue 30, point 5: STP trains the prover on the verified proofs of every statement proved at most half the time
    (RL/RL_step2_train.py @ 2b5fe8b, l. 145). A 4/8 with two identical proofs: its distinct proofs; B 5/8, C 0/8: none;
    D 1/8 with the lemma unused (not kept for the conjecturer): a row; a protected paraphrase: none."""
    from ei_nb.conjecture import conjecture_proof_rows, select_conjectures
    from ei_nb.prompts import render_prompt
    same = {0: '  nlinarith [sq_nonneg (a - b), sq_nonneg a]', 1: '  nlinarith  [sq_nonneg (a - b),  sq_nonneg a]'}
    cps, smp, ver = _proving({'A': 4, 'B': 5, 'C': 0, 'D': 1}, proofs={'A': same, 'D': {0: '  positivity'}})
    status = select_conjectures(cps, smp, ver, 0.25)[1]
    assert status == {'A': 'easy', 'B': 'easy', 'C': 'unproved', 'D': 'lemma_unused'}     # none kept for the pool
    rows = conjecture_proof_rows(cps, smp, ver, tiny, 1, max_per_problem=4, style='completion')
    assert sorted((r['name'], r['sample_idx']) for r in rows) == [('A', 0), ('A', 2), ('A', 3), ('D', 0)]   # A's 1 repeats A's 0
    by = {cp['name']: cp for cp in cps}
    assert all(r['kind'] == 'conjecture_proof' and r['prompt'] == render_prompt(by[r['name']], None, 'completion')
               and r['formal_statement'] == by[r['name']]['formal_statement'] for r in rows)
    para = 'theorem P (y x : ℝ) : 0 ≤ y ^ 2 + (y - x) ^ 2 := by'   # D's theorem, renamed and commuted, protected
    assert not [r for r in conjecture_proof_rows(cps, smp, ver, tiny, 1, protected=[{'name': 'z', 'formal_statement': para}], style='completion')
                if r['name'] in ('A', 'B', 'C', 'D')]


def test_this_rounds_conjectures_are_held_back_from_this_rounds_selection(tmp_path):
    "Their proofs are rows already (STP's direct route); 00_select holds this round's `conjectures.jsonl` back, later rounds may select it."
    from ei_nb.select import run_select
    cps, smp, ver = _proving({'A': 1, 'B': 1})
    write_records(tmp_path/'pool.jsonl', [dict(MINIF2F['mathd_algebra_182'], name='pool_a')], 'problem')
    write_records(tmp_path/'conjectures.jsonl', cps[:1], 'problem')
    write_records(tmp_path/'later.jsonl', cps[1:], 'problem')
    write_records(tmp_path/'v.jsonl', ver + [{'name': 'pool_a', 'sample_idx': k, 'verdict': 'pass' if k < 2 else 'fail'} for k in range(8)])
    summary, table = run_select(tmp_path/'pool.jsonl', tmp_path/'v.jsonl', tmp_path/'sel.jsonl', (), {}, extra_pool_paths=[tmp_path/'conjectures.jsonl', tmp_path/'later.jsonl'],
                                held_back_paths=[tmp_path/'conjectures.jsonl'])
    assert sorted(p['name'] for p in read_problems(tmp_path/'sel.jsonl')) == ['B', 'pool_a'] and summary['held_back'] == 1


def test_structural_key_catches_generated_paraphrases_of_minif2f():
    """Issue 30, point 8, measured (`tests/paraphrase.py`): every generated paraphrase (renamed, reordered, commuted, all three) of every
    parseable miniF2F statement has the statement's structural key, where the exact key catches almost none; no statement with one numeral
    changed, and no pair of distinct miniF2F statements, shares a key."""
    from tests.paraphrase import measure
    stmts = [r['formal_statement'] for r in MINIF2F.values()]
    m = measure(stmts, reps=1, seed=3)
    assert m['statements'] == 488 and m['parsed'] >= 484
    for kind in ('rename, original layout', 'rename', 'reorder', 'commute', 'all three'):
        assert m[kind]['n'] >= 480 and m[kind]['structural'] == m[kind]['n'], (kind, m[kind])
    assert m['all three']['exact'] == 0 and m['rename, original layout']['exact'] < 30
    assert m['perturbed']['n'] >= 480 and m['perturbed']['false_matches'] == 0 and m['collisions'] == 0


def test_a_paraphrased_test_problem_is_a_protected_conjecture():
    "A conjecture that is a miniF2F-test statement renamed, reordered and commuted: `protected` (structural), where the exact key let it in."
    import random
    from ei_nb.conjecture import check_candidates
    from tests.paraphrase import paraphrase
    test = [r for r in MINIF2F.values() if r['split'] == 'test']
    t = next(r for r in test if r['name'] == 'mathd_algebra_478')
    para = paraphrase(t['formal_statement'], random.Random(0))
    pp = {'name': 'cp', 'seed': 's', 'lemma': 'l', 'header': t['header'], 'formal_statement': 'theorem s : True := by'}
    gen = [{'name': 'cp', 'sample_idx': 0, 'completion': ' ' + para.split(None, 1)[1].removesuffix(':= by') + '\n' + HARD_END, 'capped': False}]
    assert check_candidates(gen, {'cp': pp}, set(), protected=[])[0]['status'] == 'accepted'
    c = check_candidates(gen, {'cp': pp}, set(), protected=test)[0]
    assert (c['status'], c['reason']) == ('protected', 'structural')

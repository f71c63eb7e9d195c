"""00b_conjecture, issue 35 point 5: STP's lemma-free route and `conjecture_multiplier` (kfdong/STP @ 2b5fe8b,
RL/utils/RL_utils.py l. 336, 398-408, 424, 451-454, 487-498). A seed whose proof cites no lemma (every proof of the
arith fragment) used to give no prompt at all; now it gives STP's lemma-free prompt, and what it conjectures is
checked by the arith checker, proved in the same round and kept lemma-free."""
import json, re
from pathlib import Path

from ei_nb.arith import arith_problem, arith_proof
from ei_nb.conjecture import (EASY_MARK, HARD_END, HARD_MARK, LEMMA_FREE, LEMMA_FREE_STATEMENT, LEMMA_MARK,
                              conjectures_per_prompt, proof_lemmas)
from ei_nb.core import read_problems, write_records
from ei_nb.rows import read_sft_rows
from ei_nb.samplers import SAMPLERS, TransformersSampler
from ei_nb.verify import verifier_of
from tests.test_conjectures import run_conj, tiny  # noqa: F401  (the module's tiny-model fixture)

POOL = [arith_problem(ops) for ops in ([2, 3], [4, 5], [12, 7], [3, 3], [21, 40])]
NEW = (17, 25)   # the scripted conjecturer's new sum: not in the pool


class ArithScripted(TransformersSampler):
    """Conjectures: a new sum of the fragment, a pool problem again, and a statement outside the fragment. Proofs: the
    first sample of each conjecture is the right value, the other seven a wrong one (pass rate 1/8)."""
    name = 'arith_scripted'
    def generate(self, prompts, params, seeds):
        out = []
        for p in prompts:
            if p.endswith(HARD_MARK + '\ntheorem'):
                texts = [f' new_sum : ∃ n : ℕ, {NEW[0]} + {NEW[1]} = n\n{HARD_END}',
                         f' again : ∃ n : ℕ, 2 + 3 = n\n{HARD_END}',
                         f' outside (x : ℕ) : x + 0 = x\n{HARD_END}']
                out.append([{'completion': texts[i % 3], 'n_tokens': 12, 'capped': False} for i in range(params.n)])
            else:
                a, b = map(int, re.findall(r'∃ n : ℕ, (\d+) \+ (\d+) = n', p)[-1])
                out.append([{'completion': f'  exact ⟨{a + b + (i > 0)}, by norm_num⟩', 'n_tokens': 9, 'capped': False}
                            for i in range(params.n)])
        return out


def _arith_pool(d: Path):
    d.mkdir(parents=True, exist_ok=True)
    write_records(d/'pool.jsonl', POOL, 'problem')
    write_records(d/'verdicts.jsonl', [{'name': p['name'], 'sample_idx': 0, 'verdict': 'pass', 'reason': None,
                                        'proof': p['header'] + p['formal_statement'] + arith_proof(p)} for p in POOL],
                  'verdict')
    assert all(proof_lemmas(p['formal_statement'] + arith_proof(p)) == [] for p in POOL)   # no seed cites a lemma


def _run(tiny, d: Path, out: Path, **rules):
    SAMPLERS['arith_scripted'] = ArithScripted
    return run_conj(tiny, d/'pool.jsonl', d/'verdicts.jsonl', out, 1, (), verifier_of('arith', workers=1, timeout=5),
                    sampler='arith_scripted', n_prompts=10, conj_per_prompt=3, **rules)


def test_a_lemma_free_seed_now_gives_a_conjecture_prompt(tiny, tmp_path):
    "Before issue 35 (no lemma-free route): zero prompts from arith seeds. Now: STP's lemma-free prompts."
    _arith_pool(tmp_path)
    off = _run(tiny, tmp_path, tmp_path/'off', lemma_free_prob=0.0)
    assert (off['seeds'], off['prompts'], off['generated'], off['kept']) == (5, 0, 0, 0)
    res = _run(tiny, tmp_path, tmp_path/'on', lemma_free_prob=1.0, lemma_free_frac=1.0)
    prompts = read_problems(tmp_path/'on'/'conjecture_prompts.jsonl')
    assert res['prompts'] == res['lemma_free_prompts'] == len(prompts) == 5 and res['lemmas'] == 0
    for p in prompts:
        assert p['lemma'] == LEMMA_FREE and f'{LEMMA_MARK}\n{LEMMA_FREE_STATEMENT}\n{EASY_MARK}\n' in p['turn_prompt']
        assert p['turn_prompt'].endswith(HARD_MARK + '\ntheorem')
    # the arith checker sorts the conjectures: the new sum is accepted once, the rest is the pool or outside it
    cands = [json.loads(l) for l in open(tmp_path/'on'/'conjecture_candidates.jsonl', encoding='utf-8')]
    new = [c for c in cands if c['statement'] and f'{NEW[0]} + {NEW[1]}' in c['statement']]
    assert [c['status'] for c in new] == ['accepted'] + ['duplicate'] * 4
    assert {c['status'] for c in cands if c['statement'] and '2 + 3' in c['statement']} <= {'seed', 'pool'}
    assert {c['status'] for c in cands if c['statement'] and 'x + 0' in c['statement']} == {'not_elaborated',
                                                                                          'duplicate'}
    # proved in the same round (1 of 8), kept lemma-free, a conjecturer row on the lemma-free prompt and a prover row
    assert (res['to_prove'], res['proved'], res['kept'], res['kept_lemma_free']) == (1, 1, 1, 1)
    kept = read_problems(tmp_path/'on'/'conjectures.jsonl')
    assert f'{NEW[0]} + {NEW[1]} = n' in kept[0]['formal_statement'] and kept[0]['lemma'] == LEMMA_FREE
    rows = read_sft_rows(tmp_path/'on'/'conjecture_rows.jsonl')
    assert sorted(r['kind'] for r in rows) == ['conjecture', 'conjecture_proof']
    conj = next(r for r in rows if r['kind'] == 'conjecture')
    assert LEMMA_FREE_STATEMENT in conj['prompt'] and conj['completion'].endswith(HARD_END)


def test_stp_caps_the_lemma_free_prompts_at_its_fraction(tiny, tmp_path):
    _arith_pool(tmp_path)
    res = _run(tiny, tmp_path, tmp_path/'r', lemma_free_prob=1.0, lemma_free_frac=0.2)   # 0.2 · 10 prompts
    assert res['prompts'] == res['lemma_free_prompts'] == 2


def test_conjecture_multiplier_follows_stp_and_proves_at_most_n_prompts(tiny, tmp_path):
    "STP l. 424: max(multiplier, min(3·N // prompts, 8)) conjectures per prompt; l. 451-454: at most N proved."
    _arith_pool(tmp_path)
    res = _run(tiny, tmp_path, tmp_path/'r', lemma_free_prob=1.0, lemma_free_frac=1.0, conjecture_multiplier=1)
    assert res['per_prompt'] == conjectures_per_prompt(10, 5, 3, 1) == 6 and res['generated'] == 5 * 6
    assert res['conjecture_multiplier'] == 1 and res['to_prove'] <= 10
    off = _run(tiny, tmp_path, tmp_path/'off', lemma_free_prob=1.0, lemma_free_frac=1.0)
    assert off['per_prompt'] == 3 and off['generated'] == 5 * 3          # 0: conj_per_prompt, as before issue 35


def test_the_cap_marks_surplus_conjectures_before_proving():
    from ei_nb.conjecture import cap_accepted
    cands = [{'status': 'accepted', 'name': f'c{i}'} for i in range(12)] + [{'status': 'pool', 'name': 'p'}]
    capped = cap_accepted(cands, 10, seed=3)
    assert [c['status'] for c in capped].count('accepted') == 10 and capped[-1]['status'] == 'pool'
    assert capped == cap_accepted(cands, 10, seed=3) and capped != cap_accepted(cands, 10, seed=4)


def test_the_config_keys_reach_the_rules():
    "The keys are [conjecture] keys of the demo configs and fields of `ConjectureRules` (unknown keys are BadInput)."
    import tomllib
    from dataclasses import fields
    from ei_nb.conjecture import ConjectureRules
    root = Path(__file__).resolve().parents[1]
    names = {f.name for f in fields(ConjectureRules)}
    for cfg in ('demo_conjectures.toml', 'demo_learn_conjectures.toml'):
        sec = tomllib.loads((root/'configs'/cfg).read_text(encoding='utf-8'))['conjecture']
        for k in ('lemma_free_prob', 'lemma_free_frac', 'keep_lemma_unused', 'conjecture_multiplier'):
            assert k in sec and k in names, (cfg, k)


def test_warm_conjecture_rows_teach_the_exact_text_the_stage_prompts_and_parses(tiny):
    """STP's SFT holds conjecture examples (Notebooks/construct_sft.ipynb @ 2b5fe8b); a warm start built with
    `warm_conjecture_rows` shows the stage's own lemma-free prompt and a target its parser reads back as the harder
    problem, which the stage's checks then accept as new."""
    from ei_nb.conjecture import check_candidates, parse_conjecture, prompt_problem, seed_proofs, warm_conjecture_rows
    from ei_nb.core import statement_key
    easy, hard = arith_problem([2, 3]), arith_problem([47, 38])
    full = easy['header'] + easy['formal_statement'] + arith_proof(easy)
    rows = warm_conjecture_rows([(easy, full, hard)], tiny)
    seed = seed_proofs([easy], [{'name': easy['name'], 'sample_idx': 0, 'verdict': 'pass', 'proof': full}])[0]
    pp = prompt_problem(seed, LEMMA_FREE, LEMMA_FREE_STATEMENT, 0, 1)
    assert len(rows) == 1 and rows[0]['prompt'] == pp['turn_prompt']          # the generation prompt, to the byte
    assert statement_key(parse_conjecture(rows[0]['completion'])) == statement_key(hard['formal_statement'])
    gen = {'name': pp['name'], 'sample_idx': 0, 'completion': rows[0]['completion'], 'capped': False}
    assert check_candidates([gen], {pp['name']: pp}, set())[0]['status'] == 'accepted'

"""The arith demo's sets under the package's own protected near-duplicate check (issue 35, point 4).

The learning demo's warm-start set once held the commuted twin (`b + a`) of 5 scored problems (seed 1), which
00_select's check (`ei_nb.select.decontaminate`: name, statement key, structural key) flags. These tests draw the
sets of the demo config as the demo stage does, hold them to that check, and show the refusal catches the old draw.
"""
import random
from pathlib import Path
import pytest

from ei_nb.arith import SPLITS, arith_sets, draw_grade
from ei_nb.config import load_config
from ei_nb.core import BadInput
from ei_nb.demo import build_arith_data, refuse_leaks
from ei_nb.select import decontaminate

REPO = Path(__file__).resolve().parents[1]


def demo_keys(name='demo_learn.toml') -> dict:
    cfg = load_config(REPO/'configs'/name)
    return cfg['stages']['demo']


def old_draw(seed, scored, pool, warm) -> dict:
    "The sets as `arith_sets` drew them before issue 35: disjoint by name only, in the same order from the same seed."
    rng, taken, out = random.Random(seed), set(), {}
    for kind, grades in (('scored', scored), ('pool', pool), ('warm', warm)):
        out[kind] = [p for g in sorted(grades) for p in draw_grade(rng, g, grades[g], taken, SPLITS[kind], seed)]
    return out


def test_seed_1_old_draw_leaked_twins_and_the_demo_stage_refuses_them():
    d = demo_keys()
    old = old_draw(1, d['arith_scored'], d['arith_pool'], d['arith_warm'])
    leaked = decontaminate(old['warm'], old['scored'])[1]
    assert leaked, 'the seed-1 draw of before issue 35 held commuted twins of scored problems'
    a, b = leaked[0]['name'].split('_')[1:]
    assert f'add_{b}_{a}' in {p['name'] for p in old['scored']}   # the twin is the commuted sum
    with pytest.raises(BadInput, match=f"warm-start problem {leaked[0]['name']!r} is a protected near-duplicate "
                                       f"of the held-out problem 'add_{b}_{a}' \\({len(leaked)} warm-start"):
        refuse_leaks(old['warm'], old['scored'])


@pytest.mark.parametrize('seed', [1, 7])
def test_demo_sets_pass_the_protected_check(seed, tmp_path):
    d = demo_keys()
    data = build_arith_data(tmp_path, seed, d['arith_scored'], d['arith_pool'], d['arith_warm'], d['arith_test'])
    held = data['scored'] + data['test']
    assert len(data['test']) == sum(d['arith_test'].values()) > 0
    assert {p['split'] for p in data['test']} == {'test'}
    for kind in ('pool', 'warm'):
        assert decontaminate(data[kind], held)[1] == [], kind
    assert decontaminate(data['test'], data['scored'] + data['pool'] + data['warm'])[1] == []
    assert (tmp_path/'test.jsonl').is_file()
    # the first three sets start as before: the scored set is drawn first, from the same seed
    assert data['scored'] == old_draw(seed, d['arith_scored'], {}, {})['scored']


def test_demo_config_protects_the_test_file(tmp_path):
    "The test set is a protected file of the run (`{run_dir}` expanded), so the driver excludes it from every stage."
    from ei_nb.sources import Sources
    cfg = load_config(REPO/'configs'/'demo_learn.toml')
    src = Sources(cfg, tmp_path/'run')
    assert str((tmp_path/'run').resolve()/'demo'/'test.jsonl') in src.excluded()


def test_test_set_clear_of_every_earlier_problem():
    sets = arith_sets(3, {'2+2': 40}, {'2+2': 300}, {'2+2': 300}, {'2+2': 40})
    sums = lambda ps: {tuple(sorted(p['name'].split('_')[1:])) for p in ps}
    assert not sums(sets['test']) & sums(sets['scored'] + sets['pool'] + sets['warm'])
    assert not sums(sets['pool'] + sets['warm']) & sums(sets['scored'])

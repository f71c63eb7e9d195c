"Foundation: records, the `ei` CLI contract, selection, statistics, McNemar and the stop rule."
import json, subprocess, sys
from fractions import Fraction
from math import comb
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from ei_nb.cli import main
from ei_nb.core import read_problems, shared_data, write_records
from ei_nb.report import mcnemar_p, mcnemar_power, mcnemar_table
from ei_nb.stop_rule import stop_decision

DATA = shared_data()
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"


def run_ei(capsys, *argv):
    "Run `ei ARGV` in-process: (exit code, parsed last stdout line or None, stderr)."
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = [l for l in out.splitlines() if l.strip()]
    return code, (json.loads(lines[-1]) if lines else None), err


@pytest.fixture
def minif2f():
    return read_problems(DATA / 'minif2f_dsp15.jsonl')


@pytest.fixture
def files(tmp_path, minif2f):
    "A pool of 30 real miniF2F-valid statements, verdicts with known pass counts, and the test split."
    pool = [p for p in minif2f if p['split'] == 'valid'][:30]
    write_records(tmp_path / 'pool.jsonl', pool, 'problem')
    write_records(tmp_path / 'test.jsonl', [p for p in minif2f if p['split'] == 'test'], 'problem')
    rows = [{'name': p['name'], 'sample_idx': i, 'verdict': 'pass' if i < j % 9 else 'fail', 'reason': None}
            for j, p in enumerate(pool) for i in range(8)]
    write_records(tmp_path / 'v.jsonl', rows, 'verdict')
    return tmp_path, pool, rows


# ---------- records: every kind of bad input names file, line and field; nothing is written ----------

BAD_VERDICTS = {
    'missing field': ('{"name": "a", "sample_idx": 0, "verdict": "pass"}\n{"name": "b", "verdict": "pass"}\n', ':2:', "'sample_idx'"),
    'wrong type': ('{"name": "a", "sample_idx": "0", "verdict": "pass"}\n', ':1:', "'sample_idx'"),
    'bool as int': ('{"name": "a", "sample_idx": true, "verdict": "pass"}\n', ':1:', "'sample_idx'"),
    'bad verdict': ('{"name": "a", "sample_idx": 0, "verdict": "ok"}\n', ':1:', "'verdict'"),
    'duplicate key': ('{"name": "a", "sample_idx": 0, "verdict": "pass"}\n{"name": "a", "sample_idx": 0, "verdict": "fail"}\n', ':2:', "'name+sample_idx'"),
    'invalid json': ('{"name": "a", "sample_idx": 0, "verdict": "pass"}\n{"name": "a", \n', ':2:', 'invalid JSON'),
    'empty file': ('', ':1:', 'empty'),
}


@pytest.mark.parametrize('case', sorted(BAD_VERDICTS))
def test_bad_verdicts_are_refused_with_file_line_field(tmp_path, capsys, files, case):
    text, where, what = BAD_VERDICTS[case]
    bad = tmp_path / 'bad.jsonl'
    bad.write_text(text)
    for argv in (['stats', '--verified', bad],
                 ['select', '--pool', files[0] / 'pool.jsonl', '--results', bad, '--out', tmp_path / 'sel.jsonl']):
        code, _, err = run_ei(capsys, *argv)
        assert code == 2
        assert f'{bad}{where}' in err and what in err, err
    assert not (tmp_path / 'sel.jsonl').exists()


def test_bad_problem_records(tmp_path, capsys, files):
    p = tmp_path / 'pool.jsonl'
    good = {'name': 'a', 'split': 'train', 'formal_statement': 'theorem a : True := by', 'header': HEADER}
    cases = {'duplicate name': ([good, good], ":2: field 'name'"),
             'missing header': ([{k: v for k, v in good.items() if k != 'header'}], ":1: field 'header'"),
             'statement without := by': ([dict(good, formal_statement='theorem a : True')], ":1: field 'formal_statement'")}
    for rows, msg in cases.values():
        p.write_text(''.join(json.dumps(r) + '\n' for r in rows))
        code, _, err = run_ei(capsys, 'select', '--pool', p, '--results', files[0] / 'v.jsonl', '--out', tmp_path / 'o.jsonl')
        assert code == 2 and msg in err, err
        assert not (tmp_path / 'o.jsonl').exists()


def test_real_shared_files_load():
    probs = read_problems(DATA / 'minif2f_dsp15.jsonl')
    assert len(probs) == 488 and len({p['name'] for p in probs}) == 488
    assert all(p['header'] == HEADER for p in probs)


# ---------- ei select ----------

def test_select_band_and_protected(tmp_path, capsys, files, minif2f):
    d, pool, rows = files
    # a renamed, re-spaced copy of a test problem in the pool must be removed as protected
    t = next(p for p in minif2f if p['split'] == 'test')
    sneaky = dict(t, name='innocent_name', split='train',
                  formal_statement=t['formal_statement'].replace(t['name'], 'innocent_name').replace(' ', '  '))
    write_records(d / 'pool2.jsonl', pool + [sneaky], 'problem')
    write_records(d / 'v2.jsonl', rows + [{'name': 'innocent_name', 'sample_idx': i, 'verdict': 'pass' if i < 3 else 'fail'} for i in range(8)], 'verdict')
    code, out, _ = run_ei(capsys, 'select', '--pool', d / 'pool2.jsonl', '--results', d / 'v2.jsonl',
                          '--out', d / 'sel.jsonl', '--protected', d / 'test.jsonl',
                          '--no-include-zero', '--max-problems', '300')   # the recipe's band (the CLI's defaults are the
    assert code == 0                                                     # notebook's CPU-sized ones)
    sel = read_problems(d / 'sel.jsonl')
    rates = {p['name']: (j % 9) / 8 for j, p in enumerate(pool)}
    expected = sorted(n for n, r in rates.items() if 0 < r <= 0.75)
    assert sorted(p['name'] for p in sel) == expected
    assert out['protected_removed'] == 1 and out['selected'] == len(expected)
    assert all(p['n_samples'] == 8 and p['pass_rate'] == p['n_pass'] / 8 for p in sel)


def test_select_unchecked_never_counts_and_unmeasured(tmp_path, capsys, files):
    d, pool, _ = files
    rows = [{'name': p['name'], 'sample_idx': i, 'verdict': 'unchecked'} for p in pool[:5] for i in range(4)]
    write_records(d / 'u.jsonl', rows, 'verdict')
    code, out, err = run_ei(capsys, 'select', '--pool', d / 'pool.jsonl', '--results', d / 'u.jsonl', '--out', d / 's.jsonl',
                            '--no-include-zero')
    assert code == 4 and 'no problem in the pass-rate band' in err   # all p = 0: a data stop
    code, out, _ = run_ei(capsys, 'select', '--pool', d / 'pool.jsonl', '--results', d / 'u.jsonl', '--out', d / 's.jsonl',
                          '--include-zero', '--max-zero', '3')
    assert code == 0 and out['selected'] == 3 and out['unmeasured'] == 25


def test_select_caps_are_deterministic(tmp_path, capsys, files):
    d = files[0]
    picks = []
    for seed in (0, 0, 1):
        code, out, _ = run_ei(capsys, 'select', '--pool', d / 'pool.jsonl', '--results', d / 'v.jsonl',
                              '--out', d / 's.jsonl', '--max-problems', '5', '--seed', seed)
        assert code == 0 and out['selected'] == 5
        picks.append([p['name'] for p in read_problems(d / 's.jsonl')])
    assert picks[0] == picks[1] and picks[0] != picks[2]


# ---------- ei stats ----------

def test_stats(tmp_path, capsys, files):
    d, pool, rows = files
    code, out, _ = run_ei(capsys, 'stats', '--verified', d / 'v.jsonl', '--k', '1,8')
    counts = [j % 9 for j in range(len(pool))]
    assert code == 0
    assert out['solved'] == sum(c > 0 for c in counts) and out['n_problems'] == 30
    assert out['pass_at_k']['1'] == pytest.approx(sum(c / 8 for c in counts) / 30)
    assert out['pass_at_k']['8'] == pytest.approx(out['solved'] / 30)
    code, _, err = run_ei(capsys, 'stats', '--verified', d / 'v.jsonl', '--k', '32')
    assert code == 2 and 'fewer than 32 samples' in err


# ---------- ei mcnemar ----------

def test_mcnemar_cli(tmp_path, capsys, files):
    d, pool, rows = files
    flipped = [dict(r, verdict='pass' if r['name'] in {pool[0]['name'], pool[9]['name']} else r['verdict']) for r in rows]
    flipped = [dict(r, verdict='fail') if r['name'] == pool[1]['name'] else r for r in flipped]
    write_records(d / 'b.jsonl', flipped, 'verdict')
    code, out, _ = run_ei(capsys, 'mcnemar', '--a', d / 'v.jsonl', '--b', d / 'b.jsonl')
    assert code == 0
    assert (out['b'], out['c'], out['net']) == (1, 2, 1)
    assert out['both'] + out['neither'] + out['b'] + out['c'] == 30
    assert out['p_value'] == pytest.approx(mcnemar_p(1, 2))
    write_records(d / 'short.jsonl', [r for r in rows if r['name'] != pool[5]['name']], 'verdict')
    code, _, err = run_ei(capsys, 'mcnemar', '--a', d / 'v.jsonl', '--b', d / 'short.jsonl')
    assert code == 2 and 'different problems' in err
    write_records(d / 'sub.jsonl', pool[:5], 'problem')
    code, out, _ = run_ei(capsys, 'mcnemar', '--a', d / 'v.jsonl', '--b', d / 'short.jsonl', '--problems', d / 'sub.jsonl')
    assert code == 0 and out['both'] + out['neither'] + out['b'] + out['c'] == 5


def _brute_p(b, c):
    "Two-sided exact p: twice the probability of a split at least as lopsided, by enumeration in exact arithmetic."
    n = b + c
    if n == 0: return 1.0
    tail = sum(Fraction(comb(n, k), 2 ** n) for k in range(0, min(b, c) + 1))
    return float(min(Fraction(1), 2 * tail))


@given(st.integers(0, 60), st.integers(0, 60))
@settings(max_examples=150, deadline=None)
def test_mcnemar_p_against_brute_force(b, c):
    assert mcnemar_p(b, c) == pytest.approx(_brute_p(b, c), rel=1e-9, abs=1e-15)


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=80))
@settings(max_examples=100, deadline=None)
def test_mcnemar_table_against_brute_force(pairs):
    names = [f'p{i}' for i in range(len(pairs))]
    a = pd.Series({n: x for n, (x, _) in zip(names, pairs)})
    b = pd.Series({n: y for n, (_, y) in zip(names, pairs)}).sample(frac=1, random_state=0)   # order must not matter
    t = mcnemar_table(a, b)
    assert t['b'] == sum(x and not y for x, y in pairs) and t['c'] == sum(y and not x for x, y in pairs)
    assert t['both'] == sum(x and y for x, y in pairs) and t['neither'] == sum(not x and not y for x, y in pairs)


def test_power_is_sane():
    assert mcnemar_power(240, 0.0, 0.12) <= 0.05
    p4, p8 = mcnemar_power(240, 0.04, 0.15), mcnemar_power(240, 0.08, 0.15)
    assert 0.2 < p4 < 0.45 < p8


# ---------- ei stop: the rule of DESIGN.md against an independent reading of it ----------

def _reference_rule(S, rounds, regress, gain):
    r = len(S)
    best = lambda xs: 1 + min(i for i, x in enumerate(xs) if x == max(xs))
    if r >= 2 and S[r - 1] <= max(S[:r - 1]) - regress:
        return True, 'regression', best(S[:r - 1])
    if r >= 3:
        g_r = S[r - 1] - max(S[:r - 1])
        g_prev = S[r - 2] - max(S[:r - 2])
        if g_r < gain and g_prev < gain:
            return True, 'plateau', best(S)
    if r >= rounds:
        return True, 'budget', best(S)
    return False, None, best(S)


@given(st.lists(st.integers(0, 30), min_size=1, max_size=7), st.integers(1, 8), st.integers(1, 5), st.integers(1, 4))
@settings(max_examples=400, deadline=None)
def test_stop_rule_against_reference(S, rounds, regress, gain):
    d = stop_decision(S, rounds, regress, gain)
    assert (d['stop'], d['reason'], d['best_round']) == _reference_rule(S, rounds, regress, gain)


def test_stop_cli(capsys):
    code, out, _ = run_ei(capsys, 'stop', '--scores', '100,101,100', '--rounds', '5')
    assert code == 0 and out == {'stop': True, 'reason': 'plateau', 'best_round': 2}
    code, _, err = run_ei(capsys, 'stop', '--scores', '1,x')
    assert code == 2 and '--scores' in err


# ---------- the CLI starts fast: commands that need no model never import torch ----------

@pytest.mark.parametrize('cmd', ['stop', 'stats', 'select', 'mcnemar'])
def test_cli_does_not_import_torch(tmp_path, files, cmd):
    d = files[0]
    argv = {'stop': ['stop', '--scores', '1,2'], 'stats': ['stats', '--verified', str(d / 'v.jsonl')],
            'select': ['select', '--pool', str(d / 'pool.jsonl'), '--results', str(d / 'v.jsonl'), '--out', str(tmp_path / 's.jsonl')],
            'mcnemar': ['mcnemar', '--a', str(d / 'v.jsonl'), '--b', str(d / 'v.jsonl')]}[cmd]
    code = ('import sys, json; from ei_nb.cli import main; rc = main(%r); '
            'print(json.dumps({"rc": rc, "torch": "torch" in sys.modules}))' % argv)
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    last = json.loads(res.stdout.strip().splitlines()[-1])
    assert last == {'rc': 0, 'torch': False}, res.stderr


def test_console_script_exit_codes(tmp_path):
    ok = subprocess.run(['ei', 'stop', '--scores', '5,1'], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and json.loads(ok.stdout.splitlines()[-1])['reason'] == 'regression'
    bad = subprocess.run(['ei', 'stats', '--verified', str(tmp_path / 'missing.jsonl')], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and 'no such file' in bad.stderr

"""`ei sweep` as a user calls it: the arms resolve to the real configs, bad arguments exit 2 naming the fix, and the
report reads run folders laid out as `ei run` writes them (eval verdicts per round) into a table and a figure."""
import json, subprocess, sys
from pathlib import Path
import pytest

REPO = Path(__file__).resolve().parents[1]
ENTRY = 'import sys; from ei_nb.cli import _entry; sys.argv[0] = "ei"; _entry()'


def ei(*args, cwd=REPO):
    return subprocess.run([sys.executable, '-c', ENTRY, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={'OMP_NUM_THREADS': '1', 'MPLBACKEND': 'Agg', 'PATH': '/usr/bin:/bin'})


def write_eval(run_dir:Path, r:int, solved:list[bool]):
    d = run_dir/f'round_{r:02d}'/'eval'; d.mkdir(parents=True)
    (d/'eval_verdicts.jsonl').write_text(''.join(
        json.dumps({'name': f'add_{i}_1', 'sample_idx': j, 'verdict': 'pass' if s and j == 0 else 'fail'}) + '\n'
        for i, s in enumerate(solved) for j in range(4)))


def test_every_control_arm_has_its_config_and_differs_from_plain_only_in_the_control():
    import tomllib
    plain = tomllib.loads((REPO/'configs'/'demo_learn.toml').read_text())
    for arm, control in (('control_unverified', 'unverified'), ('control_warm_more', 'warm_more')):
        cfg = tomllib.loads((REPO/'configs'/f'demo_learn_{arm}.toml').read_text())
        assert cfg['sft']['control'] == control and plain['sft']['control'] == ''
        for section in plain:
            drop = {'name'} if section == 'run' else {'control'} if section == 'sft' else set()
            assert {k: v for k, v in cfg[section].items() if k not in drop} == \
                   {k: v for k, v in plain[section].items() if k not in drop}, (arm, section)


def test_unknown_arm_and_bad_seeds_exit_2_naming_the_choices(tmp_path):
    p = ei('sweep', '--config', 'configs/demo_learn.toml', '--arms', 'plain,nonsense', '--report-only',
           '--out', tmp_path/'s')
    assert p.returncode == 2 and 'control_unverified' in p.stderr and 'Traceback' not in p.stderr, p.stderr
    p = ei('sweep', '--config', 'configs/demo_learn.toml', '--seeds', 'x', '--report-only', '--out', tmp_path/'s')
    assert p.returncode == 2 and 'a count K' in p.stderr


def test_report_of_run_folders_gives_the_table_and_the_figure(tmp_path):
    out, figs, n = tmp_path/'sweep', tmp_path/'figures', 40
    for seed in (1, 2, 3):
        plain, ctl = out/'plain'/f'seed{seed}', out/'control_unverified'/f'seed{seed}'
        base = [i < 10 for i in range(n)]
        for d in (plain, ctl): write_eval(d, 0, base)
        write_eval(plain, 1, [i < 10 + 12 + seed for i in range(n)])   # plain gains 13, 14, 15
        write_eval(ctl, 1, [i < 10 + (seed == 2) for i in range(n)])    # the control gains 0, 1, 0
    p = ei('sweep', '--config', 'configs/demo_learn.toml', '--seeds', '3', '--arms', 'plain,control_unverified',
           '--report-only', '--out', out, '--figures', figs)
    assert p.returncode == 0, p.stderr
    res = json.loads((out/'sweep.json').read_text())
    assert (figs/'sweep_demo_learn.png').stat().st_size > 10_000
    import pandas as pd
    t = pd.read_csv(out/'sweep_table.csv').set_index(['arm', 'round'])
    assert t.loc[('plain', 1), 'S_mean'] == 24 and t.loc[('plain', 1), 'sig_vs_base'] == '3/3'
    assert t.loc[('control_unverified', 1), 'minus_plain_mean'] == pytest.approx((-13 - 13 - 15) / 3)
    assert t.loc[('control_unverified', 1), 'plain_sig_better'] == '3/3'
    assert any(v.startswith('round 1: plain beats control_unverified') for v in res['verdicts']), res['verdicts']
    assert 'plain beats control_unverified' in (out/'sweep_table.md').read_text()

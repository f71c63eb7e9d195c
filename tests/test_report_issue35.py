"""06_report, issue 35 point 6: the demo notice is true for each demo, and power is the design's, never post hoc.
The arith demo's report once said "real Lean (arith)" and "it memorises, it does not prove"; both were false."""
import json, subprocess, sys
from pathlib import Path

from ei_nb.core import atomic_write_json, iter_jsonl, write_records
from ei_nb.layout import RunLayout
from ei_nb.report import (demo_notice, design_note, design_power, example_run, load_run, mcnemar_power, mcnemar_rows,
                          min_detectable_effect)

NBS = Path(__file__).resolve().parents[1] / 'nbs'
OLD_ARITH_NOTICE = ('ARITH DEMO, EXACT CHECKER, NO LEAN: the problems are Lean theorems of a tiny fragment '
                    '(ei_nb.arith). The model is a tiny Qwen3 warm-started on the easy end only.')


def _markdown_outputs(nb_path: Path) -> str:
    nb = json.loads(nb_path.read_text(encoding='utf-8'))
    return '\n'.join(''.join(o.get('data', {}).get('text/markdown', ''))
                     for c in nb['cells'] for o in c.get('outputs', []))


def test_arith_notice_says_exact_checker_not_lean_and_learns():
    "Every way the report can meet an arith demo: backend recorded or not, demo.json with or without its domain."
    for verifier, demo in (('arith', {'domain': 'arith', 'notice': OLD_ARITH_NOTICE}), (None, {'domain': 'arith'}),
                           ('arith', None), ('arith', {'notice': 'Verification: real Lean (arith)'})):
        said = demo_notice(verifier, demo)
        assert 'exact checker' in said and 'not Lean' in said and 'learns' in said, (verifier, demo, said)
        assert 'real Lean' not in said and 'memorises' not in said and 'known proofs:' not in said, (verifier, said)


def test_known_proof_notice_stays_true_for_the_minif2f_demo():
    "The miniF2F known-proof demo: its own notice (no Lean) and that the model memorises the proofs it was taught."
    said = demo_notice('known', {'domain': 'minif2f', 'notice': 'DEMO VERIFICATION, NO LEAN: byte-identical'})
    assert 'DEMO VERIFICATION, NO LEAN' in said and 'it memorises, it does not prove' in said and 'learns' not in said
    bare = demo_notice(None, {})   # an old run: no backend recorded, no notice: still "not Lean", still memorises
    assert 'not Lean' in bare and 'memorises' in bare and 'real Lean' not in bare


def test_the_executed_report_of_an_arith_demo_run_says_the_truth(tmp_path):
    "The notebook itself, under papermill, on a run whose round-0 manifest records no backend (the old code's path)."
    run = example_run(tmp_path / 'run', n_problems=12, rounds=1)
    L = RunLayout(run)
    atomic_write_json(L.demo_json, {'domain': 'arith', 'notice': OLD_ARITH_NOTICE})
    out = tmp_path / 'report.ipynb'
    res = subprocess.run([sys.executable, '-m', 'papermill', str(NBS / '06_report.ipynb'), str(out), '--cwd', str(NBS),
                          '-p', 'run_dir', str(run), '-p', 'figures_dir', str(tmp_path / 'figs'),
                          '--log-level', 'ERROR'],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    md = _markdown_outputs(out)
    assert '**This is the CPU demo.**' in md and 'exact checker' in md and 'learns' in md
    assert 'memorises' not in md and 'real Lean' not in md
    assert 'design_power' in md and 'observed power' not in md and 'would be detected with probability' not in md


def _significant_run(tmp_path) -> dict:
    "The crafted run with round 2's model solving every scored problem: round 2 vs base is significant."
    run = example_run(tmp_path / 'run')
    R2 = RunLayout(run).round(2)
    rows = [dict(v, verdict='pass') for _, v in iter_jsonl(R2.eval_verdicts)]
    write_records(R2.eval_verdicts, rows)
    return load_run(run)


def test_mcnemar_table_has_design_power_beside_non_significant_results_only(tmp_path):
    mc = mcnemar_rows(_significant_run(tmp_path), alpha=0.05, p_disc_assumed=0.2)
    assert mc['significant'].any() and (~mc['significant']).any(), mc   # both kinds of row are present
    assert mc.loc[mc['significant'], 'design_power'].isna().all()
    ns = mc[~mc['significant']]
    assert ns['design_power'].tolist() == [mcnemar_power(int(n), 0.04, 0.2, 0.05) for n in ns['n']]
    assert mc['discordance'].tolist() == ((mc['b'] + mc['c']) / mc['n']).tolist()
    # the power is the registered discordance's, not the observed one's
    assert all(mcnemar_power(int(n), 0.04, 0.2) != mcnemar_power(int(n), min(0.04, d), d)
               for n, d in zip(ns['n'], ns['discordance']))
    assert [c for c in mc.columns if 'power' in c] == ['design_power']


def test_design_power_and_note_use_the_registered_discordance():
    assert design_power(128, 0.12) == mcnemar_power(128, 0.04, 0.12)
    assert design_power(128, 0.12) != design_power(128, 0.3)
    note = design_note(128, 0.12)
    assert f'+{min_detectable_effect(128, 0.12) * 100:.1f} pp' in note and '12% of them are discordant' in note
    assert 'observed power' not in note and '(b + c) / n' in note

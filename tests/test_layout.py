"""The run layout is the one place that names a run's files: the readers and writers agree with it."""
import json
from pathlib import Path
from ei_nb.layout import RunLayout, FINAL, OUTPUTS, ROUND_STAGES, write_stage_json, read_stage_json


def test_example_run_is_where_the_layout_says(tmp_path):
    from ei_nb.report import example_run, load_run
    run = example_run(tmp_path/'run', rounds=2)
    L = RunLayout(run)
    for r in (0, 1, 2): assert L.round(r).eval_verdicts.exists() and L.round(r).eval_json.exists()
    for r in (1, 2):
        for p in (L.round(r).selected, L.round(r).verdicts, L.round(r).samples, L.round(r).decision, L.manifest(r)): assert p.exists(), p
    got = load_run(run)
    assert [x['round'] for x in got['rounds']] == [1, 2]
    assert got['baseline_verdicts'] == L.round(0).eval_verdicts


def test_every_stage_has_declared_outputs():
    assert set(ROUND_STAGES) <= set(OUTPUTS)
    L = RunLayout('/r')
    assert L.final.dir == Path('/r') and L.round(FINAL).marker('06_report') == Path('/r/stages/06_report.done')


def test_stage_json_roundtrip(tmp_path):
    (tmp_path/'in.jsonl').write_text('{"a": 1}\n')
    rec = write_stage_json(tmp_path/'s.json', '00_select', {'pool': tmp_path/'in.jsonl'}, {}, {'seed': 3}, {'selected': 0}, 0.5,
                           status='data_stop', reason='no problem in the pass-rate band')
    assert read_stage_json(tmp_path/'s.json') == rec == json.loads((tmp_path/'s.json').read_text())
    assert rec['status'] == 'data_stop' and rec['inputs']['pool']['bytes'] == 9

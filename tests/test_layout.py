"""The run layout is the one place that names a run's files: the readers and writers agree with it."""
import json
from pathlib import Path
from ei_nb.layout import RunLayout, RoundLayout, EvalLayout, FINAL, OUTPUTS, ROUND_STAGES, write_stage_json, read_stage_json, stage_numbers


def test_example_run_is_where_the_layout_says(tmp_path):
    from ei_nb.report import example_run, load_run
    run = example_run(tmp_path/'run', rounds=2)
    L = RunLayout(run)
    for r in (0, 1, 2): assert L.round(r).eval_verdicts.exists() and L.round(r).stage_json('04_eval').exists()
    for r in (1, 2):
        for p in (L.round(r).selected, L.round(r).verdicts, L.round(r).samples, L.round(r).stage_json('05_stop_rule'), L.manifest(r)): assert p.exists(), p
    got = load_run(run)
    assert [x['round'] for x in got['rounds']] == [1, 2]
    assert got['baseline_verdicts'] == L.round(0).eval_verdicts


def test_every_stage_has_declared_outputs():
    assert set(ROUND_STAGES) <= set(OUTPUTS)
    L = RunLayout('/r')
    assert L.final.dir == Path('/r') and L.round(FINAL).marker('06_report') == Path('/r/stages/06_report.done')


def _round_files(R) -> dict:
    "Every file or folder a `RoundLayout` property names, by property."
    # logs/ holds the managed servers' logs, appended to by every try of a stage: diagnostics that --redo keeps
    names = [n for n, v in vars(RoundLayout).items() if isinstance(v, property) and n not in ('dir', 'eval', 'stages', 'partial', 'manifest', 'logs')]
    return {n: getattr(R, n) for n in names}


def test_every_file_the_layout_names_is_moved_by_redo():
    "OUTPUTS is the one list `--redo` moves: each round file the layout names lies under some stage's outputs."
    R = RunLayout('/r').round(1)
    declared = {R.dir/n for names in OUTPUTS.values() for n in names}
    for name, path in _round_files(R).items():
        assert any(path == d or d in path.parents for d in declared), f'RoundLayout.{name} = {path} is in no stage of OUTPUTS'


def test_a_stage_run_alone_names_the_same_files(tmp_path):
    alone, inrun = RoundLayout.in_folder(tmp_path/'out'), RunLayout(tmp_path).round(3)
    for name, path in _round_files(alone).items():
        assert path.relative_to(alone.dir) == _round_files(inrun)[name].relative_to(inrun.dir), name
    assert alone.eval == EvalLayout(tmp_path/'out'/'eval') and alone.eval.stage_json == tmp_path/'out'/'eval'/'stage.json'


def test_stage_json_roundtrip(tmp_path):
    (tmp_path/'in.jsonl').write_text('{"a": 1}\n')
    rec = write_stage_json(tmp_path/'s.json', '00_select', {'pool': tmp_path/'in.jsonl'}, {}, {'seed': 3}, {'selected': 0}, 0.5,
                           status='data_stop', reason='no problem in the pass-rate band')
    assert read_stage_json(tmp_path/'s.json') == rec == json.loads((tmp_path/'s.json').read_text())
    assert rec['status'] == 'data_stop' and rec['inputs']['pool']['bytes'] == 9
    assert rec['detail'] == {} and stage_numbers(tmp_path/'s.json') == {'selected': 0}


def test_a_finished_reports_figures_are_never_overwritten(tmp_path):
    "Each report writes into its own figures folder, so the hashes in a finished report's stage.json stay true."
    L = RunLayout(tmp_path)
    folders = [L.round(1).figures, L.round(2).figures, L.final.figures]
    assert len(set(folders)) == 3 and L.figures == L.final.figures
    assert all(f in [p for p in L.round(r).outputs('06_report')] for r, f in ((1, folders[0]), (2, folders[1]), (FINAL, folders[2])))


def test_stage_json_hashes_every_byte_of_a_folder(tmp_path):
    "A merged model that differs from the base in one byte of a shard has another sha256 in stage.json (issue 28, part 4)."
    for name, last in (('base', 0), ('merged', 1)):
        (tmp_path/name).mkdir(); (tmp_path/name/'model.safetensors').write_bytes(bytes(1000) + bytes([last]))
        (tmp_path/name/'config.json').write_text('{}')
    rec = write_stage_json('', '02_sft', {'model': tmp_path/'base'}, {'merged': tmp_path/'merged'}, {}, {}, 0)
    assert rec['inputs']['model']['bytes'] == rec['outputs']['merged']['bytes'] and rec['inputs']['model']['files'] == 2
    assert rec['inputs']['model']['sha256'] != rec['outputs']['merged']['sha256']

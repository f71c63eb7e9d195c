#!/usr/bin/env python3
"""Generate ei_nb/data/lean_syntax_allowlist.json: the syntax tokens (keywords, tactic names, notation; never
identifiers, numerals or literals) that published honest proofs and the benchmark statements use.

Each file is read as the pre-check reads it (`ei_nb.policy.LeanCode`: Lean's tokens with the token table of the
header's environment, `ei_nb/data/lean_tokens.json`); a token of kind `keyword` (an identifier that is a token:
`nlinarith`, `theorem`) or `symbol` (`<;>`, `∑`, `⌊`) goes on the list. Sources, all bundled in ei_nb/data/ (see
PROVENANCE.md), each a public publisher's released, checked proofs:

  deepseek_prover_v2_minif2f_solutions.jsonl   DeepSeek-Prover-V2's miniF2F solutions (`full_code`, 438 files)
  lean_workbook_goedel_proofs_kimina_verdicts  Goedel-LM's Lean-workbook proofs as kimina-lean-server checks them
                                               (`code`, 102 files: 98 valid, 4 timeouts of known-good proofs)
  minif2f_valid_few_shot_dsp15.jsonl           DeepSeek-Prover-V1.5's 67 few-shot miniF2F-valid proofs
and, so that every statement's own notation is known, the statements of minif2f_dsp15.jsonl and
minif2f_test_goedel_v2.jsonl. Tokens that a named pre-check rule rejects (`sorry`, `native_decide`, `exact?`, ...) are
left out of the list (the rule that names them stops them first).

`--extra NAME=DIR` adds a proof set that is not bundled (every `.lean` file under DIR but `lakefile.lean`), recorded
in the JSON by NAME and the source given with `--extra-source NAME=TEXT`. The shipped list adds Kimina-Prover's
released miniF2F-test proofs (MoonshotAI/Kimina-Prover-Preview @ 7abd61a, `minif2f_test_solved.zip`, 197 files, and
`minif2f_test_solved_filtered_0710.zip`, 28 files; unzipped from a snapshot fetched with the search tool, not
committed):

  python tools/gen_syntax_allowlist.py --extra kimina_preview_minif2f_test=/tmp/kimina \
      --extra-source 'kimina_preview_minif2f_test=MoonshotAI/Kimina-Prover-Preview@7abd61a minif2f_test_solved*.zip'

It also measures the false rejects of such a list on proofs it did not see: for each proof set, the list built from
the other sets (and the statements) is applied to it, and the proofs with a token outside it are counted, with the
tokens (`held_out` in the JSON). Deterministic: run it again and the file is byte-identical.

Usage: python tools/gen_syntax_allowlist.py [--out ei_nb/data/lean_syntax_allowlist.json]
"""
import argparse, collections, hashlib, json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ei_nb.lean_tokens import HEADER_OPENS                    # noqa: E402
from ei_nb.policy import LeanCode, rule_words                 # noqa: E402

DATA = ROOT / 'ei_nb' / 'data'
# tokens on the list without a published proof, each reviewed: the package's own texts that the pre-check reads
REVIEWED = {'skip': 'the conjecture stage (ei_nb.conjecture) pre-checks a statement with the placeholder proof `skip`, '
                    'a tactic that does nothing'}
SYNTAX = frozenset({'keyword', 'symbol'})


def _rows(name): return [json.loads(line) for line in open(DATA / name, encoding='utf-8')]


def proof_sets() -> dict:
    "{set name: [(id, full Lean text)]}: the published proofs, one full file each."
    few = _rows('minif2f_valid_few_shot_dsp15.jsonl')
    head = {r['name']: r['header'] for r in _rows('minif2f_dsp15.jsonl')}
    return {
        'deepseek_prover_v2_minif2f': [(r['name'], r['full_code'])
                                       for r in _rows('deepseek_prover_v2_minif2f_solutions.jsonl')],
        'goedel_lean_workbook': [(r['id'], r['code'])
                                 for r in _rows('lean_workbook_goedel_proofs_kimina_verdicts.jsonl')],
        'dsp15_few_shot_valid': [(r['name'], head[r['name']] + r['formal_statement'] + r['formal_proof']) for r in few]}


def extra_set(folder:str) -> list:
    "(file name, text) of every `.lean` file under `folder` but a lakefile, in name order."
    fs = sorted(p for p in Path(folder).rglob('*.lean') if p.name != 'lakefile.lean')
    return [(str(p.relative_to(folder)), p.read_text(encoding='utf-8')) for p in fs]


def statements() -> list:
    "(id, text) of every benchmark statement (header and statement)."
    out = [(r['name'], r['header'] + r['formal_statement']) for r in _rows('minif2f_dsp15.jsonl')]
    return out + [(r['name'], r['formal_statement']) for r in _rows('minif2f_test_goedel_v2.jsonl')]


def syntax_tokens(text:str) -> set:
    "The keyword and symbol tokens of `text` (comments, literals and identifiers left out)."
    src = LeanCode(text, HEADER_OPENS)
    return {w for (kind, _, _), w in zip(src.toks, src.words) if kind in SYNTAX}


def allow_list(files, denied) -> collections.Counter:
    "{token: number of files using it} over `files`, without the `denied` tokens."
    count = collections.Counter()
    for _, text in files: count.update(syntax_tokens(text) - denied)
    return count


def held_out(sets:dict, stmts:list, denied:set) -> dict:
    "Per proof set: its proofs rejected by the list built from the other sets and the statements, and why."
    out = {}
    for name, files in sets.items():
        others = [f for n, fs in sets.items() if n != name for f in fs] + stmts
        allowed = set(allow_list(others, denied))
        bad = {pid: sorted(syntax_tokens(text) - allowed - denied) for pid, text in files}
        bad = {k: v for k, v in bad.items() if v}
        out[name] = dict(proofs=len(files), rejected=len(bad), tokens=dict(collections.Counter(t for v in bad.values()
                                                                                               for t in v)),
                         examples=dict(sorted(bad.items())[:10]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', default=str(DATA / 'lean_syntax_allowlist.json'))
    ap.add_argument('--extra', action='append', default=[], help='NAME=DIR: a proof set of .lean files')
    ap.add_argument('--extra-source', action='append', default=[], help='NAME=TEXT: where that set comes from')
    args = ap.parse_args(argv)
    sets, stmts, denied = proof_sets(), statements(), set(rule_words())
    for spec in args.extra:
        name, folder = spec.split('=', 1)
        sets[name] = extra_set(folder)
    extra = dict(spec.split('=', 1) for spec in args.extra_source)
    every = [f for fs in sets.values() for f in fs] + stmts
    count = allow_list(every, denied)
    count.update({t: 0 for t in REVIEWED if t not in count})
    seen_denied = sorted({t for _, text in every for t in syntax_tokens(text)} & denied)
    names = ['deepseek_prover_v2_minif2f_solutions.jsonl', 'lean_workbook_goedel_proofs_kimina_verdicts.jsonl',
             'minif2f_valid_few_shot_dsp15.jsonl', 'minif2f_dsp15.jsonl', 'minif2f_test_goedel_v2.jsonl']
    data = dict(
        about='Syntax tokens (keywords, tactic names, notation) that published honest proofs and the benchmark '
              'statements use; the pre-check rejects any other (rule `token`). '
              'Generated by tools/gen_syntax_allowlist.py',
        sources=[dict(file=f'ei_nb/data/{n}', sha256=hashlib.sha256((DATA / n).read_bytes()).hexdigest())
                 for n in names]
        + [dict(set=n, source=extra.get(n, '?'), files=len(sets[n])) for n in sets if n in dict(
            e.split('=', 1) for e in args.extra)],
        files=dict({n: len(fs) for n, fs in sets.items()}, statements=len(stmts)),
        left_out_as_rule_words=seen_denied,
        reviewed_additions=REVIEWED,
        held_out=held_out(sets, stmts, denied),
        tokens=sorted(count), uses=dict(sorted(count.items())))
    Path(args.out).write_text(json.dumps(data, ensure_ascii=False, indent=0) + '\n', encoding='utf-8')
    print(json.dumps(dict(tokens=len(count), files=data['files'],
                          held_out={k: (v['rejected'], v['proofs']) for k, v in data['held_out'].items()})))


if __name__ == '__main__':
    main()

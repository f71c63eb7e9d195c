"""ei_nb.jsonl_scan: the C scanner's readers give exactly what the exact reader gives.

Real record lines (the recorded demo run's verdicts, the bundled problem files, real Lean messages from the bundled
Kimina verdicts) are mutated at random with a fixed seed: duplicate keys at the top and nested, keys spelled with
escapes, NaN / Infinity / 1e400, booleans and floats where an integer belongs, bad UTF-8, cut lines, blank lines,
a BOM, CRLF, duplicate (name, sample_idx) pairs, deep nesting, grammar faults. For every file, `read_frame` (the
scanner first) and the exact reader (`read_records`) must give the same frame or the same error message.
"""
import json, os, random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ei_nb.core import BadInput, read_problems, read_records, shared_data
from ei_nb.frames import frame_of, read_frame
from ei_nb.jsonl_scan import scan_counts, scan_file, scan_frame, scan_problems, scanner

pytestmark = pytest.mark.skipif(scanner() is None, reason='no C compiler: the scanner is not built, readers use pyarrow')

ROOT = Path(__file__).resolve().parents[1]
COLS = ['name', 'sample_idx', 'verdict']
BOM = b'\xef\xbb\xbf'


def _lines(path) -> list[bytes]:
    return [l if l.endswith(b'\n') else l + b'\n' for l in Path(path).read_bytes().splitlines(keepends=True) if l.strip()]


def verdict_lines() -> list[bytes]:
    "Real verdict lines: the demo run's (samples and evaluation), and the bundled Kimina verdicts as verdict records (real Lean messages)."
    lines = [l for p in sorted((ROOT / 'runs' / 'demo-example').glob('round_*/**/*verdicts.jsonl')) for l in _lines(p)]
    for i, l in enumerate(_lines(shared_data('lean_workbook_goedel_proofs_kimina_verdicts.jsonl'))):
        r = json.loads(l)
        rec = {'name': r['id'], 'sample_idx': i, 'verdict': 'pass' if r['verdict'] == 'valid' else 'error', 'reason': None,
               'proof': r['code'], 'verify_s': r['time_s'], 'messages': r['messages']}
        lines.append(json.dumps(rec, ensure_ascii=i % 2 == 0).encode() + b'\n')   # both spellings of non-ASCII
    return lines


def problem_lines() -> list[bytes]:
    "Real problem lines: the bundled miniF2F problems, and Goedel-Prover's miniF2F test statements as problem records."
    lines = _lines(shared_data('minif2f_dsp15.jsonl'))
    for i, l in enumerate(_lines(shared_data('minif2f_test_goedel_v2.jsonl'))):
        r = json.loads(l)
        rec = {'name': 'goedel_' + r['problem_id'], 'split': 'test', 'formal_statement': r['formal_statement'].removesuffix(' sorry'), 'header': ''}
        lines.append(json.dumps(rec, ensure_ascii=i % 2 == 0).encode() + b'\n')
    return lines


def key_of(line: bytes, kind: str):
    r = json.loads(line)
    return (r['name'],) if kind == 'problem' else (r['name'], r['sample_idx'])


def valid_base(rng, lines, kind, n):
    "`n` real lines with different keys."
    out, seen = [], set()
    for l in rng.sample(lines, min(len(lines), 3 * n)):
        if key_of(l, kind) not in seen: seen.add(key_of(l, kind)); out.append(l)
        if len(out) == n: break
    return out


# ---------------------------------------------------------------- mutations of one line (bytes -> bytes)

def insert_top(line: bytes, text: bytes) -> bytes:
    "Insert `text` (a member and a comma) right after the line's opening brace."
    i = line.index(b'{') + 1
    return line[:i] + text + line[i:]


def dump(obj, ascii: bool = False) -> bytes:
    "JSON bytes of `obj`; a lone surrogate (from an earlier mutation) written as its UTF-8 bytes: bad UTF-8, which both readers refuse."
    return json.dumps(obj, ensure_ascii=ascii).encode('utf-8', 'surrogatepass')


def with_field(line: bytes, key: str, raw: bytes) -> bytes:
    "The line with `key` set to the raw JSON text `raw` (replaced where it is, else added at the end)."
    r = json.loads(line)
    r[key] = '\x00MARK'
    return dump(r).replace(b'"\\u0000MARK"', raw) + b'\n'


def without(line: bytes, key: str) -> bytes:
    r = json.loads(line); r.pop(key, None)
    return dump(r) + b'\n'


NUMBERS = [b'NaN', b'Infinity', b'-Infinity', b'1e400', b'-1e400', b'1e-400', b'1E5', b'-0.0', b'0', b'12', b'1' + b'0' * 30,
           b'true', b'false', b'"7"', b'null', b'[]', b'{}', b'1.', b'.5', b'01', b'-', b'1e', b'0x10', b'+1', b'1' + b'0' * 5000]
INTS = [b'true', b'false', b'1.0', b'"7"', b'null', b'-1', b'-0', b'0', b'7', b'1e2', b'100000000000000000000', b'9223372036854775807',
        b'9223372036854775808', b'-9223372036854775809', b'NaN', b'[0]']
BAD_UTF8 = [b'\xff', b'\xc3', b'\xc0\xaf', b'\xed\xa0\x80', b'\xf4\x90\x80\x80', b'\xe2\x82', b'\x80', b'\xf8\x88\x80\x80\x80']
GOOD_UTF8 = ['é'.encode(), '∑'.encode(), '😀'.encode(), '\u2028'.encode(), b'\x7f']
ODD_BYTES = b'{}[]",:\\ \x00\x01\x1f\x7fa0e-+.tnu'


def mutate_line(rng, line: bytes, kind: str) -> bytes:
    try: r = json.loads(line); keys = list(r); assert keys and b'"name": "' in line
    except (ValueError, TypeError, AssertionError, RecursionError):   # mutated already: only raw changes
        i = rng.randrange(len(line))
        return line[:i] + bytes([rng.choice(ODD_BYTES)]) + line[i:]
    m = rng.randrange(24)
    if m == 0:   # a top-level key twice
        k = rng.choice(keys)
        return insert_top(line, json.dumps({k: r[k] if rng.random() < 0.5 else 'other'})[1:-1].encode() + b', ')
    if m == 1:   # a duplicate key nested in a list of objects, at some depth
        inner = rng.choice([b'{"a": 1, "a": 2}', b'{"pos": {"line": 1, "line": 2}}', b'[{"x": [{"y": 1, "z": 2, "y": 3}]}]',
                            b'{"a": 1, "b": {"a": 1}}', b'{"": 1, "": 2}', b'{"a": 1, "A": 2}'])
        return insert_top(line, b'"extra": [' + inner + b'], ')
    if m == 2 and 'messages' in r and r['messages']:   # a key of a real Lean message repeated
        raw = line.decode('utf-8')
        k = rng.choice(list(r['messages'][0]))
        at = raw.index('"messages": [{') + len('"messages": [{')
        return (raw[:at] + json.dumps(k) + ': 0, ' + raw[at:]).encode()
    if m == 3:   # a key spelled with an escape: the same key as another, or a new one
        return insert_top(line, rng.choice([b'"n\\u0061me": "x", ', b'"extr\\u0061": 1, ', b'"\\u006eame": null, ',
                                            b'"nested": {"k\\u0065y": 1, "key": 2}, ', b'"nested": {"k\\u0065y": 1}, ', b'"a\\"b": 1, ']))
    if m == 4:   # odd numbers in a number field
        return with_field(line, 'verify_s' if kind == 'verdict' else 'extra', rng.choice(NUMBERS))
    if m == 5 and kind != 'problem':   # odd values where an integer belongs
        return with_field(line, rng.choice(['sample_idx', 'sample_idx', 'messages_cap', 'messages_omitted']), rng.choice(INTS))
    if m == 6:   # a bad or a good multi-byte sequence somewhere (inside a string or not)
        seq = rng.choice(BAD_UTF8 + GOOD_UTF8)
        i = rng.randrange(1, len(line) - 1)
        return line[:i] + seq + line[i:]
    if m == 7:   # a bad sequence surely inside a string value
        i = line.index(b'"name": "') + len(b'"name": "')
        return line[:i] + rng.choice(BAD_UTF8 + GOOD_UTF8) + line[i:]
    if m == 8:   # cut
        return line[:rng.randrange(0, len(line) - 1)] + b'\n'
    if m == 9:   # a required field missing
        return without(line, rng.choice(keys))
    if m == 10:  # one odd byte replaced or inserted
        i, b = rng.randrange(len(line) - 1), bytes([rng.choice(ODD_BYTES)])
        return line[:i] + b + line[i + (rng.random() < 0.5):]
    if m == 11:  # a control character inside a string
        i = line.index(b'"name": "') + len(b'"name": "')
        return line[:i] + rng.choice([b'\x01', b'\t', b'\x1f', b'\x00']) + line[i:]
    if m == 12:  # escapes in values: a name spelled with an escape, lone surrogates, bad escapes
        v = rng.choice([b'"n\\u0061me_x"', b'"\\ud800"', b'"\\udc00\\ud800"', b'"\\ud83d\\ude00"', b'"a\\/b"', b'"\\x41"', b'"\\u12"',
                        b'"\\u00e9t\\u00e9"', b'"tab\\there"', b'"\\U0041"'])
        return with_field(line, rng.choice(['name', 'reason' if kind == 'verdict' else 'split', 'other']), v)
    if m == 13:  # whitespace around the tokens: JSON whitespace, and what JSON does not allow
        ws = rng.choice([b' ', b'\t', b'\r', b'  \t ', b'\x0b', b'\x0c', b'\xc2\xa0'])
        return ws + line[:-1].replace(b': ', b' :' + ws).replace(b', ', ws + b',') + ws + b'\n'
    if m == 14:  # deep nesting
        d = rng.choice([50, 255, 256, 300, 1200])
        return insert_top(line, b'"deep": ' + b'[' * d + b']' * d + b', ')
    if m == 15 and kind == 'verdict':   # not a verdict value
        return with_field(line, 'verdict', rng.choice([b'"PASS"', b'"passed"', b'""', b'"pass "', b'"unchecked"', b'"no_code"']))
    if m == 16:  # not an object, or an empty one
        return rng.choice([b'[1]\n', b'"x"\n', b'null\n', b'{}\n', b'1\n', b'{"name": "a"}\n', b'{"name": "a"} {}\n', b'{"name": "a",}\n'])
    if m == 17:  # an extra field of any shape: valid
        return insert_top(line, b'"extra": {"a": [1, 2.5e-3, {"b": null, "c": [true, false]}], "d": "\\n\\u00e9"}, ')
    if m == 18 and kind == 'verdict':   # optional fields of the wrong type or null
        k = rng.choice(['messages', 'reason', 'proof', 'messages_cap', 'verify_s'])
        return with_field(line, k, rng.choice([b'{}', b'"x"', b'null', b'5', b'[]', b'true', b'-3', b'1.5']))
    if m == 19 and kind == 'problem':   # the end of the statement
        tail = rng.choice([':= by', ':=by', ':= by \n', ':= by\u00a0', ':= by\u001c', ':= by\n\n', ':= by -- x', ':= sorry', ':= by\u2003',
                           ':= by\r\n', ':=\n by', ': = by', ':= b y', ':= by\x0b', 'by', ''])
        st = r['formal_statement']
        cut = st.rfind(':=')
        return with_field(line, 'formal_statement', dump((st[:cut] if cut >= 0 else st) + tail, rng.random() < 0.5))
    if m == 20 and kind == 'problem':
        return with_field(line, rng.choice(['split', 'header', 'informal_prefix', 'source']), rng.choice([b'null', b'1', b'[]', b'"x"']))
    if m == 21:  # compact separators: valid
        return json.dumps(r, separators=(',', ':'), ensure_ascii=rng.random() < 0.5).encode('utf-8', 'surrogatepass') + b'\n'
    if m == 22:  # a top-level key with a NUL or a quote, or an empty key: valid
        return insert_top(line, rng.choice([b'"": 1, ', b'"\\u0000": 1, ', b'"a\\\\": 2, ']))
    return line


def mutate_file(rng, base: list[bytes], kind: str) -> bytes:
    lines = list(base)
    for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
        i = rng.randrange(len(lines))
        lines[i] = mutate_line(rng, lines[i], kind)
    f = rng.randrange(10)
    if f == 0: lines.insert(rng.randrange(len(lines) + 1), rng.choice([b'\n', b'   \n', b'\t\r\n', b'\x0b\x0c\n', b'\r\n', b'\xc2\x85\n']))
    if f == 1: lines[0] = BOM + lines[0]
    if f == 2: lines.insert(1, BOM + lines.pop(1)) if len(lines) > 1 else None
    if f == 3: lines = [l[:-1] + b'\r\n' for l in lines]
    if f == 4: lines[-1] = lines[-1].rstrip(b'\n') + rng.choice([b'', b'  ', b'\r'])
    if f == 5: lines.append(rng.choice(lines))   # a key twice (or a line twice)
    if f == 6 and kind != 'problem':   # a (name, sample_idx) pair twice, with different verdicts
        r = json.loads(base[0]); r['verdict'] = 'fail' if r['verdict'] == 'pass' else 'pass'
        lines.append(json.dumps(r).encode() + b'\n')
    if f == 7: lines = [BOM] if rng.random() < 0.5 else [b'\n', b'  \n']   # nothing in it
    return b''.join(lines)


# ---------------------------------------------------------------- the comparison

def outcome(fn):
    """What `fn()` gives: ('ok', value), ('error', message) for BadInput, or the type and text of any other exception
    (a name with a lone surrogate, valid JSON, makes pandas raise UnicodeEncodeError in both readers: the same failure)."""
    try: return 'ok', fn()
    except BadInput as e: return 'error', str(e)
    except Exception as e: return type(e).__name__, str(e)


def assert_same(fast, exact, data):
    if fast[0] == exact[0] == 'ok':
        if isinstance(fast[1], pd.DataFrame): pd.testing.assert_frame_equal(fast[1], exact[1])
        else: assert fast[1] == exact[1]
    else: assert fast == exact, data[:3000]


@pytest.mark.parametrize('seed', range(4))
def test_verdict_frames_match_the_exact_reader(tmp_path, seed):
    "400 mutated verdict files (of real lines): `read_frame` and the exact reader agree on every one; both paths are taken."
    rng, lines, path = random.Random(seed), verdict_lines(), tmp_path / 'v.jsonl'
    taken = {'scanner': 0, 'exact': 0}
    for case in range(100):
        data = mutate_file(rng, valid_base(rng, lines, 'verdict', rng.randrange(1, 12)), 'verdict')
        path.write_bytes(data)
        exact = outcome(lambda: frame_of(read_records(path, 'verdict'), 'verdict', COLS))
        fast = outcome(lambda: read_frame(path, 'verdict', columns=COLS))
        assert_same(fast, exact, data)
        taken['scanner' if scan_frame(path) is not None else 'exact'] += 1
        assert scan_frame(path) is None or exact[0] == 'ok'        # the scanner never accepts what the exact reader rejects
    assert taken['scanner'] >= 15 and taken['exact'] >= 15, taken


def exact_counts(path):
    "Samples and passes per problem by the exact reader and pandas (the reference for the C counts)."
    from ei_nb.eval import problem_counts
    f = problem_counts(frame_of(read_records(path, 'verdict'), 'verdict', COLS))
    return f['name'].astype(str).tolist(), f['n'].tolist(), f['c'].tolist()


def c_counts(path, parts=None):
    from ei_nb.eval import tally_table
    table = scan_counts(path, parts=parts)
    if table is None: return None
    t = tally_table(*table)
    return t.name.tolist(), t.n.tolist(), t.c.tolist()


@pytest.mark.parametrize('seed', range(2))
def test_verdict_counts_match_the_exact_reader(tmp_path, seed):
    """200 mutated verdict files, each also shuffled, reversed and cut into 1 to 4 parts: the C counts equal the exact
    reader's, or are None (then `verdict_counts` gives the exact reader's error); counted in C and from columns both."""
    from ei_nb.eval import verdict_counts
    rng, lines, path = random.Random(50 + seed), verdict_lines(), tmp_path / 'v.jsonl'
    taken = {'counted': 0, 'none': 0}
    for case in range(100):
        base = valid_base(rng, lines, 'verdict', rng.randrange(1, 14))
        for order in ('as is', 'shuffled', 'reversed'):
            rows = base[:] if order == 'as is' else base[::-1] if order == 'reversed' else rng.sample(base, len(base))
            data = mutate_file(rng, rows, 'verdict') if case % 2 else b''.join(rows)
            path.write_bytes(data)
            exact = outcome(lambda: exact_counts(path))
            for parts in (1, 2, 4):
                fast = c_counts(path, parts)
                taken['counted' if fast is not None else 'none'] += 1
                if fast is not None: assert exact == ('ok', fast), (order, parts, data[:2000])
            got = outcome(lambda: (lambda c: (c.name.tolist(), c.n.tolist(), c.c.tolist()))(verdict_counts(path)))
            assert got == exact, (order, data[:2000])
    assert taken['counted'] >= 300 and taken['none'] >= 100, taken


def test_counting_order_and_parts(tmp_path):
    "Rows in the sampler's order are counted in C; a sample twice anywhere, even where two parts meet, is never counted."
    rows = [{'name': f'p{i % 7}', 'sample_idx': i // 7, 'verdict': ['pass', 'fail', 'error', 'no_code', 'unchecked'][i % 5]} for i in range(140)]
    path = tmp_path / 'v.jsonl'
    def write(rs): path.write_text(''.join(json.dumps(r) + '\n' for r in rs))
    write(rows)
    for parts in (1, 2, 3, 8): assert c_counts(path, parts) == exact_counts(path)
    for at in (1, 69, 70, 71, 139):                  # the copy of row 0 or of a row near a part's edge, put at `at`
        for src in (0, at - 1):
            write(rows[:at] + [rows[src]] + rows[at:])
            assert outcome(lambda: exact_counts(path))[0] == 'error'
            for parts in (1, 2, 3): assert c_counts(path, parts) is None, (at, src, parts)
    write(rows[70:] + rows[:70])                    # each problem's indices go down once: counted from the columns
    for parts in (1, 2): assert c_counts(path, parts) == exact_counts(path)


@pytest.mark.parametrize('seed', range(2))
def test_problem_records_match_the_exact_reader(tmp_path, seed):
    "200 mutated problem files: `scan_problems` gives the exact reader's records, or None where the exact reader must decide."
    rng, lines, path = random.Random(100 + seed), problem_lines(), tmp_path / 'p.jsonl'
    taken = {'scanner': 0, 'exact': 0}
    for case in range(100):
        data = mutate_file(rng, valid_base(rng, lines, 'problem', rng.randrange(1, 10)), 'problem')
        path.write_bytes(data)
        exact = outcome(lambda: read_problems(path))
        lazy = scan_problems(path)
        if lazy is None: taken['exact'] += 1; continue
        taken['scanner'] += 1
        assert exact[0] == 'ok', (exact, data[:2000])
        assert [r['formal_statement'] for r in lazy] == [r['formal_statement'] for r in exact[1]]   # decoded alone
        assert [dict(r) for r in lazy] == exact[1]
        assert_same(outcome(lambda: read_frame(path, 'problem', columns=['name'])), outcome(lambda: frame_of(exact[1], 'problem', ['name'])), data)
    assert taken['scanner'] >= 15 and taken['exact'] >= 15, taken


def test_each_fault_is_caught(tmp_path):
    "One file per fault the scanner must see, each at line 3 of real lines: the exact reader's message, never a frame."
    base, path = valid_base(random.Random(1), verdict_lines(), 'verdict', 4), tmp_path / 'v.jsonl'
    faults = {'duplicate key': insert_top(base[2], b'"verdict": "pass", '),
              'nested duplicate': insert_top(without(base[2], 'messages'), b'"messages": [{"pos": {"line": 1, "column": 2, "line": 3}}], '),
              'nested duplicate elsewhere': insert_top(base[2], b'"lean": {"env": [0, {"a": {}, "b": 1, "a": []}]}, '),
              'escaped duplicate': insert_top(base[2], b'"n\\u0061me": "x", '),
              'NaN': with_field(base[2], 'verify_s', b'NaN'), 'infinite': with_field(base[2], 'verify_s', b'1e400'),
              'bool for int': with_field(base[2], 'sample_idx', b'true'), 'float for int': with_field(base[2], 'sample_idx', b'1.0'),
              'negative index': with_field(base[2], 'sample_idx', b'-1'), 'bad UTF-8': base[2][:-3] + b'\xff' + base[2][-3:],
              'cut line': base[2][:len(base[2]) // 2] + b'\n', 'missing field': without(base[2], 'verdict'),
              'not a verdict': with_field(base[2], 'verdict', b'"ok"'), 'messages not a list': with_field(base[2], 'messages', b'{}'),
              'duplicate pair': base[0]}
    for what, line in faults.items():
        data = b''.join(base[:2] + [line] + base[3:])
        path.write_bytes(data)
        exact = outcome(lambda: read_records(path, 'verdict'))
        assert exact[0] == 'error' and ':3: ' in exact[1], (what, exact)
        assert scan_frame(path) is None, what
        assert outcome(lambda: read_frame(path, 'verdict', columns=COLS)) == exact, what


def test_blocks_and_parts_give_one_scan(tmp_path):
    "A file read in blocks shorter than its lines, or cut into parts scanned in threads, gives the scan one pass gives."
    rng = random.Random(7)
    lines = valid_base(rng, verdict_lines(), 'verdict', 150)
    path = tmp_path / 'v.jsonl'
    path.write_bytes(BOM + b''.join(lines[i] + (b'\n' if i % 7 == 0 else b'') for i in range(len(lines))))
    one = scan_file(path, 'verdict', COLS, starts=True, parts=1)
    for kw in ({'block': 64}, {'parts': 2}, {'parts': 5}, {'parts': 5, 'block': 100}):
        s = scan_file(path, 'verdict', COLS, starts=True, **kw)
        assert s.n == one.n == len(lines)
        for c in COLS: assert s.column(c).tolist() == one.column(c).tolist(), (kw, c)
        for c in ('name', 'verdict'): assert s.uniques(c) == one.uniques(c), kw
        assert s.starts.tolist() == one.starts.tolist(), kw
    data = path.read_bytes()
    assert all(data[a:a + 1] == b'{' for a in one.starts)
    pd.testing.assert_frame_equal(scan_frame(path), frame_of(read_records(path, 'verdict'), 'verdict', COLS))


def test_sorted_categories_and_unsorted_names(tmp_path):
    "Names written out of order and non-ASCII: categories sorted by code point, as the exact reader's frame has them."
    rows = [{'name': n, 'sample_idx': i, 'verdict': v} for n in ['zeta', 'Älpha', 'alpha', 'β', 'a_b', 'a'] for i, v in enumerate(['pass', 'fail'])]
    rng = random.Random(3); rng.shuffle(rows)
    path = tmp_path / 'v.jsonl'
    path.write_text(''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in rows), encoding='utf-8')
    fast = scan_frame(path)
    pd.testing.assert_frame_equal(fast, frame_of(read_records(path, 'verdict'), 'verdict', COLS))
    assert list(fast['name'].cat.categories) == sorted({r['name'] for r in rows})


def test_run_select_reads_the_pool_the_same(tmp_path, monkeypatch):
    "`run_select` with the scanner (lazily decoded pool) and without it writes the same selection and summary."
    from ei_nb.select import run_select
    pool = list({p['name']: p for p in map(json.loads, problem_lines())}.values())
    protected = pool[:20]
    pool += [dict(p, name='copy_' + p['name']) for p in protected[:10]]        # the same statements under other names
    rng = np.random.default_rng(0)
    rows = [{'name': p['name'], 'sample_idx': k, 'verdict': 'pass' if rng.random() < 0.4 else 'fail'} for p in pool[:-10:2] + pool[-10:] for k in range(4)]
    (tmp_path / 'pool.jsonl').write_text(''.join(json.dumps(p, ensure_ascii=False) + '\n' for p in pool), encoding='utf-8')
    (tmp_path / 'v.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    (tmp_path / 'protected.jsonl').write_text(''.join(json.dumps(p) + '\n' for p in protected))
    protected = tmp_path / 'protected.jsonl'
    out = {}
    for scan in ('1', '0'):
        monkeypatch.setenv('EI_JSONL_SCAN', scan)
        summary, table = run_select(tmp_path / 'pool.jsonl', tmp_path / 'v.jsonl', tmp_path / f'sel{scan}.jsonl', [protected],
                                    dict(include_zero=True, max_zero=5, max_problems=40))
        out[scan] = (summary, table, (tmp_path / f'sel{scan}.jsonl').read_bytes())
    assert out['1'][0] == out['0'][0] and out['1'][2] == out['0'][2]
    assert out['1'][0]['protected_removed'] > 0 and out['1'][0]['selected'] == 40
    pd.testing.assert_frame_equal(out['1'][1], out['0'][1])


# ---- statement keys in C (`plain_key`): wherever the kernel answers, it answers what `statement_key` answers

BLANKS = [' ', '  ', '\n', '\t', '\r\n', '\n\n  ', '\u00a0', '\u2003', '\u200a', '\u202f', '\u205f', '\u3000', '\u1680',
          '\u2028', '\u2029', '\x85', '\x0b', '\x0c', '\x1c', '\x1f']
TOKENS = ['--', '/-', '-/', "'", '!', '«', '»', 'throwError', 'dbg_trace', '"', '\\', '/', '-', ']', '@[', 'é', '∑',
          ':= by', ':=by', 'by', ' := by', 'sorry']
PREFIXES = ['', '@[simp] ', '@[simp]', '@[simp, norm_num]\n', 'private ', 'protected ', '@[simp] private ', '@[x ', 'noncomputable ']


def statement_texts() -> list[str]:
    "The theorem statements of the bundled sets, and whole published proof files (comments, strings, tactics)."
    texts = [json.loads(l)['formal_statement'] for f in ('minif2f_dsp15.jsonl', 'minif2f_test_goedel_v2.jsonl', 'minif2f_valid_few_shot_dsp15.jsonl')
             for l in _lines(shared_data(f))]
    texts += [json.loads(l)['full_code'] for l in _lines(shared_data('deepseek_prover_v2_minif2f_solutions.jsonl'))]
    texts += [json.loads(l)['code'] for l in _lines(shared_data('lean_workbook_goedel_proofs_kimina_verdicts.jsonl'))]
    return texts


def variant(rng, text: str) -> str:
    "A seeded variant: blanks of every kind, a prefix, `lemma` for `theorem`, another tail, a token somewhere."
    parts = text.split(' ')
    for _ in range(rng.randrange(4)):
        k = rng.randrange(len(parts)); parts[k] = parts[k] + rng.choice(BLANKS)
    text = ' '.join(parts)
    if rng.random() < 0.4: text = rng.choice(PREFIXES) + text.lstrip()
    if rng.random() < 0.3: text = text.replace('theorem', rng.choice(['lemma', 'theorems', 'theorem\t', 'theorem  ']), 1)
    if rng.random() < 0.3: text = text.rstrip().removesuffix('by').rstrip().removesuffix(':=') + rng.choice(['', ':=by', ' :=  by \n', ':= by sorry', ': = by', 'by'])
    if rng.random() < 0.4:
        k = rng.randrange(len(text) + 1); text = text[:k] + rng.choice(TOKENS) + text[k:]
    return text


def json_spans(texts: list[str], ensure_ascii: bool = False) -> tuple[bytes, list]:
    "One JSON string per line, and where each string's raw content is: (offset, length), or -length-1 when it holds escapes."
    data, spans = b'', []
    for t in texts:
        raw = json.dumps(t, ensure_ascii=ensure_ascii).encode()
        spans.append([len(data) + 1, len(raw) - 2 if b'\\' not in raw else -(len(raw) - 2) - 1])
        data += raw + b'\n'
    return data, spans


def test_plain_keys_are_the_statement_keys(tmp_path):
    "Real statements and 6,000 seeded variants (raw and \\u-escaped JSON): every key the kernel computes is `statement_key`'s."
    from ei_nb.core import statement_key
    from ei_nb.jsonl_scan import plain_keys
    rng = random.Random(11)
    texts = statement_texts()
    n_real = 799   # the formal statements come first: 488 + 244 + 67
    assert all(t.rstrip().endswith(':= by') for t in texts[:n_real])
    texts += [variant(rng, rng.choice(texts)) for _ in range(6000)]
    want = [statement_key(t) for t in texts]
    answered = {}
    for ascii_only in (False, True):
        got = plain_keys(*json_spans(texts, ascii_only))
        wrong = [(t, k, w) for t, k, w in zip(texts, got, want) if k is not None and k != w]
        assert not wrong, wrong[:3]
        answered[ascii_only] = [k is not None for k in got]
    assert sum(answered[False][:n_real]) > n_real // 2, sum(answered[False][:n_real])   # it answers for most real statements
    assert answered[True] == answered[False]   # \\u escapes decoded: the same statements are answered


def test_statement_keys_of_a_scanned_pool(tmp_path):
    "`statement_keys` of `scan_problems` records (spans from the real scan) equals `statement_key` of each, C and Python mixed."
    from ei_nb.core import statement_key
    from ei_nb.jsonl_scan import statement_keys
    rng = random.Random(12)
    texts = [t for t in statement_texts() if t.rstrip().endswith(':= by')]
    texts += [v.rstrip() + '\n' for v in (variant(rng, rng.choice(texts)) for _ in range(3000)) if v.rstrip().endswith(':= by')]
    path = tmp_path / 'pool.jsonl'   # (a blank after the final `by` other than ASCII sends a file to the exact reader: not this test's point)
    path.write_text(''.join(json.dumps({'name': f'p{i}', 'split': 'train', 'formal_statement': t, 'header': ''}, ensure_ascii=i % 3 == 0) + '\n'
                            for i, t in enumerate(texts)), encoding='utf-8')
    pool = scan_problems(path)
    assert pool is not None and len(pool) == len(texts) > 2000
    assert statement_keys(pool) == [statement_key(t) for t in texts]


def test_every_blank_python_splits_at_is_refused_or_collapsed():
    "Each of the characters `str.split` splits at, inside a statement, gives Python's key or no key at all."
    from ei_nb.core import statement_key
    from ei_nb.jsonl_scan import plain_keys
    blanks = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    texts = [f'theorem t (x : ℕ){b}:{b}x = x :={b}by{b}' for b in blanks] + [f'theorem{b}t : x := by' for b in blanks]
    got = plain_keys(*json_spans(texts))
    assert [k for k in got if k is not None] == [statement_key(t) for t, k in zip(texts, got) if k is not None]
    assert {t[17] for t, k in zip(texts[:len(blanks)], got) if k is not None} == {' ', '\n', '\t', '\r'}   # the four it collapses

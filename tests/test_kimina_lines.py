"""Issue 27, part 5: where a checking server counts message lines is learnt, not guessed. kimina-lean-server splits the
submitted file into its leading `import`/blank lines and the rest (server/split.py) and runs the rest; since its commit
e2cdc1f (PR #56, 2025-10-24) it adds the split-off lines back to every position (`_apply_header_offset`), before it the
positions count from the first line after the imports. Two stand-ins, one per convention, answer with the fake REPL's reply
(tests/fake_repl.py, the recorded v4.9.0-rc1 protocol); the `server` back-end learns each one's convention from one probe and
gives the verifier the same lines from both. tests/test_kimina_real.py does the same against the real server (after e2cdc1f)."""
import http.server, json
import pytest
from ei_nb.lean_backends import LINE_PROBE, ServerBackend, _lead_lines
from ei_nb.lean_reply import LeanError
from ei_nb.setup_lean import CHECK_HEADER
from ei_nb.verify import make_verifier
from tests import fake_repl
from tests.http_standin import serving
from tests.test_kimina_real import _problem_and_sample


class Kimina(http.server.BaseHTTPRequestHandler):
    convention, seen = 'file', None
    def log_message(self, *a): pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        type(self).seen.append(body)
        results = []
        for c in body['codes']:
            text = c['proof']
            if self.convention == 'nothing': reply = {'env': 0}
            else:
                lead = _lead_lines(text)
                reply = fake_repl.reply_for('\n'.join(text.split('\n')[lead:]), 1)     # the server runs the text after the imports
                if self.convention == 'file':                                           # e2cdc1f: positions from the top of the file
                    for m in reply.get('messages', []): m['pos']['line'] += lead
            results.append({'custom_id': c['custom_id'], 'response': reply})
        out = json.dumps({'results': results}).encode()
        self.send_response(200); self.send_header('Content-Type', 'application/json'); self.send_header('Content-Length', str(len(out)))
        self.end_headers(); self.wfile.write(out)

def kimina(convention): return serving(Kimina, convention=convention)


@pytest.mark.parametrize('convention', ['file', 'body'])
def test_the_convention_is_learnt_once_and_replies_count_from_the_top_of_the_file(convention):
    sent = 'theorem t : 2 + 2 = 5 := by\n  norm_num -- FAKE:error\n\n#print axioms t\n'
    full = CHECK_HEADER.rstrip('\n') + '\n\n' + sent
    line = full.split('\n').index('  norm_num -- FAKE:error') + 1
    with kimina(convention) as (url, h):
        sb = ServerBackend([url])
        replies = [sb.run(CHECK_HEADER, sent, 5) for _ in range(3)]
    assert sb.conventions == {0: convention}
    assert [c['custom_id'] for b in h.seen for c in b['codes']].count('ei-line-probe') == 1 and LINE_PROBE in h.seen[0]['codes'][0]['proof']
    for reply in replies:
        assert [m['pos']['line'] for m in reply['messages'] if m['severity'] == 'error'] == [line]
    assert sb.line_offsets(CHECK_HEADER, sent) == {line - (sent.split('\n').index('  norm_num -- FAKE:error') + 1)}


@pytest.mark.parametrize('convention', ['file', 'body'])
def test_the_verifier_reads_the_same_lines_from_both(convention):
    prob, good = _problem_and_sample()
    _, bad = _problem_and_sample('\n  norm_num -- FAKE:error')
    with kimina(convention) as (url, h), make_verifier('server', endpoints=[url], workers=1, timeout=5) as v:
        ok, no = v.verify_one(prob, good), v.verify_one(prob, {**bad, 'sample_idx': 1})
    assert ok['verdict'] == 'pass', ok                              # the axioms report was found on its line
    assert no['verdict'] == 'fail' and 'lean error' in no['reason']
    body_line = no['proof'].split('\n').index('  norm_num -- FAKE:error') + 1
    assert [m['line'] for m in no['messages'] if m['severity'] == 'error'] == [body_line]   # the line in the proof, either way


def test_a_server_whose_probe_shows_no_error_is_an_error_not_a_guess():
    with kimina('nothing') as (url, h):
        with pytest.raises(LeanError, match='line probe'): ServerBackend([url]).run(CHECK_HEADER, 'theorem t : True := trivial\n', 5)

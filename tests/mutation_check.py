#!/usr/bin/env python
"""Mutation check of the code that decides the science: is every rule pinned by a test that would fail if it changed?

Each mutant is one small, realistic edit of a notebook (the source of truth) or of the kernel's C source: a `<` that
becomes `<=`, a default of 4 that becomes 5, a seed left out of a hash. For each mutant, ONE AT A TIME, in a
temporary copy of the repository (never the working tree): apply the edit, `nbdev_export` the notebook, then run
the checks that should catch it (the listed pytest targets first, they are quicker, then `nbdev_test` on the
notebook), stopping at the first that fails. The mutant is `killed` when one fails, `SURVIVED` when all pass.

    python tests/mutation_check.py                 # every mutant (slow: tens of minutes on 2 cores)
    python tests/mutation_check.py --list          # the mutants, their checks, and whether each pattern is found
    python tests/mutation_check.py --only stop-budget-off-by-one,keep-default-5
    python tests/mutation_check.py --timeout 900   # seconds per mutant (default 600)

Before the mutants it runs every selected check once on the unmutated copy (skip with --no-baseline): a check that
already fails would "kill" every mutant and prove nothing. Exit status: 0 when every selected mutant was killed;
1 when one survived, timed out, or its pattern is not found exactly once in its file (the notebook moved on:
re-aim the mutant); 2 when a baseline check fails. Not part of CI (too slow); its table goes in the closing note.
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NB = 'nb'   # in a mutant's checks: nbdev_test on the mutated notebook


@dataclass
class Mutant:
    name: str       # short id, for --only
    path: str       # file edited, relative to the repository root (a notebook, or the kernel's C source)
    old: str        # text that must occur exactly once in the file's code cells
    new: str        # its replacement
    checks: tuple   # pytest targets ('tests/x.py::test_y' or 'tests/x.py -k EXPR'), and NB for nbdev_test
    what: str       # the science it breaks


def M(name, path, old, new, what, *checks): return Mutant(name, path, old, new, tuple(checks), what)


STOP, SEL, EVAL, REP, SFT, AVG, POL, REPLY, MRK = ('nbs/05_stop_rule.ipynb', 'nbs/00_select.ipynb', 'nbs/04_eval.ipynb',
    'nbs/06_report.ipynb', 'nbs/02_sft.ipynb', 'nbs/03_average.ipynb', 'nbs/verifier/policy.ipynb', 'nbs/verifier/lean_reply.ipynb',
    'nbs/run/markers.ipynb')
ROWS, TRAIN = 'nbs/records/rows.ipynb', 'nbs/training/train.ipynb'   # forward passes and their mask; the completion-only loss
F = 'tests/test_foundation.py::'
PIN = 'tests/test_science_pins.py::'
STOP_T = (F + 'test_stop_rule_against_reference', F + 'test_stop_cli')
SEL_T = (F + 'test_select_band_and_protected', F + 'test_select_unchecked_never_counts_and_unmeasured',
         F + 'test_select_caps_are_deterministic')
PASSK_T = (F + 'test_stats', PIN + 'test_stats_pass_at_k_between_1_and_n')
MCN_T = (F + 'test_mcnemar_p_against_brute_force', F + 'test_mcnemar_table_against_brute_force', F + 'test_mcnemar_cli',
         F + 'test_power_is_sane', PIN + 'test_mcnemar_power_by_enumeration')
KEEP_T = (PIN + 'test_build_sft_rows_default_keeps_the_four_shortest_distinct_proofs', PIN + 'test_sft_data_cli_default_cap_is_four',
          PIN + 'test_row_of_exactly_max_tokens_is_kept',
          'tests/test_sft.py::test_keep_rules_invariants', 'tests/test_sft.py::test_protected_by_name_and_by_statement')
MASK_T = (PIN + 'test_loss_mask_is_the_completion_of_each_packed_row', PIN + 'test_completion_loss_is_the_cross_entropy_of_completion_tokens')
AVG_T = ('tests/test_average.py -k "test_bit_exact and 0.7 and BF16 or test_weights_zero_and_one or test_kernels_and_io"',)
PRE_T = ('tests/test_verify.py -k "precheck or dsv2 or judge"',)
TOK, VERI, REPL_NB = 'nbs/verifier/lean_tokens.ipynb', 'nbs/verifier/verifier.ipynb', 'nbs/verifier/lean_replay.ipynb'
L28_T = ('tests/test_policy_lean28.py',)
SERVE27_T = ('tests/test_sampling_parity.py',)
GUARD27_T = ('tests/test_verifier_guard.py',)
REP_T = ('tests/test_lean_replay.py -k "forged or crashing or protocol or honest"',)
VER_T = ('tests/test_verify.py -k "root_name or judge"',)
CHAIN_T = (PIN + 'test_chain_hash_changes_with_each_stage_seed',)
CONJ, CONJ_T = 'nbs/00b_conjecture.ipynb', ('tests/test_conjectures.py::test_only_new_faithful_provable_conjectures_enter_the_pool',
                                            'tests/test_conjectures.py::test_a_later_round_never_conjectures_an_earlier_conjecture_again')
PLAIN_T = ('tests/test_jsonl_scan.py -k "plain or blank or statement_keys"',)
LEARN_T = ('tests/test_science_learning.py',)   # the learning demo, end to end (minutes)
LEVER_T = ('tests/test_sharpen.py::test_summed_and_mean_ranking_disagree_on_a_crafted_problem', 'tests/test_sharpen.py::test_advantages_are_the_trainers',
           'tests/test_sharpen.py::test_weights_average_one_per_problem')
CORR_T = ('tests/test_corrections.py::test_which_failures_qualify_as_goedels', 'tests/test_corrections.py::test_a_problem_the_round_solved_is_not_corrected')
SHARP = 'nbs/03c_sharpen.ipynb'
EXIT_T = (PIN + 'test_exit_codes_of_the_cli_contract', F + 'test_console_script_exit_codes', 'tests/test_sft.py::test_sft_data_cli_exit_codes')

MUTANTS = [
    # ---- the stop rule (05_stop_rule)
    M('stop-regress-strict', STOP, 'scores[-1] <= max(scores[:-1]) - regress', 'scores[-1] < max(scores[:-1]) - regress',
      'a drop of exactly `regress` problems no longer stops', *STOP_T, NB),
    M('stop-plateau-one-round', STOP, '_gain(scores, r) < plateau_gain and _gain(scores, r-1) < plateau_gain',
      '_gain(scores, r) < plateau_gain', 'one small gain stops (the rule needs two in a row)', *STOP_T, NB),
    M('stop-plateau-le', STOP, '_gain(scores, r) < plateau_gain and', '_gain(scores, r) <= plateau_gain and',
      'a gain of exactly plateau_gain counts as a plateau', *STOP_T, NB),
    M('stop-budget-off-by-one', STOP, 'if r >= rounds:', 'if r > rounds:', 'one round more than the budget', *STOP_T, NB),
    M('stop-best-latest', STOP, 'return scores.index(max(scores)) + 1', 'return len(scores) - scores[::-1].index(max(scores))',
      'the latest, not the earliest, best round is kept', *STOP_T, NB),
    M('stop-gain-vs-previous', STOP, 'return scores[r-1] - max(scores[:r-1])', 'return scores[r-1] - scores[r-2]',
      'gain measured against the previous round, not the best earlier one', *STOP_T, NB),
    M('data-stop-min-rows', STOP, 'n_sft_rows < min_rows', 'n_sft_rows <= min_rows', 'exactly min_rows SFT rows stops',
      PIN + 'test_data_stop_edges', NB),
    M('data-stop-mixed', STOP, 'if n_mixed == 0: return', 'if n_mixed < 0: return',
      'a round with no problem both passed and failed goes on', PIN + 'test_data_stop_edges', NB),
    # ---- selection (00_select; pass rates from 04_eval's problem_counts)
    M('select-lo-inclusive', SEL, 'band = {n for n, p in rate.items() if lo < p <= hi}',
      'band = {n for n, p in rate.items() if lo <= p <= hi}', 'p = lo (unsolved) problems enter the band', *SEL_T, NB),
    M('select-hi-exclusive', SEL, 'band = {n for n, p in rate.items() if lo < p <= hi}',
      'band = {n for n, p in rate.items() if lo < p < hi}', 'p = hi problems leave the band', *SEL_T, NB),
    M('select-zero-ignores-flag', SEL, 'zeros = _first_clean_zeros(by_name, rate, index, max_zero if include_zero else 0, seed)',
      'zeros = _first_clean_zeros(by_name, rate, index, max_zero, seed)',
      'p = 0 problems taken although include_zero is off', *SEL_T, NB),
    M('select-decontam-name-only', SEL, "return {i for i, n in enumerate(pool_names) if n in names} | leaked",
      "return {i for i, n in enumerate(pool_names) if n in names}", 'a protected statement under another name is trained on', *SEL_T, NB),
    M('select-cap-by-name', SEL, 'chosen = sorted(in_band + zero, key=ranked)', 'chosen = sorted(in_band + zero)',
      'the cap keeps the alphabetically first, not a seeded sample', *SEL_T, NB),
    M('select-rank-ignores-seed', SEL, "f'{seed}:{name}'", "f'0:{name}'", 'the sub-sample no longer depends on the seed',
      *SEL_T, NB),
    M('passrate-error-is-pass', EVAL, "[v == 'pass' for v in verdicts]", "[v != 'fail' for v in verdicts]",
      'an error verdict counts as a pass', *PASSK_T, *SEL_T, NB),
    # ---- pass@k and solved@n (04_eval)
    M('passk-range', EVAL, 'np.arange(n - c + 1, n + 1)', 'np.arange(n - c, n + 1)', 'pass@k product over one term too many',
      *PASSK_T, NB),
    M('passk-closed-le', EVAL, 'if n - c < k: return 1.0', 'if n - c <= k: return 1.0', 'pass@k = 1 when n - c = k', *PASSK_T, NB),
    M('passk-array-open', EVAL, 'open_ = n - c >= k', 'open_ = n - c > k', 'vectorised pass@k = 1 when n - c = k', *PASSK_T, NB),
    M('passk-array-log', EVAL, 'np.log1p(-k / np.arange(k + 1, len(L)))', 'np.log1p(-k / np.arange(k, len(L) - 1))',
      'vectorised pass@k off by one in its log table', *PASSK_T, NB),
    M('solved-needs-two', EVAL, "'solved': int((counts['c'] > 0).sum())", "'solved': int((counts['c'] > 1).sum())",
      'solved@n needs two passes', *PASSK_T, NB),
    # ---- McNemar (06_report)
    M('mcnemar-one-sided', REP, '2 * binom.cdf(min(b, c), b + c, 0.5)', 'binom.cdf(min(b, c), b + c, 0.5)',
      'one-sided p-value reported as two-sided', *MCN_T, NB),
    M('mcnemar-max', REP, 'binom.cdf(min(b, c), b + c, 0.5)', 'binom.cdf(max(b, c), b + c, 0.5)', 'tail on the wrong side',
      *MCN_T, NB),
    M('mcnemar-swap-bc', REP, 'b, c = int((a & ~b_).sum()), int((~a & b_).sum())', 'c, b = int((a & ~b_).sum()), int((~a & b_).sum())',
      'losses counted as wins', *MCN_T, NB),
    M('mcnemar-net-sign', REP, "'net': c - b", "'net': b - c", 'the net gain has the wrong sign', *MCN_T, NB),
    M('mcnemar-no-discordant', REP, 'if b + c == 0: return 1.0', 'if b + c == 0: return 0.0',
      'no discordant pair reads as significant', *MCN_T, NB),
    M('power-alpha-strict', REP, '<= alpha])', '< alpha])', 'power counts rejections at p < alpha only', *MCN_T, NB),
    # ---- keep rules (02_sft), loss masking (rows, training/train)
    M('keep-default-5', SFT, 'max_per_problem:int=4, # distinct proofs kept per problem at most',
      'max_per_problem:int=5, # distinct proofs kept per problem at most', 'build_sft_rows keeps 5 proofs by default', *KEEP_T, NB),
    M('keep-cli-default-5', SFT, "p.add_argument('--max-per-problem', type=positive_int, default=4)",
      "p.add_argument('--max-per-problem', type=positive_int, default=5)", '`ei sft-data` keeps 5 proofs by default', *KEEP_T, NB),
    M('keep-longest-first', SFT, "'shortest': lambda sv: (sv[0]['n_tokens'], sv[0]['sample_idx'])",
      "'shortest': lambda sv: (-sv[0]['n_tokens'], sv[0]['sample_idx'])", 'longest completion first', *KEEP_T, NB),
    M('keep-cap-off-by-one', SFT, 'elif kept >= max_per_problem:', 'elif kept > max_per_problem:', 'one proof over the cap',
      *KEEP_T, NB),
    M('keep-duplicates', SFT, "if key in seen: status = 'duplicate'", "if False: status = 'duplicate'",
      'the same proof kept twice', *KEEP_T, NB),
    M('keep-all-solved', SFT, "solved_all = len(ps) == n[p['name']]", 'solved_all = False', 'problems solved n/n are trained on',
      *KEEP_T, NB),
    M('keep-too-long-inclusive', SFT, "elif lengths[s['sample_idx']] > max_tokens:", "elif lengths[s['sample_idx']] >= max_tokens:",
      'a row of exactly max_tokens is dropped', *KEEP_T, NB),
    M('keep-protected', SFT, "if is_protected(p, index): st['dropped_protected'] += 1; continue",
      "if False: st['dropped_protected'] += 1; continue", 'protected problems are trained on', *KEEP_T, NB),
    M('mask-includes-prompt', ROWS, "mask = [j >= examples[i]['n_prompt'] for", 'mask = [j >= 0 for',
      'the loss includes the prompt', *MASK_T, NB),
    M('mask-off-by-one', ROWS, "mask = [j >= examples[i]['n_prompt'] for", "mask = [j > examples[i]['n_prompt'] for",
      'the first completion token is not learned', *MASK_T, NB),
    M('loss-shift', TRAIN, 'm = target_mask[:, 1:]', 'm = target_mask[:, :-1]', 'the loss predicts the wrong positions', *MASK_T, NB),
    # ---- averaging (03_average, and the kernel's C source)
    M('avg-weights-swapped', AVG, 'nbytes // ITEMSIZE[dtype], 1.0 - self.w, self.w, stats)',
      'nbytes // ITEMSIZE[dtype], self.w, 1.0 - self.w, stats)', 'ft_weight applied to the anchor', *AVG_T, NB),
    M('avg-copy-modes-swapped', AVG, '(1 if self.w == 0 else 2 if self.w == 1 else 0)', '(2 if self.w == 0 else 1 if self.w == 1 else 0)',
      'weight 0 copies the fine-tuned model, 1 the anchor', *AVG_T, NB),
    M('avg-weight-range', AVG, 'if not 0 <= w <= 1:', 'if not 0 <= w <= 2:', 'ft_weight > 1 accepted (extrapolation)',
      'tests/test_average.py::test_refuses_bad_arguments', NB),
    M('round-no-ties-to-even', AVG, 't = np.minimum((t + U((1 << (52 - M - 1)) - 1) + ((t >> s) & U(1))) >> s,',
      't = np.minimum((t + U((1 << (52 - M - 1)) - 1)) >> s,', 'numpy rounding breaks ties downwards',
      'tests/test_average.py -k "test_kernels_and_io and numpy"', NB),
    M('kernel-no-ties-to-even', 'ei_nb/kernels/average.c', 't = (t + ((1ULL << (s - 1)) - 1) + ((t >> s) & 1)) >> s;',
      't = (t + ((1ULL << (s - 1)) - 1)) >> s;', 'the C kernel breaks ties downwards',
      'tests/test_average.py::test_portable_c_kernel_is_exact', 'tests/test_average.py -k "test_bit_exact and 0.7 and F16"'),
    M('kernel-fp-contract', 'nbs/records/ckernel.ipynb', "_BASE = ['-O3', '-ffp-contract=off', ", "_BASE = ['-O3', ",
      'the compiler may fuse multiply-adds (one rounding skipped)', 'tests/test_average.py -k "test_bit_exact and 0.7"'),
    # ---- pre-check rules (verifier/policy) and the verdict of Lean's reply (verifier/lean_reply)
    M('precheck-skips-statement', POL, "if rule == 'statement':", "if rule == 'statement' and False:",
      'a proof of another statement reaches Lean', *PRE_T, NB),
    M('precheck-hash-commands-allowed', POL, "'set_option': 'option', '#print': 'print', '/-!': 'moddoc'}",
      "'set_option': 'option', '#print': 'print', '/-!': 'moddoc', '#check': 'moddoc', '#guard_msgs': 'moddoc'}",
      '#check and #guard_msgs commands pass the pre-check', *L28_T, NB),
    M('statement-prefix-only', POL, "if got[:len(want)] == want and len(got) > len(want) and got[len(want)][0] == ':=': return None",
      "if got[:len(want) // 2] == want[:len(want) // 2]: return None", 'a changed statement tail is accepted', *PRE_T, NB),
    M('statement-ignores-blanks', POL, "return tuple((src.word(k), k > a and src.glued(k)) for k in range(a, b))",
      "return tuple((src.word(k), False) for k in range(a, b))", '`a[i]` and `a [i]` (two statements to Lean) compare equal', *L28_T, NB),
    M('open-in-reaches-theorem', POL, "if w == 'open' and main:", "if w == 'open' and False:",
      '`open … in` (also glued to the line above) reaches the statement', *L28_T, NB),
    M('print-axioms-sent', POL, "return None, _blank(code, header + printed)", "return None, _blank(code, header)",
      "the candidate's own #print axioms is sent to Lean beside ours", *L28_T, NB),
    M('scoped-open-allowed', POL, "if {n for n in scoped if n == ns or n.endswith('.' + ns)} - set(src.opens) and not _same_after(src, k, ns):",
      "if False:", 'an `open` whose scoped notation makes Lean read the rest otherwise passes', *L28_T, NB),
    M('scoped-tokens-everywhere', POL, "self.opens, self.table = tuple(opens), token_table(tuple(opens))",
      "self.opens, self.table = tuple(opens), token_table(__import__('ei_nb.lean_tokens').lean_tokens._opens_in(text))",
      'scoped tokens read from an `open` anywhere in the text, also before it (and from a dropped header line)', *L28_T, NB),
    M('judge-one-sorry-ok', REPLY, "if sorries: return 'fail'", "if len(sorries) > 1: return 'fail'", 'one sorry passes', *PRE_T, NB),
    M('judge-fake-report', REPLY, "if len(mine) > 1: return 'fail'", "if len(mine) > 2: return 'fail'",
      'a faked second axiom report passes', PIN + 'test_judge_fails_when_two_axiom_reports_sit_at_the_appended_line', *PRE_T, NB),
    M('judge-any-axiom', REPLY, 'if a not in allowed_axioms(policy or DEFAULT_POLICY)]', "if a == 'sorryAx']",
      'non-standard axioms pass', *PRE_T, NB),
    M('judge-qualified-name', REPLY, "and x.group(1) == name]", "and (x.group(1) == name or x.group(1).endswith('.' + name))]",
      'a report about `Foo.NAME` counts for the root NAME the probe and the replay inspect', *VER_T, NB),
    # ---- the tokens the pre-check reads (lean_tokens): Lean ends a numeral, a character, a declared token where Lean does
    M('tokens-glued-numeral', TOK, 'r"[0-9]+(?:\\.[0-9]*)?(?:[eE][+-]?[0-9]+)?"', 'r"[0-9]+(?:\\.[0-9]*)?(?:[eE][+-]?[0-9]+)?[A-Za-z_]*"',
      'a numeral swallows the command word glued to it (`1instance` one token)', *L28_T),
    M('tokens-glued-char', TOK, """('char', rf"'(?!'){_CHAR_BODY}'")""", """('char', rf"'(?!'){_CHAR_BODY}'[A-Za-z_]*")""",
      "a character literal swallows the command word glued to it (`'a'instance` one token)", *L28_T),
    M('tokens-quote-tokens-forgotten', TOK, 'self.tokens = frozenset(tokens)', 'self.tokens = frozenset(t for t in tokens if not t.endswith("\'"))',
      "tokens ending in a quote (`''`, `×'`, `∑'`…) are unknown: the `'…'` after them is misread", *L28_T),
    # ---- the kernel replay (verifier/verifier, verifier/lean_replay)
    M('replay-result-ignored', VERI, "if verdict == 'pass' and pickle: verdict, reason = self._replayed(problem, name, pickle)",
      "if verdict == 'pass' and pickle: self._replayed(problem, name, pickle)", 'a proof the kernel replay rejects passes', *REP_T, NB),
    M('replay-crash-is-a-verdict', VERI, "except (HeaderStall, ReplayError) as e: raise StageFailed", "except HeaderStall as e: raise StageFailed",
      'a crashing replay tool is an `error` verdict, not exit 3', *REP_T, NB),
    M('replay-axioms-ignored', REPL_NB, "if bad := [a for a in answer['axioms'] if a not in allowed_axioms(policy or DEFAULT_POLICY)]:",
      "if bad := []:", 'an axiom the replayed environment shows passes', *REP_T, NB),
    M('replay-type-ignored', REPL_NB, "if answer['statement'] != 'same':", "if False:",
      "a replayed theorem of another type passes", *REP_T, NB),
    # ---- the chain hash (markers)
    M('chain-ignores-seed', MRK, '{k: v for k, v in params.items() if k not in VOLATILE}',
      "{k: v for k, v in params.items() if k not in VOLATILE | {'seed'}}", 'a reseeded stage is skipped as finished',
      *CHAIN_T, NB),
    M('chain-ignores-prev', MRK, "'inputs': inputs, 'prev': prev})", "'inputs': inputs})",
      'a rerun earlier stage does not invalidate later ones', *CHAIN_T, NB),
    M('chain-ignores-inputs', MRK, "'inputs': inputs, 'prev': prev})", "'prev': prev})",
      'a changed input file does not change the chain', *CHAIN_T, NB),
    # ---- the conjecture stage (00b_conjecture): nothing that is a copy, a protected problem or a cheat enters the pool
    M('conj-protected-admitted', CONJ, "elif match := protected_match(prob, index): c |= {'status': 'protected', 'reason': match}",
      "elif match := None: c |= {'status': 'protected', 'reason': match}", 'a protected statement becomes a pool problem', *CONJ_T, NB),
    M('conj-seed-admitted', CONJ, "elif key == statement_key(pp['formal_statement']): c['status'] = 'seed'",
      "elif False: c['status'] = 'seed'", 'a copy of its seed becomes a new problem', *CONJ_T, NB),
    M('conj-rules-skipped', CONJ, "if reason := precheck_statement(prob): c |= {'status': 'rule', 'reason': reason}",
      "if reason := None: c |= {'status': 'rule', 'reason': reason}", 'a statement with a cheat reaches the pool', *CONJ_T, NB),
    M('conj-easy-kept', CONJ, "elif len(ps) / n >= conj_hi: status[cp['name']] = 'easy'",
      "elif len(ps) / n > 1: status[cp['name']] = 'easy'", 'conjectures the prover finds easy are kept', *CONJ_T, NB),
    # ---- issue 30: each optional stage does what its paper's released code does
    M('lever-rank-by-sum', SFT, "return lp[0] / max(1, lp[1]) if rank_by == 'mean' else lp[0]", 'return lp[0]',
      "the lever ranks by summed log-prob (a length lever), not the trainer's per-token mean", *LEVER_T, NB),
    M('lever-weights-not-normalised', SFT, "return {i: len(pos) * pos[i] / sum(pos.values()) if i in pos else 0.0 for i in kept}",
      "return {i: max(adv[i], 0.0) for i in kept}", "row weights re-weight problems against each other (no mean 1 per problem)", *LEVER_T, NB),
    M('lever-rank-among-correct', SFT, "ranks = group_ranks({i: rank_logprob(lp, rank_by) for i, lp in group.items()})",
      "ranks = group_ranks({i: rank_logprob(lp, rank_by) for i, lp in group.items() if i in correct})",
      'the lever ranks the correct samples only, not the whole group', *LEVER_T, NB),
    M('lever-factor-reversed', SFT, "return 1 - beta_rank * r / G", "return 1 - beta_rank * (G - 1 - r) / G",
      'the rank penalty falls on the unlikely samples', *LEVER_T, NB),
    M('uplift-rank-among-correct', SHARP, "ranked = rank_by_logprob(b).merge(a, on=['name', 'sample_idx'], how='left')",
      "ranked = rank_by_logprob(b[b['correct'].astype(bool)]).merge(a, on=['name', 'sample_idx'], how='left')",
      "the diagnostic's x-axis is the rank among correct samples, not Figure 4's group rank",
      'tests/test_sharpen.py::test_uplift_is_the_papers_compute_uplift_rate', NB),
    M('conj-threshold-inclusive', CONJ, "elif len(ps) / n >= conj_hi:", "elif len(ps) / n > conj_hi:",
      "a conjecture proved at exactly conj_hi is kept (STP's rule is strict)", 'tests/test_conjectures.py::test_the_keep_rule_is_strict_and_states_its_n', NB),
    M('conj-proofs-quarter', CONJ, "if 0 < len(passes.get(cp['name'], ())) <= hi * tried[cp['name']]]",
      "if 0 < len(passes.get(cp['name'], ())) <= 0.25 * tried[cp['name']]]", "conjectures proved up to half the time give the prover no rows",
      'tests/test_conjectures.py::test_conjecture_proofs_become_prover_rows_as_stp', NB),
    M('protected-structural-off', SFT, "if (k := structural_key(problem['formal_statement'])) is not None and k in index[2]: return 'structural'",
      "if False: return 'structural'", 'a paraphrased protected statement is trained on (and enters the pool as a conjecture)',
      'tests/test_conjectures.py::test_a_paraphrased_test_problem_is_a_protected_conjecture', NB),
    M('select-structural-off', SEL, "return key in index[1] or key_digest(structural_key(statement)) in index[2]",
      'return key in index[1]', 'a paraphrased protected statement in the pool is selected', NB),
    M('near-dup-operands-unsorted', 'nbs/records/near_dup.ipynb', "return f'{op}(' + ','.join(sorted(parts)) + ')'", "return f'{op}(' + ','.join(parts) + ')'",
      '`b + a` no longer matches `a + b`', 'tests/test_conjectures.py::test_structural_key_catches_generated_paraphrases_of_minif2f', NB),
    M('near-dup-hypotheses-unsorted', 'nbs/records/near_dup.ipynb', "tuple(sorted(canon(h, ren) for h in hyps)), canon(goal, ren))",
      "tuple(canon(h, ren) for h in hyps), canon(goal, ren))", 'reordered hypotheses no longer match',
      'tests/test_conjectures.py::test_structural_key_catches_generated_paraphrases_of_minif2f', NB),
    M('cap-shortest-first', SFT, "keep = set(random.Random(f'{seed}:{kind}').sample(sorted(keep, key=lambda i: (extra[i]['name'], extra[i]['sample_idx'], i)), room))",
      "keep = set(sorted(keep, key=lambda i: extra[i]['n_tokens'])[:room])", 'capped extra rows favour the shortest (easy seeds, short answers)',
      'tests/test_sft.py::test_capped_extra_rows_are_a_seeded_uniform_draw', NB),
    M('dpo-one-run', 'nbs/training/dpo.ipynb', 'per_band:bool=True, # each band its own run', 'per_band:bool=False, # each band its own run',
      'one schedule and a fixed reference span every band (the hardest trains on the decayed tail)', 'tests/test_dpo.py::test_each_band_is_its_own_run', NB),
    M('dpo-reference-not-moved', 'nbs/training/dpo.ipynb', 'if per_band and s in (run.start, bound[1]):', 'if per_band and s == run.start:',
      "a band's reference is not the previous band's policy", 'tests/test_dpo.py::test_each_band_is_its_own_run', NB),
    M('dpo-lengths-with-prompt', 'nbs/training/dpo.ipynb', "c, r = ([p[f'{k}_tokens'] - p['n_prompt_tokens'] for p in ps] for k in ('chosen', 'rejected'))",
      "c, r = ([p[f'{k}_tokens'] for p in ps] for k in ('chosen', 'rejected'))", 'pair lengths count the prompt', NB),
    M('correct-solved-problems', 'nbs/01c_correct.ipynb', "if v['name'] not in solved and is_fixable(v, prefixes)", 'if is_fixable(v, prefixes)',
      'failures of problems the round solved are corrected (Goedel corrects only unsolved ones)', *CORR_T, NB),
    M('correct-no-sorry', 'nbs/01c_correct.ipynb', 'PREFIXES = (LEAN_ERROR, LEAN_SORRY)', 'PREFIXES = (LEAN_ERROR,)',
      'incomplete proofs are not corrected (Goedel corrects them)', *CORR_T, NB),
    M('messages-cut-at-2000', REPLY, "text = m['data'] if len(m['data']) <= cap else", "text = m['data'][:2000] if len(m['data']) <= cap else",
      "Lean's messages are cut (Goedel keeps them whole)", 'tests/test_corrections.py::test_ten_whole_errors_keep_eight_and_count_the_rest', NB),
    M('feedback-omitted-unsaid', 'nbs/records/prompts.ipynb', 'if (left := max(0, len(errs) - max_errors) + omitted) > 0:', 'if (left := max(0, len(errs) - max_errors)) > 0:',
      "the errors the verdict did not keep are not counted in the turn", 'tests/test_corrections.py::test_ten_whole_errors_keep_eight_and_count_the_rest', NB),
    M('feedback-not-goedels', 'nbs/records/prompts.ipynb', r"return ''.join(l + '\n' for l in out + lines[b + 1:b + 2])", r"return '\n'.join(out + lines[b + 1:b + 2])",
      "the quoted block differs from Goedel-Prover-V2's by a blank line", 'tests/test_corrections.py -k goedels_byte_for_byte', NB),
    # ---- the C JSON Lines scanner: a duplicate key must send the file to the exact reader, which refuses it
    M('scan-nested-duplicate-keys', 'ei_nb/kernels/jsonl_scan.c',
      'if (c->keys[i].n == k.n && same_bytes(c->keys[i].p, k.p, k.n)) return 0;', 'if (0) return 0;',
      'a duplicate key inside a nested object is read silently', 'tests/test_jsonl_scan.py::test_each_fault_is_caught'),
    M('scan-top-duplicate-keys', 'ei_nb/kernels/jsonl_scan.c', 'if (seen & (1u << top_field)) return 0;', 'if (0) return 0;',
      'a duplicate top-level key is read silently', 'tests/test_jsonl_scan.py::test_each_fault_is_caught'),
    # ---- the scanner's counting mode (ei stats, ei select): a sample twice must never be counted
    M('count-index-unchecked', 'ei_nb/kernels/jsonl_scan.c', 'if (k->row_idx <= k->last[id]) return 2;', 'if (0) return 2;',
      'a (name, sample_idx) pair written twice is counted twice', 'tests/test_jsonl_scan.py -k "counting or counts"'),
    M('count-parts-unchecked', 'nbs/records/jsonl_scan.ipynb', 'if np.any(p.first <= last[k]): return None', 'if False: return None',
      'a sample repeated across the cut between two parts is counted twice', 'tests/test_jsonl_scan.py -k "counting or counts"'),
    # ---- statement keys: the kernel's plain keys (decontamination in C) and the lexer's shortcut must stay Python's keys
    M('plainkey-nbsp-not-blank', 'ei_nb/kernels/jsonl_scan.c', '(v >= 0x80 && v <= 0xA0)', '(v >= 0x80 && v < 0xA0)',
      'a no-break space is kept in the C key where Python splits at it (a renamed copy with one slips through)', *PLAIN_T),
    M('plainkey-tail-blank-kept', 'ei_nb/kernels/jsonl_scan.c',
      "{ t -= 2; if (t > 0 && out[t - 1] == ' ') t--; m = t; }", '{ t -= 2; m = t; }',
      'the C key keeps the blank before `:= by`', *PLAIN_T),
    M('plainkey-comment-unseen', 'ei_nb/kernels/jsonl_scan.c', "if (c == '-' && (last == '-' || last == '/')) return -1;",
      "if (c == '-' && last == '/') return -1;", 'a `--` comment is keyed as code in C', *PLAIN_T),
    M('plainkey-decl-lemma', 'ei_nb/kernels/jsonl_scan.c', 'else if (begins(out + p, m - p, "lemma ")) p += 6;',
      'else if (begins(out + p, m - p, "lemma ")) p += 5;', 'a `lemma` keeps its name in the C key', *PLAIN_T),
    M('lex-shortcut-misses-char', 'nbs/records/lean_lex.ipynb', '''or '"' in text or "'" in text)''', '''or '"' in text)''',
      'a char literal is taken for code (the pre-check and the key read inside it)',
      'tests/test_lean_lex.py', *PLAIN_T, NB),
    # ---- exit codes (core, cli)
    M('exit-stagefailed-2', 'nbs/records/core.ipynb', 'finished stage (exit 3)."\n    exit_code = 3', 'finished stage (exit 3)."\n    exit_code = 2',
      'a failed stage exits 2', *EXIT_T, NB),
    M('exit-datastop-3', 'nbs/records/core.ipynb', 'the numbers that show why."\n    exit_code = 4', 'the numbers that show why."\n    exit_code = 3',
      'a data stop exits 3', *EXIT_T, NB),
    M('exit-badinput-1', 'nbs/records/core.ipynb', 'used as given (exit 2)."\n    exit_code = 2', 'used as given (exit 2)."\n    exit_code = 1',
      'bad input exits 1', *EXIT_T, NB),
    M('exit-main-returns-1', 'nbs/records/cli.ipynb', "say(f'ei {argv[0]}: error: {e}'); return e.exit_code",
      "say(f'ei {argv[0]}: error: {e}'); return 1", 'every error exits 1', *EXIT_T, NB),
    M('exit-interrupt-130', 'nbs/records/cli.ipynb', "say(f'ei {argv[0]}: interrupted'); return 143",
      "say(f'ei {argv[0]}: interrupted'); return 130", 'a SIGTERM exits 130, not 143', *EXIT_T, NB),
    # ---- issue 27: managed servers, sampling parity, the verifier guard, the checking server's lines
    M('served-top-k-left-out', 'nbs/sampling/samplers.ipynb', "'top_k': params.top_k, ", '',
      'a sampler leaves top_k out: vllm serve fills it from the model (Qwen3: 20)', *SERVE27_T),
    M('transformers-top-k-default', 'nbs/sampling/samplers.ipynb', "'top_p': f['top_p'], 'top_k': f['top_k'],", "'top_p': f['top_p'],",
      "the transformers sampler keeps transformers' top_k of 50", *SERVE27_T),
    M('server-generation-config-auto', 'nbs/sampling/vllm_server.ipynb', "generation_config:str='vllm'", "generation_config:str='auto'",
      "the managed server fills unsent fields from the model's generation_config.json", 'tests/test_serve.py -k flags', NB),
    M('restart-twice-per-chunk', 'nbs/sampling/vllm_server.ipynb', "        raise StageFailed(f'the vLLM server died again during",
      "        server.restart('again'); return run_chunk()\n        raise StageFailed(f'the vLLM server died again during",
      'a server that dies twice in a chunk is restarted forever instead of failing the stage', 'tests/test_serve.py -k "second_death or one_restart"'),
    M('guard-never-trips', 'nbs/verifier/verify.ipynb', 'if enough and self.errors > self.max_frac * self.checked', 'if False',
      'a broken verifier scores the run instead of stopping it', *GUARD27_T),
    M('guard-counts-prechecks', 'nbs/verifier/verify.ipynb', "return v['verdict'] == 'fail' and not any(", "return v['verdict'] == 'fail' or not any(",
      'pre-check rejections dilute the error share', NB),
    M('errors-kept-on-resume', 'nbs/sampling/samplers.ipynb', "if v['verdict'] != 'error'}  # checked again", "}  # checked again",
      'after the fix, the `error` samples keep their `error`', *GUARD27_T),
    M('auth-is-a-proof-error', 'nbs/verifier/lean_backends.ipynb', 'if e.code in (401, 403): raise ServerRefused(', 'if e.code in (): raise ServerRefused(',
      'a wrong API key scores every proof `error` instead of stopping', *GUARD27_T, 'tests/test_realrun.py -k refuses_the_key'),
    M('lines-not-shifted', 'nbs/verifier/lean_backends.ipynb', "return _shift_lines(reply, _lead_lines(full)) if self.conventions[i] == 'body' else reply",
      'return reply', "a server counting lines after the imports (kimina before e2cdc1f) misplaces every message", 'tests/test_kimina_lines.py'),
    M('repl-checked-by-history', 'nbs/tools/setup_lean.ipynb', "    if tree == trees[0]: return 'tag'\n    raise BadInput(", "    if tree == trees[0]: return 'tag'\n    return 'tag'\n    raise BadInput(",
      'a REPL checkout at another tree is accepted', 'tests/test_realrun.py -k another_tree', NB),
    M('cache-miss-aborts', 'nbs/tools/setup_lean.ipynb', "    if rc and step is not None and step.may_fail:", "    if False:",
      "the fork's expected cache miss aborts the set-up before lake build", 'tests/test_realrun.py -k cache_miss', NB),
    # ---- the science of the loop (issue 29): the learning demo must stop learning under each of these, and only
    #      tests/test_science_learning.py (real `ei run`s of configs/demo_learn.toml and demo_learn_forms.toml) is asked.
    #      Three are wiring faults in a stage's runner, below its examples: a stage notebook runs its own examples every time
    #      the driver executes it, so the same fault in the library code (keep-longest-first, select-lo-inclusive,
    #      avg-weights-swapped above) already stops the run at that stage; the runner is what only the science can check.
    M('learn-prompt-loss', ROWS, "mask = [j >= examples[i]['n_prompt'] for", 'mask = [j >= 0 for',
      'the loss is computed on the prompt tokens too (rows is a library: no stage runs its examples)', *LEARN_T),
    M('learn-keep-longest', SFT, 'rows, stats = build_sft_rows(_problems, _samples, _verdicts,',
      "_RANK_KEYS['shortest'] = lambda sv: (-sv[0]['n_tokens'], sv[0]['sample_idx'])\nrows, stats = build_sft_rows(_problems, _samples, _verdicts,",
      'the keep rule the round uses takes the longest proofs', 'tests/test_sft_stage.py -k shortest_verified', *LEARN_T),
    M('learn-band-solved', SEL, 'summary, table = run_select(pool_path, results_path, _R.selected, protected_paths, _params,',
      'summary, table = run_select(pool_path, results_path, _R.selected, protected_paths, {**_params, "lo": hi, "hi": 1.0},',
      'the round selects the solved end (hi < p <= 1) instead of the band lo < p <= hi', 'tests/test_select_stage.py -k band',
      *LEARN_T),
    M('learn-ftw0', AVG, 'result = average_checkpoints(anchor_dir, finetuned_dir, out_dir, ft_weight, threads=threads, force=force)',
      'result = average_checkpoints(anchor_dir, finetuned_dir, out_dir, 0.0, threads=threads, force=force)',
      'the round averages with ft_weight 0: every round hands on the anchor (the base model)', *LEARN_T),
    # ---- issue 35: the controls, the leak, the band (the quick check first, alone: conftest runs long files first)
    M('learn-keep-every-sample', SFT, 'rows, stats = build_sft_rows(_problems, _samples, _verdicts,',
      'rows, stats = build_sft_rows(_problems, _samples, unverified_verdicts(_samples, _verdicts)[0],',
      'the verifier is bypassed: the round keeps every well-formed sample, right or wrong',
      'tests/test_sft_stage.py -k shortest_verified', *LEARN_T),
    M('learn-warm-leak', 'nbs/tools/arith.ipynb', "out['pool'], out['warm'] = draw('pool', pool, held), draw('warm', warm, held)",
      "out['pool'], out['warm'] = draw('pool', pool, held), draw('warm', warm, None)",
      'the warm-start set is drawn without the protected near-duplicate check (commuted twins of scored problems)',
      'tests/test_domain_leaks.py -k protected_check', *LEARN_T),
    M('learn-band-everything', SEL, 'summary, table = run_select(pool_path, results_path, _R.selected, protected_paths, _params,',
      'summary, table = run_select(pool_path, results_path, _R.selected, protected_paths, {**_params, "lo": 0.0, "hi": 1.0},',
      'the band selects every measured problem (0 <= p <= 1): selection does nothing', 'tests/test_select_stage.py -k band',
      *LEARN_T),
    # ---- issue 28 part 5: a locked confirmation cannot be edited silently
    M('lock-report-unchecked', 'nbs/tools/confirm.ipynb', "    if C.lock.is_file() and bad: raise StageFailed(", "    if False and bad: raise StageFailed(",
      '`ei confirm report` renders a confirmation whose locked files changed', 'tests/test_confirm.py -k report_renders', NB),
    M('lock-status-exits-0', 'nbs/tools/confirm.ipynb', "    if bad: raise StageFailed(f'{_cdir(a.run_dir)}", "    if False: raise StageFailed(f'{_cdir(a.run_dir)}",
      '`ei confirm status` exits 0 after registration.json or a locked verdict changed', 'tests/test_confirm.py -k report_renders', NB),
    M('lock-misses-samples', 'nbs/tools/confirm.ipynb', "for f in (C.arm(a).samples, C.arm(a).verdicts, C.arm_done(a))]", "for f in (C.arm(a).verdicts,)]",
      "the lock leaves the arms' samples and markers unhashed", NB),
]


# ---------------------------------------------------------------- editing a file's code

def _code_cells(nb:dict) -> list:
    return [c for c in nb['cells'] if c['cell_type'] == 'code']


def _text(c) -> str: return ''.join(c['source']) if isinstance(c['source'], list) else c['source']


def occurrences(path:Path, old:str) -> int:
    "How often `old` occurs in the code cells of a notebook (or in a plain file)."
    if path.suffix != '.ipynb': return path.read_text().count(old)
    return sum(_text(c).count(old) for c in _code_cells(json.loads(path.read_text())))


def apply(path:Path, old:str, new:str):
    "Replace the one occurrence of `old` in `path` (in its code cells, for a notebook) by `new`."
    if path.suffix != '.ipynb': path.write_text(path.read_text().replace(old, new)); return
    nb = json.loads(path.read_text())
    for c in _code_cells(nb):
        if old in (s := _text(c)): c['source'] = s.replace(old, new).splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')


def pattern_problem(m:Mutant, root:Path) -> str|None:
    p = root / m.path
    if not p.exists(): return f'{m.path} does not exist'
    if (k := occurrences(p, m.old)) != 1: return f'pattern found {k} times in {m.path} (expected once): re-aim the mutant'
    return None


# ---------------------------------------------------------------- a copy of the repository to mutate

def copy_repo(dest:Path) -> Path:
    "The working tree's files (tracked, and untracked but not ignored) copied under `dest/repo`."
    files = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard', '-z'], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split('\0')
    repo = dest / 'repo'
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (repo / f).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(src, repo / f)
    return repo


def environment(repo:Path, work:Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from ei_nb.core import shared_data
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS='1', TOKENIZERS_PARALLELISM='false', MPLBACKEND='Agg',
               PYTHONDONTWRITEBYTECODE='1', EI_SHARED_DATA=str(shared_data()), EI_CACHE=str(work / 'cache'))
    env.pop('EI_AVERAGE_KERNEL', None)
    return env


def restore(repo:Path, pristine:Path, m:Mutant):
    shutil.copy2(pristine / m.path, repo / m.path)
    shutil.rmtree(repo / 'ei_nb'); shutil.copytree(pristine / 'ei_nb', repo / 'ei_nb')


def run(cmd:list, repo:Path, env:dict, deadline:float) -> tuple[str, str]:
    "('pass' | 'fail' | 'timeout', last lines of output) of `cmd` run in `repo` before `deadline`."
    left = deadline - time.time()
    if left <= 0: return 'timeout', ''
    p = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try: out, _ = p.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL); p.communicate(); return 'timeout', ''
    tail = '\n'.join(out.decode(errors='replace').strip().splitlines()[-8:])
    return ('pass' if p.returncode == 0 else 'fail'), tail


def commands(m:Mutant) -> list[tuple[str, list]]:
    "The checks of `m` as commands, in order: plain pytest node ids batched into one run (one start-up), a `-k` target alone."
    import shlex
    out, batch = [], []
    def flush():
        if batch: out.append((' '.join(batch), [sys.executable, '-m', 'pytest', '-x', '-q', '-p', 'no:cacheprovider', *batch]))
        batch.clear()
    for check in m.checks:
        if check == NB: flush(); out.append((f'nbdev_test {m.path}', ['nbdev_test', '--path', m.path, '--n_workers', '1']))
        elif ' ' in check: flush(); out.append((check, [sys.executable, '-m', 'pytest', '-x', '-q', '-p', 'no:cacheprovider', *shlex.split(check)]))
        else: batch.append(check)
    flush()
    return out


def export(m:Mutant, repo:Path, env:dict, deadline:float) -> tuple[str, str]:
    if not m.path.endswith('.ipynb'): return 'pass', ''
    return run(['nbdev_export', '--path', m.path], repo, env, deadline)


def _by(label:str, tail:str) -> str:
    "Which check failed: the notebook, or the first failing pytest node named in pytest's summary."
    import re
    if label.startswith('nbdev_test'): return label
    return (m.group(1) if (m := re.search(r'FAILED (\S+)', tail)) else label).split(' - ')[0]


def try_mutant(m:Mutant, repo:Path, pristine:Path, env:dict, timeout:float) -> dict:
    t0 = time.time(); deadline = t0 + timeout
    restore(repo, pristine, m)
    apply(repo / m.path, m.old, m.new)
    res = {'name': m.name, 'path': m.path, 'what': m.what}
    st, tail = export(m, repo, env, deadline)
    if st != 'pass': return res | {'result': 'killed' if st == 'fail' else 'timeout', 'by': 'nbdev_export', 'tail': tail,
                                   'seconds': round(time.time() - t0, 1)}
    for label, cmd in commands(m):
        st, tail = run(cmd, repo, env, deadline)
        if st != 'pass':
            restore(repo, pristine, m)
            return res | {'result': 'killed' if st == 'fail' else 'timeout', 'by': _by(label, tail),
                          'tail': tail, 'seconds': round(time.time() - t0, 1)}
    restore(repo, pristine, m)
    return res | {'result': 'SURVIVED', 'by': '', 'tail': '', 'seconds': round(time.time() - t0, 1)}


def baseline(mutants:list, repo:Path, env:dict, timeout:float) -> list:
    "The selected checks run once on the unmutated copy; the ones that do not pass."
    seen, bad = set(), []
    for m in mutants:
        for label, cmd in commands(m):
            if label in seen: continue
            seen.add(label)
            st, tail = run(cmd, repo, env, time.time() + timeout)
            print(f'  baseline {st:<7} {label}', flush=True)
            if st != 'pass': bad.append((label, st, tail))
    return bad


# ---------------------------------------------------------------- the command

def select(only:str|None) -> list:
    if not only: return MUTANTS
    names = [n.strip() for n in only.split(',') if n.strip()]
    unknown = sorted(set(names) - {m.name for m in MUTANTS})
    if unknown: sys.exit(f'mutation_check: unknown mutant(s) {", ".join(unknown)}: see --list')
    return [m for m in MUTANTS if m.name in names]


def table(results:list) -> str:
    rows = ['| mutant | file | result | caught by | s |', '|---|---|---|---|---|']
    rows += [f"| {r['name']} | {r['path']} | {r['result']} | {r.get('by', '')} | {r.get('seconds', '')} |" for r in results]
    return '\n'.join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--list', action='store_true', help='list the mutants, their checks and whether each pattern is found')
    ap.add_argument('--only', help='comma-separated mutant names')
    ap.add_argument('--timeout', type=float, default=600, help='seconds per mutant, export and checks together (default 600)')
    ap.add_argument('--no-baseline', action='store_true', help='skip running the checks on the unmutated copy first')
    ap.add_argument('--json', help='also write the results as JSON to this file')
    a = ap.parse_args(argv)
    mutants = select(a.only)
    problems = {m.name: pattern_problem(m, ROOT) for m in mutants}
    if a.list:
        for m in mutants:
            print(f'{m.name:<28} {m.path:<30} {problems[m.name] or "pattern ok"}\n    {m.what}\n    checks: '
                  + ', '.join(c if c != NB else 'nbdev_test' for c in m.checks))
        print(f'{len(mutants)} mutants, {sum(1 for p in problems.values() if p)} with a pattern problem')
        return 1 if any(problems.values()) else 0
    results = [{'name': n, 'path': next(m.path for m in mutants if m.name == n), 'result': 'NOT FOUND', 'by': p}
               for n, p in problems.items() if p]
    todo = [m for m in mutants if not problems[m.name]]
    with tempfile.TemporaryDirectory(prefix='ei_mutation_') as tmp:
        work = Path(tmp)
        repo = copy_repo(work)
        pristine = work / 'pristine'; shutil.copytree(repo, pristine, ignore=shutil.ignore_patterns('runs', '.git'))
        env = environment(repo, work)
        print(f'mutation_check: {len(todo)} mutant(s) in a copy at {repo}', flush=True)
        if not a.no_baseline and (bad := baseline(todo, repo, env, a.timeout)):
            for label, st, tail in bad: print(f'baseline check {label}: {st}\n{tail}')
            print('mutation_check: a check fails without any mutant: fix it first (or --no-baseline to see anyway)')
            return 2
        for m in todo:
            r = try_mutant(m, repo, pristine, env, a.timeout)
            print(f"  {r['result']:<8} {m.name:<28} {r['by']} ({r['seconds']} s)", flush=True)
            results.append(r)
    print('\n' + table(results))
    killed = sum(r['result'] == 'killed' for r in results)
    others = ', '.join(f'{k}: {n}' for k in ('SURVIVED', 'timeout', 'NOT FOUND') if (n := sum(r['result'] == k for r in results)))
    print(f'\n{killed} of {len(results)} mutants killed; {others or "none survived"}')
    if a.json: Path(a.json).write_text(json.dumps(results, indent=2) + '\n')
    return 0 if killed == len(results) else 1


if __name__ == '__main__':
    sys.exit(main())

"""GrammarState: one request's place in its grammar, always derived from its output tokens.

The state is an xgrammar `GrammarMatcher` plus how many output tokens it has accepted. Before a
step fills the request's bitmask, the matcher catches up with the tokens the request has now
(`pending`): normally the one token sampled last step, after a rebuild all of them. So nothing
else has to tell the matcher about tokens, and a request whose tokens were recomputed (preempted)
or whose history no longer matches what the matcher saw is rebuilt from its tokens (`rebuild`).

Ending within the budget (`Closer`): a small model can loop inside an unbounded string or array
until `max_tokens` cuts the JSON in half. Close to the end of its budget a request is steered
out: the closer finds a short way to a complete output from the current state (the grammar's
forced text; else a character that completes the output; else the first of `"`, `}`, `]`, `,`,
digits, letters... that moves the grammar on rather than extending the same string or number)
and, once that path needs all the tokens left (plus a margin: one token can lengthen the way
out), the bitmask allows only its next token, then EOS. The path is recomputed while there is
slack, halving the gap each time: a few thousand matcher steps per request near its end, none
before. It is a heuristic for grammars in general (JSON always closes); when it finds no way out
in the budget, the request samples freely and may end by length.
"""

from __future__ import annotations

import torch
import xgrammar as xgr

# Characters tried, in order, where the grammar leaves a choice: close what is open first.
CLOSING_CHARS = '"}],' + "0123456789" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CLOSING_CHARS += " -._:;/'()<>=+*!?#%&@^`|~\\{[\n"
MAX_PLAN = 4096  # longest way out searched (tokens)
RETRY_EVERY = 16  # tokens between searches while no way out fits in the budget
# Steering starts while this many tokens of slack are left: one token can make the way out
# longer (opening an object with required fields); the margin is the first way out's length
# (what a whole minimal output needs), within these bounds.
MIN_MARGIN, MAX_MARGIN = 4, 64


class Closer:
    """Per tokenizer: the single-character tokens the closer may write, in `CLOSING_CHARS`
    order."""

    def __init__(self, info: xgr.TokenizerInfo) -> None:
        single: dict[bytes, int] = {}
        for i, b in enumerate(info.decoded_vocab):
            if len(b) == 1 and b not in single:
                single[b] = i
        self.tokens = [single[c.encode()] for c in CLOSING_CHARS if c.encode() in single]
        self.stop = info.stop_token_ids[0] if info.stop_token_ids else None
        self.vocab_size = info.vocab_size
        self._mask = None  # a one-row bitmask, for the rare choice no closing character fits

    def plan(self, matcher: xgr.GrammarMatcher, limit: int) -> list[int] | None:
        """Tokens that take `matcher` to a complete output (at most `limit`), or None."""
        probe = matcher.fork()
        plan: list[int] = []
        while len(plan) <= limit:
            if probe.is_completed():
                return plan
            jump = probe.find_jump_forward_tokens()
            if jump and all(probe.accept_token(t) for t in jump):
                plan += jump
                continue
            t = self._choose(probe)
            if t is None:
                return None
            plan.append(t)
        return None

    def _choose(self, probe: xgr.GrammarMatcher) -> int | None:
        """Accept and return the next token of the way out: one that completes the output if
        any does; else the first (in `CLOSING_CHARS` order) that leaves the grammar somewhere
        new (not another letter of the same string or digit of the same number), else the first
        allowed at all."""
        accepted = []
        for t in self.tokens:
            if probe.accept_token(t):
                if probe.is_completed():
                    return t
                probe.rollback(1)
                accepted.append(t)
        if not accepted:  # e.g. inside a multi-byte character: the lowest token allowed
            t = self._first_allowed(probe)
            return t if t is not None and probe.accept_token(t) else None
        before = self._allowed(probe).clone()
        for t in accepted:
            probe.accept_token(t)
            if not torch.equal(self._allowed(probe), before):
                return t
            probe.rollback(1)
        probe.accept_token(accepted[0])
        return accepted[0]

    def _allowed(self, matcher: xgr.GrammarMatcher) -> torch.Tensor:
        if self._mask is None:
            self._mask = xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(self._mask)
        return self._mask[0]

    def _first_allowed(self, matcher: xgr.GrammarMatcher) -> int | None:
        mask = self._allowed(matcher)
        words = mask.nonzero()
        if not len(words):
            return None
        w = int(words[0])
        bits = int(mask[w]) & 0xFFFFFFFF
        return w * 32 + ((bits & -bits).bit_length() - 1)


class GrammarState:
    """A request's matcher, its progress through the output tokens and its way out."""

    __slots__ = ("accepted", "broken", "check_at", "compiled", "margin", "matcher", "plan")

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self.compiled = compiled
        self.matcher = xgr.GrammarMatcher(compiled)
        self.accepted = 0  # output tokens the matcher has consumed
        self.check_at = 0  # look for the way out once this few tokens are left (0: at once)
        self.plan: list[int] | None = None  # forced tokens left, once the budget is tight
        self.broken = False  # a token the grammar refused (a bug): only EOS is allowed
        self.margin: int | None = None  # slack kept for a longer way out (MIN/MAX_MARGIN)

    def rebuild(self, output: list[int]) -> None:
        """Start again from the first output token (the history differs from what was seen)."""
        self.matcher = xgr.GrammarMatcher(self.compiled)
        self.accepted, self.plan, self.broken = 0, None, False
        self.accept(output)

    def accept(self, output: list[int]) -> None:
        """Consume the output tokens not seen yet (one at a time; the batch path in `bitmask`
        handles the common single new token)."""
        for t in output[self.accepted :]:
            self.accept_one(t, self.matcher.accept_token(t))

    def accept_one(self, token: int, ok: bool) -> None:
        """Bookkeeping after the matcher was offered `token` (`ok`: whether it took it)."""
        self.accepted += 1
        if not ok:
            self.broken = True
        if self.plan:
            if self.plan[0] == token:
                self.plan.pop(0)
            else:
                self.plan = None

    def pending(self, output: list[int]) -> int:
        """New output tokens to consume; -1 when the output no longer extends what was seen."""
        n = len(output) - self.accepted
        return n if n >= 0 else -1

    def forced(self, closer: Closer, left: int) -> int | None:
        """The only token allowed now when the budget (`left` tokens, this one included) is
        down to the way out: the next planned token, EOS after it; None to sample freely."""
        if self.plan is None and (self.check_at == 0 or left <= self.check_at):
            self._look(closer, left)
        if self.plan is None:
            return None
        return self.plan[0] if self.plan else closer.stop

    def _look(self, closer: Closer, left: int) -> None:
        if self.matcher.is_terminated():
            self.check_at = -1
            return
        plan = closer.plan(self.matcher, min(left, MAX_PLAN))
        if plan is None:  # no way out that fits (yet): look again a little later
            self.check_at = max(left - min(RETRY_EVERY, max(left // 4, 1)), 1)
            return
        need = len(plan) + 1  # + EOS
        if self.margin is None:  # the first way out: from (near) the start of the output
            self.margin = min(max(need, MIN_MARGIN), MAX_MARGIN)
        if need + self.margin >= left:
            self.plan = plan
            return
        # look again when half the slack is spent (every step once it is small)
        self.check_at = max(left - max((left - need - self.margin) // 2, 1), need + self.margin)

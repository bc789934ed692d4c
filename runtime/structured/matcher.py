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
before. Where the grammar can go a few ways (a tool call or an answer), the way out through each is
compared and the shortest kept. It is a heuristic for grammars in general (JSON always closes);
when it finds no way out in the budget, the request samples freely and may end by length, after
one more look `LATE_LOOK` tokens before the end: free text before a grammar (a reasoning model's
thinking, `server/reasoning.py`) has no way out the walk finds, nor should it (the thinking is
never cut short), but an answer begun by then is steered to end within the budget.
"""

from __future__ import annotations

import numpy as np
import torch
import xgrammar as xgr

# Characters tried, in order, where the grammar leaves a choice: close what is open first.
CLOSING_CHARS = '"}],' + "0123456789" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CLOSING_CHARS += " -._:;/'()<>=+*!?#%&@^`|~\\{[\n"
FINISH_CHARS = "\"}]).!?;>'\n0123456789"  # tried first for one that completes the output
MAX_PLAN = 4096  # longest way out searched (tokens)
RETRY_EVERY = 16  # tokens between searches while no way out fits in the budget
# Two zones before the end, sized from the first way out found (`base`: what a whole minimal
# output needs). Within `hard` tokens of slack the way out is forced token by token. Within
# `soft` tokens, where the grammar allows only a few tokens (between values, not inside a
# string) and lets the open array or object close, it closes: one token there could otherwise
# open a new item whose way out no longer fits.
HARD_MARGIN = (4, 16)  # base // 2, within these bounds
SOFT_MARGIN = (16, 64)  # 2 * base, within these bounds
LATE = 4  # slack left when the halving stops: forced this many tokens early, not looked at
LATE_LOOK = 64  # where none was found from the start, the one more look: this many tokens left
# visits to one place (its bitmask) since the walk last reached a new place that tell it walks
# in a circle; counted from the last new place, and this high, so that a uuid's 32 hex digits
# (one place, by bitmask) are not taken for one
CIRCLE = 64
FORCED_TOKENS = 64  # forced text: at most this many tokens allowed, each a piece of the longest
FORCED_WORDS = 64  # bitmask words with any token allowed, checked before unpacking the mask
MAX_STARTS = 4  # closing characters allowed at most where each one's way out is compared


def _clamp(x: int, bounds: tuple[int, int]) -> int:
    return min(max(x, bounds[0]), bounds[1])


class Closer:
    """Per tokenizer: the single-character tokens the closer may write, in `CLOSING_CHARS`
    order."""

    def __init__(self, info: xgr.TokenizerInfo, vocab: list[bytes] | None = None) -> None:
        single: dict[bytes, int] = {}
        self.vocab = list(info.decoded_vocab) if vocab is None else vocab
        for i, b in enumerate(self.vocab):
            if len(b) == 1 and b not in single:
                single[b] = i
        ids = [single[c.encode()] for c in CLOSING_CHARS if c.encode() in single]
        self.tokens = np.array(ids, dtype=np.int64)
        ids = [single[c.encode()] for c in FINISH_CHARS if c.encode() in single]
        self.finishers = np.array(ids, dtype=np.int64)
        # what soft steering closes with, in order: the end, then the open array or object
        ends = [*info.stop_token_ids[:1], single.get(b"]"), single.get(b"}")]
        self.closes = [t for t in ends if t is not None]
        self.stop = info.stop_token_ids[0] if info.stop_token_ids else None
        self.vocab_size = info.vocab_size
        self._mask = None  # a one-row bitmask, for the rare choice no closing character fits
        self.by_bytes: dict[bytes, int] = {}  # token text -> id (the first with that text)
        for i, b in enumerate(self.vocab[: self.vocab_size]):
            if b:
                self.by_bytes.setdefault(b, i)
        self.longest = max(map(len, self.by_bytes), default=1)

    def plan(self, matcher: xgr.GrammarMatcher, limit: int) -> list[int] | None:
        """Tokens that take `matcher` to a complete output (at most `limit`), or None. Greedy
        first (`_choose`); where that walks in a circle (`a.a.a.` in an e-mail's name part
        never reaches its `@`) or finds nothing, again, never taking a step it kept taking.
        The walk writes single characters where the grammar leaves a choice; its text is then
        written in the longest tokens the grammar takes (`_in_long_tokens`), so a way out
        counts about the tokens the text needs (`{"a": "", "b": 0}`: 9, not 13), and a budget
        that fits it is steered into it rather than cut by `max_tokens`."""
        reach = min(2 * limit, MAX_PLAN)  # single characters, before they are joined
        plan, steps = self._walk(matcher, reach, frozenset())
        if plan is None:
            avoid = frozenset(step for step, n in steps.items() if n > 2)
            plan = self._walk(matcher, reach, avoid)[0] if avoid else None
        plan = self._shortest_start(matcher, plan, reach)
        if plan is None:
            return None
        plan = self._in_long_tokens(matcher, plan)
        return plan if len(plan) <= limit else None

    def _in_long_tokens(self, matcher: xgr.GrammarMatcher, plan: list[int]) -> list[int]:
        """The text of `plan` in as few tokens as greedy longest match finds, each one the
        grammar takes there (the same bytes: the same way out); `plan` where that fails."""
        text = b"".join(self.vocab[t] for t in plan)
        probe, out, at = matcher.fork(), [], 0
        while at < len(text):
            for n in range(min(self.longest, len(text) - at), 0, -1):
                t = self.by_bytes.get(text[at : at + n])
                if t is not None and probe.accept_token(t):
                    out.append(t)
                    at += n
                    break
            else:
                return plan
        return out if len(out) < len(plan) and probe.is_completed() else plan

    def _shortest_start(
        self, matcher: xgr.GrammarMatcher, plan: list[int] | None, limit: int
    ) -> list[int] | None:
        """Where the output can go a few ways from here (`MAX_STARTS` closing characters at
        most: `<` to a tool call or `{` to an answer in its format, `,` or `}` after a value),
        the shortest of the ways out that start with each. The greedy order alone took the
        first (a whole tool call where a short JSON answer would have fitted the budget)."""
        if plan is not None and not plan:
            return plan
        starts = self._among(self._allowed(matcher).clone().numpy(), self.tokens)
        if not 1 < len(starts) <= MAX_STARTS:
            return plan
        for t in starts:
            if plan is not None and t == plan[0]:
                continue
            probe = matcher.fork()
            if not probe.accept_token(t):
                continue
            rest, _ = self._walk(probe, (len(plan) - 2) if plan is not None else limit - 1,
                                 frozenset())  # fmt: skip
            if rest is not None:
                plan = [t, *rest]
        return plan

    def _walk(self, matcher: xgr.GrammarMatcher, limit: int, avoid: frozenset):
        """(the way out or None, how often each step (place, token) was taken); None as soon
        as one place is visited more than `CIRCLE` times since the walk last reached a place
        it had not seen. Places are told apart by their bitmasks."""
        probe = matcher.fork()
        plan: list[int] = []
        visits: dict[bytes, tuple[int, int]] = {}  # place -> (new places before, visits)
        since = 0  # new places seen so far
        steps: dict[tuple[bytes, int], int] = {}
        while len(plan) <= limit:
            if probe.is_completed():
                return plan, steps
            before = self._allowed(probe).clone()
            place = before.numpy().tobytes()
            if place not in visits:
                since += 1  # a new place: progress; circles are counted from here
            seen_since, n = visits.get(place, (since, 0))
            n = n + 1 if seen_since == since else 1
            visits[place] = (since, n)
            if n > CIRCLE:
                return None, steps
            t = self._forced(probe, before)
            if t is not None:
                plan.append(t)
                continue
            t = self._choose(probe, before, {t for p, t in avoid if p == place})
            if t is None:
                return None, steps
            steps[place, t] = steps.get((place, t), 0) + 1
            plan.append(t)
        return None, steps

    def _forced(self, probe: xgr.GrammarMatcher, before: torch.Tensor) -> int | None:
        """Where the grammar forces text (every allowed token is a piece of the longest one:
        a key, a constant, a tag), accept and return that longest token; else None.

        Step by step rather than xgrammar's `find_jump_forward_tokens`, which builds the whole
        forced text first: where it never ends (`root ::= "a" root`, a schema whose required
        property refers back to it) it allocates until the process dies."""
        words = before.numpy()
        if np.count_nonzero(words) > FORCED_WORDS:
            return None
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        ids = np.flatnonzero(bits[: len(self.vocab)])
        if not len(ids) or len(ids) > FORCED_TOKENS:
            return None
        pieces = [self.vocab[i] for i in ids]
        k = max(range(len(ids)), key=lambda j: len(pieces[j]))
        if not pieces[k] or not all(pieces[k].startswith(p) for p in pieces):
            return None
        t = int(ids[k])
        return t if probe.accept_token(t) else None

    def _choose(self, probe: xgr.GrammarMatcher, before: torch.Tensor, avoid: set[int]):
        """Accept and return the next token of the way out: one that completes the output if
        any does; else the first (in `CLOSING_CHARS` order, not in `avoid`) that leaves the
        grammar somewhere new (not another letter of the same string or digit of the same
        number), else the first allowed. Which candidates are allowed is read off one bitmask
        (`before`, this place's)."""
        words = before.numpy()
        for t in self._among(words, self.finishers):
            probe.accept_token(t)
            if probe.is_completed():
                return t
            probe.rollback(1)
        accepted = self._among(words, self.tokens)
        if not len(accepted):  # e.g. inside a multi-byte character: the lowest token allowed
            t = _first_set(words)
            return t if t is not None and probe.accept_token(t) else None
        for t in accepted:
            if t in avoid:
                continue
            probe.accept_token(t)
            if not torch.equal(self._allowed(probe), before):
                return t
            probe.rollback(1)
        probe.accept_token(int(accepted[0]))
        return int(accepted[0])

    @staticmethod
    def _among(words: np.ndarray, tokens: np.ndarray) -> list[int]:
        """The `tokens` a bitmask (int32 words) allows, in their order."""
        return tokens[(words[tokens >> 5] >> (tokens & 31)) & 1 == 1].tolist()

    def _allowed(self, matcher: xgr.GrammarMatcher) -> torch.Tensor:
        if self._mask is None:
            self._mask = xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(self._mask)
        return self._mask[0]


def _first_set(words: np.ndarray) -> int | None:
    """The lowest token a bitmask allows."""
    nz = np.flatnonzero(words)
    if not len(nz):
        return None
    w = int(nz[0])
    bits = int(words[w]) & 0xFFFFFFFF
    return w * 32 + ((bits & -bits).bit_length() - 1)


class GrammarState:
    """A request's matcher, its progress through the output tokens and its way out."""

    __slots__ = ("accepted", "base", "broken", "check_at", "compiled", "matcher", "need", "plan",
                 "printable")  # fmt: skip

    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self.compiled = compiled
        self.matcher = xgr.GrammarMatcher(compiled)
        self.accepted = 0  # output tokens the matcher has consumed
        self.check_at = 0  # look for the way out once this few tokens are left (0: at once)
        self.plan: list[int] | None = None  # forced tokens left, once the budget is tight
        self.broken = False  # a token the grammar refused (a bug): only EOS is allowed
        self.base: int | None = None  # the first way out's length (sizes the margins)
        self.need: int | None = None  # the latest way out's length (+ EOS)
        self.printable = False  # compact JSON: tokens with bytes below 0x20 are never allowed

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

    def steer(self, closer: Closer, left: int) -> tuple[int | None, bool]:
        """(the only token allowed now, or None; whether to close where few tokens are allowed)
        for a budget of `left` tokens, this one included: the next planned token, EOS after
        it, once the way out needs all but the hard margin; soft steering within the soft one."""
        if self.plan is None and (self.check_at == 0 or left <= self.check_at):
            self._look(closer, left)
        if self.plan is not None:
            return (self.plan[0] if self.plan else closer.stop), False
        soft = self.need is not None and left <= self.need + _clamp(2 * self.base, SOFT_MARGIN)
        return None, soft

    def _look(self, closer: Closer, left: int) -> None:
        if self.matcher.is_terminated():
            self.check_at = -1
            return
        plan = closer.plan(self.matcher, min(left, MAX_PLAN))
        if plan is None:
            if self.base is None:  # none fits the whole budget: one more look near its end
                self.check_at = LATE_LOOK if left > LATE_LOOK else -1
            else:  # none fits what is left (yet): look again a little later
                self.check_at = max(left - min(RETRY_EVERY, max(left // 4, 1)), 1)
            return
        self.need = need = len(plan) + 1  # + EOS
        if self.base is None:  # the first way out: from (near) the start of the output
            self.base = need
        hard = _clamp(self.base // 2, HARD_MARGIN)
        if need + hard + LATE >= left:
            self.plan = plan
            return
        # look again when half the slack is spent
        self.check_at = max(left - (left - need - hard) // 2, need + hard + LATE)

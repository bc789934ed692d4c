"""`Drafter`: speculative decoding's engine side. Once a step, before the schedule, it leaves
drafts on the running requests about to decode (`propose`); once a result with drafts, it
settles them (`settle`): the rejected positions to compute again, the proposer's acceptance
averages, the counters (`stats.SpecDecodeStats`) and their log line. The engine calls these two
and nothing else of it (docs/runtime.md, "Speculative decoding").

The drafts come from the n-gram proposer (`spec/ngram.py`), or with a draft model from the
model runner: it drafts after each step (`spec/draft_model.py`) and hands them back in the
step's output, which `settle` holds per request for its next decode (`HeldDrafts`)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np
from pagoda.runtime.spec.config import SpeculativeConfig
from pagoda.runtime.spec.ngram import NgramProposer, takes_drafts
from pagoda.runtime.spec.stats import SpecDecodeStats

if TYPE_CHECKING:
    from pagoda.runtime.request import Request
    from pagoda.runtime.worker.outputs import ModelRunnerOutput

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0  # the acceptance log line, at most this often


class Drafter:
    def __init__(self, spec: SpeculativeConfig) -> None:
        k = spec.num_speculative_tokens
        self.proposer: NgramProposer | HeldDrafts
        if spec.draft_model is not None:
            self.proposer = HeldDrafts(k)
        else:
            self.proposer = NgramProposer(k, spec.prompt_lookup_min, spec.prompt_lookup_max,
                                          spec.adaptive)  # fmt: skip
        self.stats = SpecDecodeStats.empty(k)
        self._logged = time.monotonic()

    @staticmethod
    def takes_drafts(req: Request) -> bool:
        return takes_drafts(req)

    def propose(self, running: list[Request]) -> None:
        """Drafts for the running requests about to decode that take them, left on
        `Request.spec_token_ids` for the scheduler; at most what the request may still generate
        after the step's own token."""
        reqs, decodes = [], 0
        for req in running:
            if req.spec_token_ids:
                req.spec_token_ids = []
            if len(req.token_ids) - req.num_computed_tokens == 1:
                decodes += 1
                if req.takes_drafts:
                    reqs.append(req)
        proposer = self.proposer
        if proposer.num_buffers > 2 * len(running) + 16:
            proposer.retain(running)
        if not reqs:
            return
        limits = np.fromiter((r.max_new_tokens - r.num_output_tokens - 1 for r in reqs),
                             np.int64, len(reqs))  # fmt: skip
        drafts, counts = proposer.propose(reqs, [r.token_ids for r in reqs], limits, decodes)
        for req, row, c in zip(reqs, drafts.tolist(), counts.tolist()):
            if c > 0:
                req.spec_token_ids = row[:c]

    def settle(self, result: ModelRunnerOutput, dropped: list[int]) -> None:
        """After a step with drafts: the rejected drafts' positions computed again later (their
        cache rows are overwritten then), the counters, the entries of `dropped` (of requests
        an earlier token of the same step ended) taken out of `result`. A draft model's drafts
        in `result` are held for the requests' next decodes."""
        if result.drafts is not None:
            self.proposer.hold(*result.drafts)
        spec = result.spec
        if spec is None:
            return
        for req, d, a in zip(spec.requests, spec.drafted, spec.accepted):
            if req.is_running:  # (finished, or preempted with the step in flight: none)
                req.num_computed_tokens -= d - a
        self.proposer.observe(spec.requests, spec.drafted, spec.accepted)
        stats = self.stats
        stats.add(spec.drafted, spec.accepted)
        now = time.monotonic()
        if now - self._logged >= LOG_INTERVAL_S:
            self._logged = now
            log.info("speculative decoding: %d of %d draft tokens accepted (%.1f%%), %.2f tokens "
                     "per drafted step", stats.num_accepted_tokens, stats.num_draft_tokens,
                     100 * (stats.acceptance_rate or 0.0), stats.mean_acceptance_length or 1.0)  # fmt: skip
        if dropped:
            gone = set(dropped)
            keep = [i for i in range(len(result.requests)) if i not in gone]
            result.requests = [result.requests[i] for i in keep]
            result.token_ids = [result.token_ids[i] for i in keep]
            result.logprobs = [result.logprobs[i] for i in keep]
            result.positions = [result.positions[i] for i in keep]


class HeldDrafts:
    """The draft model's drafts (`ModelRunnerOutput.drafts`), held per request until its next
    decode: used there if the request still has the tokens they were drafted after (the same
    count), cut to what it may still generate. The proposer interface `Drafter` calls."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._held: dict[Request, tuple[int, np.ndarray]] = {}

    @property
    def num_buffers(self) -> int:
        return len(self._held)

    def retain(self, keys) -> None:
        live = set(keys)
        for r in [r for r in self._held if r not in live]:
            del self._held[r]

    def hold(self, reqs: list[Request], drafts: np.ndarray) -> None:
        """A step's drafts, after its tokens were folded into `reqs`."""
        for req, row in zip(reqs, drafts):
            self._held[req] = (len(req.token_ids), row)

    def propose(self, keys, token_lists, limits: np.ndarray, batch: int | None = None):
        """([B, k] drafts, [B] counts) as `NgramProposer.propose` gives them."""
        b = len(keys)
        drafts = np.zeros((b, self.k), dtype=np.int64)
        counts = np.zeros(b, dtype=np.int64)
        for i, (key, tokens) in enumerate(zip(keys, token_lists)):
            held = self._held.pop(key, None)
            if held is not None and held[0] == len(tokens):
                drafts[i] = held[1]
                counts[i] = self.k
        return drafts, np.minimum(counts, limits)

    def observe(self, keys, drafted, accepted) -> None:
        """(The acceptance averages are n-gram's adaptive drafting: none here.)"""

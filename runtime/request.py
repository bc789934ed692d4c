"""A request as the engine tracks it: tokens, progress through the KV cache, and its outcome.

One rule drives scheduling: `num_computed_tokens` catches up with `num_tokens`. A prefill is
simply a request far behind; a decode is one token behind; a prefix-cache hit jumps ahead.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from pagoda.runtime.sampling.params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6  # the model gave no token: its logits held no finite maximum

    @property
    def finished(self) -> bool:
        return self >= FIRST_FINISHED

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS[self]


FINISH_REASONS = (None, None, None, "stop", "length", "abort", "error")
# Module-level aliases for the per-request loops of a step: reading a member off an Enum class
# costs ~0.1 us (Python 3.11), a global ~0.02 us; at 256 requests that adds up per step.
FIRST_FINISHED = RequestStatus.FINISHED_STOPPED
RUNNING = RequestStatus.RUNNING


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob) alternatives, best first
    # its place in the row by value, ties by index (vLLM's rank, 1 = the best)
    rank: int | None = None


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    # Blocks of this request share hashes only with requests of the same salt; None = global cache.
    cache_salt: bytes | None = None
    eos_token_ids: tuple[int, ...] = ()
    max_model_len: int = 1 << 30
    # `params.bad_words` as token-id sequences (`sampling.bad_words`), tokenized on receipt
    bad_words: tuple[tuple[int, ...], ...] = ()
    # A sequence of a request of several (prompts x n, engine/admission.py): the scheduler
    # preempts these first and admits single-sequence requests before them
    bulk: bool = False

    def __post_init__(self) -> None:
        self.token_ids: list[int] = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.num_computed_tokens = 0
        # Async scheduling: tokens sampled on the device but not read back yet (0 or 1 when a
        # step is scheduled); the scheduler counts them as known so the next step can run them.
        self.num_pending = 0
        # Speculative decoding: this step's draft tokens after the last known one (set by the
        # engine's proposer before scheduling; the scheduler trims them to what it schedules)
        self.spec_token_ids: list[int] = []
        self.takes_drafts = False  # whether it may (`spec.ngram.takes_drafts`; set by the engine)
        self.num_cached_tokens = 0  # prefix-cache hit at first scheduling
        self.status = RequestStatus.WAITING
        self.block_hashes: list[bytes] = []  # chained hashes of this request's full blocks
        self.logprobs: list[TokenLogprob] = []
        # `params.prompt_logprobs`: the entries of prompt tokens 1.. (read back so far), and
        # the next position whose logits score the token after it (prompt_logprobs.py)
        self.prompt_logprobs: list[TokenLogprob] = []
        last = max(self.num_prompt_tokens - 1, 0)
        self.prompt_logprobs_next = 0 if self.params.prompt_logprobs is not None else last
        self.stop_reason: str | int | None = None
        self.num_preemptions = 0
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.generator = None  # torch.Generator for seeded sampling, made by the model runner
        self.seen_tokens = None  # penalties.SeenTokens, made by the sampler for penalties
        self.grammar = None  # structured.matcher.GrammarState, made when a constrained row samples
        # a vision model's image features by image index, from the step that first reaches an
        # image's placeholders until one consumes them (`worker/mm_encoder.py`), and the end of
        # the last image's placeholders (0: no image)
        self.image_features: dict | None = None
        mm = self.params.multi_modal
        self.images_end = mm.images[-1].end if mm is not None and mm.images else 0
        stops = set(self.params.stop_token_ids)
        if not self.params.ignore_eos:
            stops.update(self.eos_token_ids)
        self.stop_ids = frozenset(stops)
        self.stop_ids_in_vocab = None  # a tensor of them, made by LogitBias.build (min_tokens)
        budget = self.max_model_len - self.num_prompt_tokens
        self.max_new_tokens = min(self.params.max_tokens or budget, budget)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Whether some prompt position's logits are still to be scored (never for a request
        that did not ask): such a request computes its whole prompt, no prefix-cache hit."""
        return self.prompt_logprobs_next < self.num_prompt_tokens - 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def ends_with_pending(self) -> bool:
        """True when the tokens in flight already reach the length limit: scheduling this
        request again could only compute a token that is never used (async scheduling)."""
        return self.num_output_tokens + self.num_pending >= self.max_new_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status >= FIRST_FINISHED

    @property
    def is_running(self) -> bool:
        """Scheduled (not waiting, preempted or finished): it holds its blocks."""
        return self.status == RUNNING

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def check_stop_token(self) -> bool:
        """After appending: stop on a stop/EOS token or on the length limit."""
        ids = self.token_ids
        last, num_output = ids[-1], len(ids) - self.num_prompt_tokens
        if last in self.stop_ids and num_output > 0:
            self.status = RequestStatus.FINISHED_STOPPED
            self.stop_reason = last if last in self.params.stop_token_ids else None
            return True
        if num_output >= self.max_new_tokens:
            self.status = RequestStatus.FINISHED_LENGTH
            return True
        return False

"""EngineInfo: what the serving layer may know about a loaded engine, frozen at load time.

Why: the engine thread owns `EngineCore`; everything else reads this immutable snapshot instead
(safe from any thread, including the tokenizer pool), and validates requests against it in one
place before they are queued.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pagoda.runtime.sampling.bans import bans_may_empty, check_bans_leave_tokens
from pagoda.runtime.sampling.params import ParamError, SamplingParams


@dataclass(frozen=True)
class EngineInfo:
    model_name: str
    max_model_len: int  # prompt + generated tokens of one sequence
    vocab_size: int  # valid token ids are [0, vocab_size)
    tokenizer: Any  # runtime.model.tokenizer.Tokenizer (thread-safe for encode/decode)
    max_token_bytes: int = 64  # longest vocabulary entry in UTF-8 bytes: text per token bound
    # the model's generation_config.json sampling fields: defaults for what a request leaves out
    sampling_defaults: Mapping[str, float | int] = field(default_factory=dict)
    # an LM head pruned to ids [0, head_rows) (Apertus 1.5): the others are never generated
    head_rows: int = 0
    # "generate", or "pooling" (an embedding model: /v1/embeddings) with its `PoolerConfig`
    runner: str = "generate"
    pooler: Any = None
    hidden_size: int = 0
    # a vision model's image side (`multimodal.config.VisionConfig`; None: text only) and the
    # images a prompt may hold (--limit-mm-per-prompt)
    vision: Any = None
    image_limit: int = 0
    video_limit: int = 0
    # how a chat request's videos are sampled (--media-io-kwargs: `chat_videos.VideoIO`)
    video_io: Any = None

    @classmethod
    def from_core(cls, core: Any) -> EngineInfo:
        """Snapshot of a constructed EngineCore (called on the engine thread)."""
        return cls(
            model_name=core.model_name,
            max_model_len=core.max_model_len,
            vocab_size=core.model_config.vocab_size,
            tokenizer=core.tokenizer,
            max_token_bytes=_max_token_bytes(core.tokenizer, core.model_config.vocab_size),
            sampling_defaults=dict(getattr(core, "sampling_defaults", {})),
            head_rows=core.model_config.family.head_rows,
            runner=getattr(getattr(core, "config", None), "runner", "generate"),
            pooler=getattr(getattr(core, "config", None), "pooler_config", None),
            hidden_size=getattr(core.model_config, "hidden_size", 0),
            vision=getattr(core.model_config, "vision", None),
            image_limit=_image_limit(core),
            video_limit=_image_limit(core, "video"),
            video_io=getattr(getattr(core, "config", None), "media_io_kwargs", None),
        )

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise ParamError (field `prompt` or `max_tokens`) for a request that cannot run.

        Like vLLM: a prompt must leave room for one token (a pooling runner's may fill the
        context: `longest_prompt`), and an explicit `max_tokens` must fit in the context with
        the prompt (no silent capping); None means "whatever fits".
        """
        n = len(prompt_token_ids)
        if n == 0:
            raise ParamError("prompt", "prompt must not be empty")
        if n > longest_prompt(self.max_model_len, self.runner):
            raise ParamError("prompt", too_long(n, self.max_model_len, self.runner))
        vocab = self.vocab_size
        if not token_ids_in_range(prompt_token_ids, vocab):
            raise ParamError("prompt", f"prompt token ids must be integers in [0, {vocab})")
        if params.logit_bias and params.logit_bias[-1][0] >= vocab:  # sorted by id
            raise ParamError("logit_bias", f"logit_bias token id {params.logit_bias[-1][0]} is "
                             f"not in this model's vocabulary [0, {vocab})")  # fmt: skip
        if params.allowed_token_ids is not None and max(params.allowed_token_ids) >= vocab:
            raise ParamError("allowed_token_ids", f"allowed_token_ids holds token id "
                             f"{max(params.allowed_token_ids)}, not in this model's vocabulary "
                             f"[0, {vocab})")  # fmt: skip
        if not_generated(params.allowed_token_ids, self.head_rows):
            raise ParamError("allowed_token_ids", f"allowed_token_ids holds no id this model "
                             f"generates: its LM head scores [0, {self.head_rows})")  # fmt: skip
        if params.stop_token_ids and max(params.stop_token_ids) >= vocab:  # it could never stop
            raise ParamError("stop_token_ids", f"stop_token_ids holds token id "
                             f"{max(params.stop_token_ids)}, not in this model's vocabulary "
                             f"[0, {vocab})")  # fmt: skip
        if bans_may_empty(params):  # the bans the params decide alone (bad words: the server's)
            check_bans_leave_tokens(params, self.tokenizer.eos_token_ids, vocab, ())
        pooled = self.runner == "pooling"  # (its one "token" is never generated)
        if (
            not pooled
            and params.max_tokens is not None
            and n + params.max_tokens > self.max_model_len
        ):
            raise ParamError(
                "max_tokens",
                f"max_tokens is too large: this model's maximum context length is "
                f"{self.max_model_len} tokens and the prompt has {n}, so at most "
                f"{self.max_model_len - n} tokens can be generated, not {params.max_tokens}",
            )


def longest_prompt(max_model_len: int, runner: str) -> int:
    """The most prompt tokens a request may have: a generating runner's leave room for one
    generated token (vLLM's rule); a pooling runner's generate nothing, so an encoder's prompt
    may be its whole context (BERT's 512 of its 512 positions), as vLLM's are."""
    return max_model_len if runner == "pooling" else max_model_len - 1


def too_long(n: int, max_model_len: int, runner: str) -> str:
    """The refusal of a prompt of `n` tokens past `longest_prompt` (one line)."""
    room = "" if runner == "pooling" else ", including at least one generated token"
    return (f"prompt is {n} tokens; this model's maximum context length is {max_model_len} "
            f"tokens (max_model_len){room}")  # fmt: skip


def not_generated(allowed: Sequence[int] | None, head_rows: int) -> bool:
    """Whether `allowed_token_ids` names only ids past a pruned LM head's `head_rows` (0: not
    pruned), whose logits are -inf (`Apertus1p5Model`). The sampler would still draw one of
    them (`allowed_tokens.keep_allowed`: all alike), but never one the model scores: every
    token of such a request is a guess, so it is refused up front (400) instead."""
    return bool(head_rows and allowed) and min(allowed) >= head_rows


def token_ids_in_range(ids: Sequence[int], vocab: int) -> bool:
    """Whether every id is an int (not a bool) in [0, vocab). Plain ints (a tokenizer's, JSON's)
    take two passes in C (min, max): half the time of a Python test per id (a prompt of 300
    ids: ~50 against ~100 us on a busy 2-core Xeon)."""
    if set(map(type, ids)) <= _PLAIN_INT:
        return not ids or (min(ids) >= 0 and max(ids) < vocab)
    return not any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab
                   for t in ids)  # fmt: skip


_PLAIN_INT = frozenset((int,))


def _max_token_bytes(tokenizer: Any, vocab_size: int) -> int:
    """Longest vocabulary string in UTF-8 bytes (~30 ms for a 50k vocabulary, once at load).

    Byte-level BPE writes each byte as one character and SentencePiece each character as
    itself, so a token never stands for more bytes of text than its string has.
    """
    longest = 1
    for i in range(getattr(tokenizer, "vocab_size", vocab_size)):
        s = tokenizer.token_to_str(i)
        if s:
            longest = max(longest, len(s.encode("utf-8", "surrogatepass")))
    return longest


def _image_limit(core: Any, modality: str = "image") -> int:
    """--limit-mm-per-prompt's image (video) count of a vision model's engine (0: text only)."""
    limits = getattr(getattr(core, "config", None), "limit_mm_per_prompt", None)
    return limits.get(modality, 0) if limits is not None else 0

"""`SpeculativeConfig`: vLLM's ``--speculative-config`` JSON (and `LLM(speculative_config=...)`),
frozen and validated once. Two methods: n-gram (prompt-lookup) drafts (`spec/ngram.py`) and a
smaller draft model's greedy drafts (`spec/draft_model.py`; vLLM's "draft_model", also chosen by
a ``model`` given without a ``method``, as vLLM does).

Standard library only: `options` parses the flag's JSON with it, and the operator imports
`options` without torch. The flag's text is read by `option_rules.json_object` first, as the
other JSON flags' (`option_rules.parse_speculative`: `spec` imports nothing of the folder above).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

DRAFT_MODEL = "draft_model"
METHODS = ("ngram", DRAFT_MODEL)  # vLLM's names (the operator's `ngram` / `draftModel`)
MAX_SPECULATIVE_TOKENS = 32  # drafts a step per sequence, at most
MAX_PROMPT_LOOKUP = 64  # the longest n-gram matched
DEFAULT_PROMPT_LOOKUP = 5  # vLLM's, when neither bound is given
EXAMPLE = '{"method": "ngram", "num_speculative_tokens": 4}'  # (in the errors)


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's keys: ``method``, ``num_speculative_tokens`` (drafts per step per sequence),
    ``prompt_lookup_max`` / ``prompt_lookup_min`` (the longest and shortest n-gram of a
    sequence's tail searched for earlier in it; one given, the other is the same; neither: 5).
    Pagoda's own ``adaptive`` (default true): each sequence drafts fewer tokens, down to none for
    a while, when its recent drafts are mostly rejected (`spec/ngram.py`); false: always up to
    ``num_speculative_tokens``. The prompt-lookup keys and ``adaptive`` are n-gram's only.

    ``method: "draft_model"`` with ``model`` (a checkpoint path, as ``--model`` takes): that
    model, run beside the target on its device, drafts greedily (`spec/draft_model.py`); a
    ``model`` without a ``method`` means it too. Its checks against the target (vocabulary,
    family, the flags it is refused beside) run when the engine starts (`check_draft`)."""

    num_speculative_tokens: int
    method: str | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    adaptive: bool | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        method = self.method
        if method is None:
            method = "ngram" if self.model is None else DRAFT_MODEL
            object.__setattr__(self, "method", method)
        if method not in METHODS:
            raise ValueError(
                f"speculative_config: method {method!r} is not supported; Pagoda drafts "
                f"with {', '.join(METHODS)} only"
            )
        _int("num_speculative_tokens", self.num_speculative_tokens, MAX_SPECULATIVE_TOKENS)
        if method == DRAFT_MODEL:
            self._check_draft_model()
            return
        if self.model is not None:
            raise ValueError(f"speculative_config: method {method!r} takes no model (a draft "
                             f'model is method "{DRAFT_MODEL}")')  # fmt: skip
        if self.adaptive is None:
            object.__setattr__(self, "adaptive", True)
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"speculative_config: adaptive must be true or false, got "
                             f"{self.adaptive!r}")  # fmt: skip
        hi, lo = self.prompt_lookup_max, self.prompt_lookup_min
        hi = lo if hi is None else hi
        lo = hi if lo is None else lo
        hi = DEFAULT_PROMPT_LOOKUP if hi is None else hi
        lo = DEFAULT_PROMPT_LOOKUP if lo is None else lo
        _int("prompt_lookup_max", hi, MAX_PROMPT_LOOKUP)
        _int("prompt_lookup_min", lo, MAX_PROMPT_LOOKUP)
        if lo > hi:
            raise ValueError(
                f"speculative_config: prompt_lookup_min ({lo}) is more than prompt_lookup_max "
                f"({hi})"
            )
        object.__setattr__(self, "prompt_lookup_max", hi)
        object.__setattr__(self, "prompt_lookup_min", lo)

    def _check_draft_model(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f'speculative_config: method "{DRAFT_MODEL}" needs "model", the '
                             "draft checkpoint's path")  # fmt: skip
        keys = ("prompt_lookup_max", "prompt_lookup_min")
        asked = [k for k in keys if getattr(self, k) is not None]
        if self.adaptive not in (None, False):
            asked.append("adaptive")
        if asked:
            raise ValueError(f"speculative_config: {', '.join(asked)}: n-gram drafting's "
                             f'key(s), not for method "{DRAFT_MODEL}"')  # fmt: skip
        object.__setattr__(self, "adaptive", False)

    @property
    def draft_model(self) -> str | None:
        """The draft checkpoint of method "draft_model"; None for n-gram drafts."""
        return self.model if self.method == DRAFT_MODEL else None

    @classmethod
    def parse(cls, value: Any) -> SpeculativeConfig | None:
        """A config from a mapping (the flag's JSON object, read by `option_rules.parse_speculative`;
        `LLM(speculative_config={...})`) or itself; None stays None. ValueError, one line, for
        anything else or unknown keys."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"speculative_config must be a JSON object, e.g. {EXAMPLE}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown key(s) {', '.join(unknown)} (known: "
                f"{', '.join(sorted(known))})"
            )
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config: num_speculative_tokens is required")
        return cls(**value)

    def to_json(self) -> str:
        items = ((f.name, getattr(self, f.name)) for f in fields(self))
        return json.dumps({k: v for k, v in items if v is not None})


def _int(name: str, value: Any, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ValueError(f"speculative_config: {name} must be an integer in [1, {high}], "
                         f"got {value!r}")  # fmt: skip

"""The bans a request's parameters decide alone, checked before it is queued: whether they leave
any token to draw (`allowed_token_ids` against `bad_words` and the stop tokens `min_tokens`
holds back). A row with no finite logit would draw token 0, one it banned.

Apart from `allowed_tokens.py` (the mask, torch) because the API process checks these without
torch (`EngineInfo.validate`, the server's bad-words check).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagoda.runtime.sampling.bad_words import BadWords
from pagoda.runtime.sampling.params import ParamError


def check_bans_leave_tokens(
    params: Any, eos_token_ids: Sequence[int], vocab_size: int, bad_words: BadWords
) -> None:
    """ParamError when the bans that always hold leave no token to draw, where a row with no
    finite logit would draw token 0, one of the tokens it banned:
    - `allowed_token_ids` (unless a grammar's tokens win): every listed token is a one-token
      `bad_words` entry, or with `min_tokens` a stop token (EOS unless `ignore_eos`,
      `stop_token_ids`);
    - otherwise `stop_token_ids` (with EOS) under `min_tokens` covering the whole vocabulary (one
      length test for the usual request; a set only when the ids could cover it)."""
    allowed = params.allowed_token_ids
    if allowed is not None:
        if params.structured_outputs is not None:
            return
        left = set(allowed).difference(ids[0] for ids in bad_words if len(ids) == 1)
        if not left:
            raise ParamError("allowed_token_ids", "allowed_token_ids: every allowed token is "
                             "one of bad_words, so no token could be generated")  # fmt: skip
        if params.min_tokens:
            left.difference_update(params.stop_token_ids)
            if not params.ignore_eos:
                left.difference_update(eos_token_ids)
            if not left:
                raise ParamError("allowed_token_ids", "allowed_token_ids: every allowed token is "
                                 "a stop token (EOS or stop_token_ids), which min_tokens keeps "
                                 "out of the first tokens, so none could be generated")  # fmt: skip
        return
    if not params.min_tokens:
        return
    eos = () if params.ignore_eos else eos_token_ids
    if len(params.stop_token_ids) + len(eos) < vocab_size:
        return
    if len(set(params.stop_token_ids).union(eos)) >= vocab_size:  # ids are in [0, vocab_size)
        raise ParamError("stop_token_ids", f"stop_token_ids{'' if params.ignore_eos else ' with EOS'} "
                         f"cover the whole vocabulary ({vocab_size} tokens), which min_tokens "
                         "keeps out of the first tokens, so none could be generated")  # fmt: skip


def bans_may_empty(params: Any) -> bool:
    """Whether `check_bans_leave_tokens` has anything to check (else it need not be called)."""
    return params.allowed_token_ids is not None or bool(params.min_tokens)

"""The special tokens a Hugging Face checkpoint names in tokenizer_config.json, beside the ids
of config.json and generation_config.json.

Stops: as vLLM stops a request (the tokenizer's `eos_token_id` and generation_config.json's
`eos_token_id` list) and as transformers' config names them (config.json's `eos_token_id`),
their union: a checkpoint whose end-of-turn token appears only in tokenizer_config.json's
`eos_token` (or only in generation_config.json) still stops at it.

Chat templates: transformers' `apply_chat_template` renders `{{ bos_token }}` and
`{{ eos_token }}` as tokenizer_config.json's strings (a string, or an AddedToken object with
its `content`; null renders nothing), not as the text of config.json's ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

NAMES = ("bos_token", "eos_token")


def token_text(value: Any) -> str | None:
    """A tokenizer_config.json special-token value as text: a string, or an AddedToken
    object's `content`; None for null (or anything else)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def template_tokens(tcfg: Mapping[str, Any]) -> dict[str, str]:
    """`bos_token` / `eos_token` as a chat template reads them, for the names
    tokenizer_config.json sets (null: "", as transformers renders an unset token)."""
    return {name: token_text(tcfg[name]) or "" for name in NAMES if name in tcfg}


def stop_ids(
    *id_lists: Iterable[int], tokenizer: HFTokenizer, tcfg: Mapping[str, Any]
) -> tuple[int, ...]:
    """The union, in order and without repeats, of `id_lists` and the id of
    tokenizer_config.json's `eos_token` (when the vocabulary has it)."""
    ids = [int(i) for ids in id_lists for i in ids]
    eos = token_text(tcfg.get("eos_token"))
    eos_id = tokenizer.token_to_id(eos) if eos else None
    if eos_id is not None:
        ids.append(eos_id)
    return tuple(dict.fromkeys(ids))

"""Log-probabilities in OpenAI's two shapes (legacy completions and chat), with token strings.

A byte-level BPE token can be half a UTF-8 character, so the chat shape also carries the token's
raw `bytes`, recovered from the GPT-2 byte↔unicode table rather than from its decoded text (for
a byte-level tokenizer only; a SentencePiece byte-fallback token ``<0xF0>`` is its one byte). A
token's text is what it adds after other text (SentencePiece's "▁ok" is " ok", though decoding it
alone strips the space), so the tokens join into the output's text and `text_offset` follows it. The
legacy shape has no bytes and keys alternatives by token text, where every such fragment would
read "\ufffd" (and the sampled token's logprob be overwritten by an alternative's): there a
fragment is named by its bytes, as OpenAI does (`bytes:\\xf0\\x9f`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from pagoda.runtime.model.byte_stream import _char_bytes, is_plain_byte_level
from pagoda.runtime.model.tokenizer import Tokenizer
from pagoda.runtime.request import TokenLogprob


def _finite(logprob: float) -> float:
    """A logprob as JSON can carry it: tokens a grammar ruled out have -inf (shown as -9999, as
    vLLM does), a forced token's 0 may round a hair above it, and NaN (a row with nothing
    allowed) is shown as impossible."""
    if logprob != logprob:  # NaN: JSON has no such number
        return -9999.0
    return min(max(logprob, -9999.0), 0.0)


class TokenStrings:
    """Cached id → text / bytes for one tokenizer (the vocabulary is small and fixed)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}
        self._key: dict[int, str] = {}

    @cached_property
    def _byte_level(self) -> bool:
        return is_plain_byte_level(self.tokenizer.backend)

    @cached_property
    def _anchor(self) -> tuple[list[int], int]:
        """A token that decodes to plain text, and its length: each token's text is read after
        it (without a decoder, `tokenizers` joins tokens with spaces, which are no token's
        text). Built on the first logprobs asked, not for every server."""
        tok = self.tokenizer
        ids = tok.encode("a", add_special_tokens=False)
        anchor = ids[-1:] if ids and tok.backend.decoder is not None else []
        return anchor, len(tok.decode(anchor, skip_special_tokens=False))

    def text(self, token_id: int) -> str:
        """The text the token adds after other text (not at the start, where SentencePiece
        decoders strip its leading space)."""
        s = self._text.get(token_id)
        if s is None:
            anchor, skip = self._anchor
            s = self.tokenizer.decode([*anchor, token_id], skip_special_tokens=False)
            s = self._text[token_id] = s[skip:]
        return s

    def bytes(self, token_id: int) -> list[int]:
        b = self._bytes.get(token_id)
        if b is None:
            raw = self.tokenizer.token_to_str(token_id) or ""
            table = _char_bytes()  # GPT-2's printable stand-in character → byte
            if self._byte_level and raw and all(ch in table for ch in raw):
                b = [table[ch] for ch in raw]
            elif (byte := self.tokenizer.fallback_byte(token_id)) is not None:
                b = [byte]  # SentencePiece's <0xF0>
            else:
                b = list(self.text(token_id).encode())
            self._bytes[token_id] = b
        return b

    def key(self, token_id: int) -> str:
        """The token's text, or `bytes:\\x..` for part of a UTF-8 character (legacy shape)."""
        k = self._key.get(token_id)
        if k is None:
            raw = bytes(self.bytes(token_id))
            try:
                raw.decode("utf-8")
                k = self.text(token_id)
            except UnicodeDecodeError:
                k = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self._key[token_id] = k
        return k

    def chat(self, lps: list[TokenLogprob]) -> list[dict[str, Any]]:
        """Chat shape: one entry per token with its `top_logprobs` alternatives."""
        return [
            {
                "token": self.text(lp.token_id),
                "logprob": _finite(lp.logprob),
                "bytes": self.bytes(lp.token_id),
                "top_logprobs": [
                    {"token": self.text(t), "logprob": _finite(v), "bytes": self.bytes(t)}
                    for t, v in lp.top
                ],
            }
            for lp in lps
        ]

    def completion(
        self, lps: list[TokenLogprob], offset: int, echoed: Echoed | None = None
    ) -> dict[str, Any]:
        """Legacy shape; `top_logprobs` holds the alternatives plus the chosen token;
        `text_offset` advances by each token's decoded text. `echoed`: the prompt's tokens
        first (echo), scored by their prompt logprobs, the first one (which has none) with
        null `token_logprobs` and `top_logprobs` entries, as OpenAI and vLLM give it."""
        tokens, offsets, values, tops = [], [], [], []
        if echoed is not None:
            ids, entries, k = echoed
            scored = [None, *(entries or ())]
            for t, lp in zip(ids, scored + [None] * (len(ids) - len(scored))):
                tokens.append(self.key(t))
                offsets.append(offset)
                offset += len(self.text(t))
                values.append(None if lp is None else _finite(lp.logprob))
                tops.append(None if lp is None else self._top(lp, lp.top[:k]))
        for lp in lps:
            tokens.append(self.key(lp.token_id))
            offsets.append(offset)
            offset += len(self.text(lp.token_id))
            values.append(_finite(lp.logprob))
            tops.append(self._top(lp, lp.top))
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}  # fmt: skip

    def _top(self, lp: TokenLogprob, top: list[tuple[int, float]]) -> dict[str, float]:
        out = {self.key(t): _finite(v) for t, v in top}
        out.setdefault(self.key(lp.token_id), _finite(lp.logprob))
        return out

    def text_length(self, token_ids: Sequence[int]) -> int:
        """The length of the tokens' texts one by one (what `text_offset` advances by)."""
        return sum(len(self.text(t)) for t in token_ids)

    def prompt(
        self, ids: Sequence[int], entries: list[TokenLogprob] | None, k: int
    ) -> list[dict[str, dict[str, Any]] | None]:
        """vLLM's `prompt_logprobs` field: null for the first prompt token, then per token
        {token id: {logprob, rank, decoded_token}} for the token itself and its top `k`."""
        out: list[dict[str, dict[str, Any]] | None] = [None]
        for e in entries or ():
            d = {str(e.token_id): self._vllm_logprob(e.token_id, e.logprob, e.rank)}
            for rank, (t, v) in enumerate(e.top[:k], 1):
                d.setdefault(str(t), self._vllm_logprob(t, v, rank))
            out.append(d)
        return out

    def _vllm_logprob(self, token_id: int, logprob: float, rank: int | None) -> dict[str, Any]:
        return {"logprob": _finite(logprob), "rank": rank, "decoded_token": self.text(token_id)}


# echoed prompt: (its token ids, their prompt logprobs, alternatives per token)
Echoed = tuple[Sequence[int], list[TokenLogprob] | None, int]

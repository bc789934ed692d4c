"""Streaming detokenization for byte-level BPE tokenizers, in Python, without a Rust call.

`tokenizers`' `DecodeStream.step` costs ~2 us per token from Python (the call, then decoding the
window twice); at 256 running requests that is ~0.5 ms of every decode step. For a tokenizer
whose decoder is plain `ByteLevel` (GPT-2, Llama 3, SmolLM, Qwen...) the decoded text of a run
of tokens is the UTF-8 (lossy) decoding of their concatenated bytes, so each token's bytes can be
tabled once and a step becomes a list lookup: the token's text itself (`whole_texts`) when its
bytes are whole characters and nothing is pending, else its bytes and a `bytes.decode`.

The semantics are `DecodeStream`'s, which the tests check token for token: a token whose bytes
end in an incomplete (or invalid) character yields nothing and its bytes wait for the next ones;
the ByteLevel decoder maps each token's characters back to bytes, or takes the token's own UTF-8
when a character is outside the byte alphabet (added tokens such as ``<|im_end|>``); skipped
special tokens add no bytes.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tokenizers import decoders

_REPLACEMENT = "\ufffd"


@lru_cache(maxsize=1)
def _char_bytes() -> dict[str, int]:
    """GPT-2's byte ↔ printable-character alphabet (the ByteLevel pre-tokenizer's)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    shifted = [b for b in range(256) if b not in keep]
    pairs = [(chr(b), b) for b in keep] + [(chr(256 + i), b) for i, b in enumerate(shifted)]
    return dict(pairs)


def is_plain_byte_level(hf_tokenizer: Any) -> bool:
    """True when decoding is exactly ByteLevel's (no other decoder step to reproduce). The
    binding hands out the decoder as its own class (a `Sequence` of steps is not `ByteLevel`);
    no JSON round trip of the whole tokenizer (0.1 s for a 49k vocabulary, at every load)."""
    return isinstance(hf_tokenizer.decoder, decoders.ByteLevel)


def byte_pieces(hf_tokenizer: Any, skip_special_tokens: bool) -> list[bytes]:
    """Each token id's bytes as the ByteLevel decoder produces them (b"" for skipped specials)."""
    chars = _char_bytes()
    special = {
        i for i, t in hf_tokenizer.get_added_tokens_decoder().items() if t.special
    } if skip_special_tokens else set()  # fmt: skip
    pieces = []
    for i in range(hf_tokenizer.get_vocab_size(with_added_tokens=True)):
        token = hf_tokenizer.id_to_token(i)
        if token is None or i in special:
            pieces.append(b"")
            continue
        try:
            pieces.append(bytes([chars[c] for c in token]))
        except KeyError:  # a character outside the alphabet: the token's own UTF-8
            pieces.append(token.encode())
    return pieces


def whole_texts(pieces: list[bytes]) -> list[str | None]:
    """Each token's text when its bytes alone are whole characters ("" for no bytes), else
    None: what `ByteStream.step` hands out for it with nothing pending, looked up instead of
    decoded (a `bytes.decode` with an error handler costs ~0.2 us a call)."""
    texts: list[str | None] = []
    for piece in pieces:
        text = piece.decode(errors="replace")
        texts.append(None if text.endswith(_REPLACEMENT) else text)
    return texts


class ByteStream:
    """One request's stream: ``step(token_id)`` returns the text the token completes, or None
    while a character is incomplete (as `DecodeStream.step`). `texts` (`whole_texts(pieces)`,
    shared by every stream of a tokenizer) makes the common step a list lookup."""

    __slots__ = ("pending", "pieces", "texts")

    def __init__(
        self, pieces: list[bytes], pending: bytes = b"", texts: list[str | None] | None = None
    ) -> None:
        self.pieces = pieces
        self.pending = pending
        self.texts = texts if texts is not None else whole_texts(pieces)

    @classmethod
    def after(
        cls, pieces: list[bytes], context: list[int], texts: list[str | None] | None = None
    ) -> ByteStream:
        """A stream continuing `context`. Nothing of it waits: where the context ends in part
        of a character, those bytes are the prompt's, and the output's first bytes are read on
        their own (as decoding the output reads them), never joined to the prompt's text."""
        return cls(pieces, texts=texts)

    def step(self, token_id: int) -> str | None:
        if not self.pending:  # the common case: one lookup
            try:
                text = self.texts[token_id]
            except IndexError:  # an id past the tokenizer's vocab (padded LM head): no text
                return None
            if text is not None:
                return text or None
        try:
            piece = self.pieces[token_id]
        except IndexError:  # an id past the tokenizer's vocab (padded LM head): no text,
            piece = b""  # as DecodeStream
        if self.pending:
            piece = self.pending + piece
        text = piece.decode(errors="replace")
        if text.endswith(_REPLACEMENT):  # incomplete, invalid, or a real U+FFFD: wait, as
            self.pending = piece  # DecodeStream does
            return None
        self.pending = b""
        return text or None

"""Incremental detokenization and stop strings.

Text is produced a few tokens at a time without re-decoding the whole output, and never ends in
half a UTF-8 character: by `tokenizers`' own streaming decoder where it has one, else by decoding
a short window twice. Stop strings are searched in the new text plus the tail that could
complete one; a matched stop string is cut from the output. For streaming, `pop_delta` holds back
the last characters that could still turn out to be the start of a stop string, so a stop
string never leaks to a client.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagoda.runtime.model.tokenizer import Tokenizer

_CONTEXT = 5  # tokens of context before the read offset; enough for byte-level BPE merges


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        *,
        stop: Sequence[str] = (),
        include_stop: bool = False,
        skip_special_tokens: bool = True,
        use_stream: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids[-_CONTEXT:])
        # token id → the text it completes, or None (`Tokenizer.stream_decoder`); None when
        # there is none (then two windows are decoded)
        self.stream = (
            tokenizer.stream_decoder(self.ids, skip_special_tokens=skip_special_tokens)
            if use_stream
            else None
        )
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop = tuple(stop)
        self.include_stop = include_stop
        self.skip_special = skip_special_tokens
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""  # what `pop_delta` has not handed out yet
        self.stop_string: str | None = None

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def _new_text(self, new_ids: Sequence[int]) -> str:
        """Text the new ids complete; "" while a character is still incomplete."""
        if self.stream is not None:
            return "".join(c for t in new_ids if (c := self.stream(t)))
        self.ids.extend(new_ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""  # incomplete character: wait for more bytes
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]

    def push(self, token_id: int) -> None:
        """Append one token of a request without stop strings (the per-step fast path)."""
        if self.stream is None:
            self.add_tokens([token_id])
        elif c := self.stream(token_id):
            self.text += c

    def add_tokens(self, new_ids: Sequence[int], search: bool = True) -> str | None:
        """Append tokens; returns the matched stop string (output then ends there) or None.
        A stop string must end in the new text; `search=False` (the text of a request's first
        `min_tokens` tokens, as vLLM) only appends, so no stop string ends in it."""
        new_text = self._new_text(new_ids)
        if not new_text:
            return None
        old = len(self.text)
        self.text += new_text
        if not search:
            return None
        hits = [
            (i, s) for s in self.stop if (i := self.text.find(s, max(0, old - len(s) + 1))) != -1
        ]
        if not hits:
            return None
        idx, s = min(hits)  # the earliest stop string wins
        self.text = self.text[: idx + len(s)] if self.include_stop else self.text[:idx]
        self.stop_string = s
        return s

    def pop_delta(self, finished: bool) -> str:
        """Text not yet handed out that can no longer become part of a stop string. Only the
        rest is kept: without stop strings nothing, with them the last `hold` characters (a
        stop string that ends in later text starts there), so no step copies the whole output
        (`text += ...` on it per token would be quadratic over long outputs)."""
        if not self.stop:
            delta, self.text = self.text, ""
            return delta
        end = len(self.text) if finished else max(0, len(self.text) - self.hold)
        delta, self.text = self.text[:end], self.text[end:]
        return delta

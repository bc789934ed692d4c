"""Incremental detokenization and stop strings.

Text is produced a few tokens at a time without re-decoding the whole output, and never ends in
half a UTF-8 character: by `tokenizers`' own streaming decoder where it has one, else by decoding
a short window twice. The prompt's last tokens are its context, less any that end in an incomplete
or invalid character (their bytes are the prompt's: the output's text starts after them, as
decoding the output alone reads it). At the end (`flush`) the bytes of an output cut mid-character
are read as decoding the whole output reads them (U+FFFD), so the text handed out is
`tokenizer.decode(output ids)`. Stop strings are searched in the new text plus the tail that could
complete one; a matched stop string is cut from the output. For streaming, `pop_delta` holds back
the last characters that could still turn out to be the start of a stop string, so a stop
string never leaks to a client.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagoda.runtime.model.byte_stream import ByteStream
from pagoda.runtime.model.tokenizer import Tokenizer

_CONTEXT = 5  # tokens of context before the read offset; enough for byte-level BPE merges
# steps a stream may hand out nothing before what waits is read as it is (U+FFFD for invalid
# bytes): a character takes at most 4 bytes, and DecodeStream decodes every waiting id again
# at each step (a run forced by logit_bias would cost O(n) per token)
_MAX_WAIT = 16


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
        self.skip_special = skip_special_tokens
        context = prompt_ids[-_CONTEXT:]
        # token id → the text it completes, or None (`Tokenizer.stream_decoder`); None when
        # there is none (then two windows are decoded, after the context `clean_context` keeps)
        self.stream = (
            tokenizer.stream_decoder(context, skip_special_tokens=skip_special_tokens)
            if use_stream
            else None
        )
        self.ids: list[int] = (
            list(context)
            if self.stream is not None
            else tokenizer.clean_context(context, skip_special_tokens=skip_special_tokens)
        )
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop = tuple(stop)
        self.include_stop = include_stop
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""  # what `pop_delta` has not handed out yet
        self.stop_string: str | None = None
        # the ids whose steps handed out nothing, at consecutive positions up to `wait_pos`
        # (`len(request.token_ids)` after each; `pos` is that of the token being added)
        self.waiting: list[int] = []
        self.wait_pos = -1
        self.pos = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def _new_text(self, new_ids: Sequence[int]) -> str:
        """Text the new ids complete; "" while a character is still incomplete."""
        if self.stream is not None:
            text = ""
            for t in new_ids:
                if c := self.step(t):
                    text += c
                else:
                    self.wait(t, self.pos)
            return text
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
        elif c := self.step(token_id):
            self.text += c

    def wait(self, token_id: int, pos: int) -> None:
        """A stream step handed out nothing for `token_id`, at position `pos`. After
        `_MAX_WAIT` such steps in a row, what waits is read as decoding reads it and the
        stream starts over (after the prompt's context)."""
        if pos != self.wait_pos + 1:
            self.waiting = []
        self.wait_pos = pos
        self.waiting.append(token_id)
        if len(self.waiting) >= _MAX_WAIT:
            self.text += self._waiting_text()
            self.stream = self.tokenizer.stream_decoder(
                self.ids, skip_special_tokens=self.skip_special
            )

    def _waiting_text(self) -> str:
        """The text of what waits in the stream (lossy: U+FFFD for bytes of no character),
        which is then no longer waiting."""
        stream, waiting = self.stream, self.waiting
        self.waiting = []
        owner = getattr(stream, "__self__", None)
        if isinstance(owner, ByteStream):
            text, owner.pending = owner.pending.decode(errors="replace"), b""
            return text
        # DecodeStream: the ids since it last handed out text, read after a token that is not
        # a byte-fallback one (a run of those is decoded as one: with bytes already handed
        # out, an incomplete tail would turn them all into U+FFFD)
        before = self.ids[-1:]
        if before and self.tokenizer.fallback_byte(before[0]) is not None:
            before = []
        return self._decode([*before, *waiting])[len(self._decode(before)) :]

    def step(self, token_id: int) -> str | None:
        """The stream's step (a stream there must be), recovering as `recover` says."""
        try:
            return self.stream(token_id)  # type: ignore[misc]
        except Exception as e:
            return self.recover(token_id, e)

    def recover(self, token_id: int, error: Exception) -> str | None:
        """tokenizers' DecodeStream raises "Invalid prefix" where a byte-fallback decoder
        (SentencePiece: Llama 2, Mistral, Gemma) meets an invalid byte right after a whole
        character of byte tokens: decoding them together reads every byte as U+FFFD, so the
        text already handed out is no longer a prefix (vLLM #17448). The stream starts over
        after the prompt's context with this token (the invalid bytes that waited are dropped,
        as vLLM does) instead of the error ending the engine. Other errors are raised."""
        if not str(error).startswith("Invalid prefix"):
            raise error
        for ctx in (self.ids, []):  # the prompt's context may itself end in byte tokens
            stream = self.tokenizer.stream_decoder(ctx, skip_special_tokens=self.skip_special)
            try:
                text = stream(token_id)  # type: ignore[misc]
            except Exception as e:
                if not str(e).startswith("Invalid prefix"):
                    raise
                continue
            self.stream = stream
            self.waiting = []  # dropped with the stream they waited in
            return text
        return None

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

    def flush(self, end: int) -> None:
        """At the end of an output not cut by a stop string: the text of its last tokens that
        still wait for the rest of a character (a UTF-8 sequence cut by the length limit, or
        one that is never valid), read as decoding the whole output reads it (U+FFFD), without
        a stop-string search. `end`: the position (`wait`'s) of the last token it was given."""
        if self.stream is None:  # two windows: the ids after read_offset are waiting
            if self.read_offset < len(self.ids):
                head = self._decode(self.ids[self.prefix_offset : self.read_offset])
                self.text += self._decode(self.ids[self.prefix_offset :])[len(head) :]
                self.prefix_offset = self.read_offset = len(self.ids)
            return
        byte_stream = isinstance(getattr(self.stream, "__self__", None), ByteStream)
        # a DecodeStream's waiting ids count only when the last token's step was one of them
        if byte_stream or (self.waiting and self.wait_pos == end):
            self.text += self._waiting_text()

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

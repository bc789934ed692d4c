"""Tokenizer: a `tokenizers` BPE plus the chat template and the special tokens a server needs.

GGUF files carry the vocabulary and merges but not the pre-tokenizer itself, only its llama.cpp
name (`tokenizer.ggml.pre`); `PRE_TOKENIZER_SPLITS` maps those names to the regexes the merges
were learned with, so token ids match the original Hugging Face tokenizer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from pagoda.runtime.model.byte_stream import ByteStream, byte_pieces, is_plain_byte_level
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
_CONTROL, _USER_DEFINED = 3, 4


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    if pre in PRE_TOKENIZER_SPLITS:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):  # digits are split one by one first
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level  # "gpt2", "default" and unknown names: the GPT-2 regex


def build_bpe_tokenizer(
    tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int] | None, pre: str | None
) -> HFTokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` from GGUF vocabulary data."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=False))
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    types = list(token_types or [])
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types)
        if ty == _CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, ty in zip(tokens, types)
        if ty == _USER_DEFINED
    ]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    return tok


class Tokenizer:
    """Encode/decode plus chat templating; the engine only ever sees token ids."""

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        chat_template: str | None,
        bos_token_id: int | None,
        eos_token_ids: Sequence[int],
        add_bos_token: bool = False,
    ) -> None:
        self._tok = tokenizer
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos_token = add_bos_token
        self._template = None
        self._byte_level: bool | None = None  # decided on first use (byte_stream)
        self._pieces: dict[bool, list[bytes]] = {}
        if chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            self._template = env.from_string(chat_template)

    def __reduce__(self) -> tuple:
        """Pickles as its parts (the compiled template and byte tables are rebuilt): the engine
        process sends its tokenizer to the API process once."""
        return (
            _rebuild,
            (self._tok.to_str(), self.chat_template, self.bos_token_id, self.eos_token_ids,
             self.add_bos_token),
        )  # fmt: skip

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_str(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def _special(self, token_id: int | None) -> str:
        return (self._tok.id_to_token(token_id) or "") if token_id is not None else ""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids; special tokens written in the text (e.g. ``<|im_start|>``) stay whole.

        `encode_batch` rather than `encode`: only the batch call releases the GIL, so a long
        prompt tokenized on a worker thread does not stall the server's event loop.
        """
        ids = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        bos = self.bos_token_id
        if add_special_tokens and self.add_bos_token and bos is not None and ids[:1] != [bos]:
            ids = [bos, *ids]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def stream_decoder(
        self, context: Sequence[int], *, skip_special_tokens: bool = True
    ) -> Callable[[int], str | None] | None:
        """An incremental decoder seeded with `context` (the ids before the first new one):
        for byte-level BPE a byte table (`byte_stream`), else `tokenizers`' own DecodeStream
        (one Rust call per token, ~10x cheaper than decoding two windows in Python). Returns
        None when neither applies (`tokenizers` < 0.22 and not byte-level)."""
        fast = self._byte_stream(context, skip_special_tokens)
        if fast is not None:
            return fast.step
        try:
            from tokenizers.decoders import DecodeStream

            stream = DecodeStream(skip_special_tokens=skip_special_tokens, ids=list(context))
        except (ImportError, TypeError):
            return None
        return functools.partial(stream.step, self._tok)  # no Python frame per token

    def _byte_stream(self, context: Sequence[int], skip_special: bool) -> ByteStream | None:
        """The table-driven stream of `byte_stream` (same text, ~7x cheaper per token) where
        the decoder is plain ByteLevel; the byte table is built once per setting (~0.1 s)."""
        if self._byte_level is None:
            self._byte_level = is_plain_byte_level(self._tok)
        if not self._byte_level:
            return None
        pieces = self._pieces.get(skip_special)
        if pieces is None:
            pieces = self._pieces[skip_special] = byte_pieces(self._tok, skip_special)
        return ByteStream.after(pieces, list(context))

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True
    ) -> str:
        """Render messages with the model's own Jinja chat template (sandboxed)."""
        if self._template is None:
            raise ValueError("this model has no chat template; use completions instead of chat")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError(f"messages[{i}] must be an object with a 'role'")
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self._special(self.bos_token_id),
            eos_token=self._special(self.eos_token_ids[0] if self.eos_token_ids else None),
        )


def _rebuild(
    data: str,
    chat_template: str | None,
    bos_token_id: int | None,
    eos_token_ids: Sequence[int],
    add_bos_token: bool,
) -> Tokenizer:
    return Tokenizer(
        HFTokenizer.from_str(data),
        chat_template=chat_template,
        bos_token_id=bos_token_id,
        eos_token_ids=eos_token_ids,
        add_bos_token=add_bos_token,
    )


def _raise_template_error(message: str) -> None:
    raise ValueError(f"chat template error: {message}")

"""Tokenizer: a `tokenizers` BPE plus the chat template and the special tokens a server needs.

GGUF files carry the vocabulary and merges but not the pre-tokenizer itself, only its llama.cpp
name (`tokenizer.ggml.pre`); `pre_tokenizers` maps those names to the regexes the merges were
learned with (llama.cpp's table), so token ids match the original Hugging Face tokenizer. Gemma's GGUFs carry a
SentencePiece vocabulary without merges: `build_gemma_tokenizer` rebuilds Hugging Face's Gemma
tokenizer from it (the merges follow the vocabulary's order, as transformers derives them);
other SentencePiece vocabularies (Llama 2, Mistral, Phi-3, ERNIE 4.5) rebuild transformers'
Llama tokenizer (`build_spm_tokenizer`: merges by score).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jinja2.meta
from pagoda.runtime.model import pre_tokenizers as pre_tokenizers_by_name
from pagoda.runtime.model.byte_stream import (
    ByteStream,
    byte_pieces,
    is_plain_byte_level,
    whole_texts,
)
from pagoda.runtime.model.chat_template import environment as chat_template_environment
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

_CONTROL, _USER_DEFINED = 3, 4
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
SPIECE_SPACE = "\u2581"


def build_bpe_tokenizer(
    tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int] | None, pre: str | None
) -> HFTokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` from GGUF vocabulary data; `pre` is the file's
    `tokenizer.ggml.pre` (`pre_tokenizers`: ValueError for a name llama.cpp does not know)."""
    split = pre_tokenizers_by_name.lookup(pre)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = HFTokenizer(
        models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=split.ignore_merges)
    )
    tok.pre_tokenizer = pre_tokenizers_by_name.build(split)
    tok.decoder = decoders.ByteLevel()
    _add_typed_tokens(tok, tokens, list(token_types or []))
    return tok


def _add_typed_tokens(tok: HFTokenizer, tokens: Sequence[str], types: Sequence[int]) -> None:
    """Control tokens as special tokens, user-defined ones as plain added tokens (kept whole)."""
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types) if ty == _CONTROL]  # fmt: skip
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if ty == _USER_DEFINED]  # fmt: skip
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)


def merges_from_vocabulary(vocab: dict[str, int], priority: dict[str, float]) -> list[tuple]:
    """BPE merges implied by a vocabulary: every split of a token into two vocabulary tokens,
    best `priority` first, then shorter left and right parts (transformers' `generate_merges`)."""
    found = []
    for token, score in priority.items():
        local = [
            (token[:i], token[i:], score)
            for i in range(1, len(token))
            if token[:i] in vocab and token[i:] in vocab
        ]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def build_gemma_tokenizer(tokens: Sequence[str], token_types: Sequence[int] | None,
                          merges: Sequence[str] | None = None) -> HFTokenizer:  # fmt: skip
    """Hugging Face's Gemma tokenizer from a GGUF's SentencePiece vocabulary: BPE with byte
    fallback, spaces as "\u2581", no prefix space. Tokens of two or more spaces are stored with
    real spaces and renamed; the merges follow the order of the vocabulary (Gemma's scores do
    not), as transformers rebuilds them, or are the file's `merges` ("left right", Gemma 4's
    `tokenizer.ggml.merges`)."""
    spelled = [SPIECE_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    if merges:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        pairs = merges_from_vocabulary(vocab, {t: -i for i, t in enumerate(spelled)})
    unk = "<unk>" if "<unk>" in vocab else None
    tok = HFTokenizer(
        models.BPE(vocab=vocab, merges=pairs, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    tok.normalizer = normalizers.Replace(" ", SPIECE_SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence(
        [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    _add_typed_tokens(tok, spelled, list(token_types or []))
    return tok


def build_spm_tokenizer(
    tokens: Sequence[str],
    scores: Sequence[float],
    token_types: Sequence[int] | None,
    add_space_prefix: bool = True,
    prefix_every_text: bool = False,
    *,
    byte_fallback: bool = True,
    mergeable: Collection[str] | None = None,
    normalizer: normalizers.Normalizer | None = None,
    pre_tokenizer: pre_tokenizers.PreTokenizer | None = None,
    strip_first_space: bool | None = None,
) -> HFTokenizer:
    """Hugging Face's Llama tokenizer from a GGUF's SentencePiece vocabulary (Llama 2, Mistral,
    Phi-3, ERNIE 4.5, ...): BPE with byte fallback whose merges rank by the merged token's score
    (transformers' `generate_merges`, llama.cpp's SPM bigram order), spaces as "\u2581" and one
    before the text (`add_space_prefix`, llama.cpp's `tokenizer.ggml.add_space_prefix`: Metaspace
    on the first piece, as transformers' LlamaTokenizer); `prefix_every_text`: Phi-3's normalizer
    instead, which puts one before each text between special tokens too (transformers rebuilds
    Phi-3's so, as its tokenizer.json has it).

    A `tokenizer.model` (`spm_files`) sets the rest: `mergeable`, the tokens merges may make
    (SentencePiece's normal pieces; default every token), its own `normalizer` or
    `pre_tokenizer` in place of the above, and whether decoding drops the first space
    (`strip_first_space`; default: where a prefix is added)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    priority = dict(zip(tokens, scores))
    if mergeable is not None:
        priority = {t: s for t, s in priority.items() if t in mergeable}
    merges = merges_from_vocabulary(vocab, priority)
    unk = "<unk>" if "<unk>" in vocab else None
    tok = HFTokenizer(
        models.BPE(
            vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=byte_fallback
        )
    )
    if normalizer is not None or pre_tokenizer is not None:
        if normalizer is not None:
            tok.normalizer = normalizer
        if pre_tokenizer is not None:
            tok.pre_tokenizer = pre_tokenizer
    elif prefix_every_text:
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend(SPIECE_SPACE), normalizers.Replace(" ", SPIECE_SPACE)]
        )
    else:
        scheme = "first" if add_space_prefix else "never"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(SPIECE_SPACE, scheme, split=False)
    if strip_first_space is None:
        strip_first_space = add_space_prefix or prefix_every_text
    tok.decoder = spm_decoder(strip_first_space)
    _add_typed_tokens(tok, tokens, list(token_types or []))
    return tok


def spm_decoder(strip_first_space: bool) -> decoders.Decoder:
    """SentencePiece's decoding: "\u2581" as a space, byte pieces as bytes, and the first
    space dropped where encoding added it."""
    steps = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if strip_first_space:
        steps.append(decoders.Strip(" ", 1, 0))
    return decoders.Sequence(steps)


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
        tool_chat_template: str | None = None,
        sort_tool_keys: bool = False,
        template_tokens: Mapping[str, str] | None = None,
        add_eos_token: bool = False,
    ) -> None:
        self._tok = tokenizer
        self.sort_tool_keys = sort_tool_keys  # Kimi's code sorts `tools` (`tiktoken_files`)
        self.chat_template = chat_template
        # the template named tool_use (Command R's): a request with tools renders with it
        self.tool_chat_template = tool_chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos_token = add_bos_token
        # `bos_token` / `eos_token` as tokenizer_config.json names them (`special_tokens`);
        # a name it leaves out: the text of `bos_token_id` / `eos_token_ids[0]`
        self.template_tokens = dict(template_tokens or {})
        eos_id = self.eos_token_ids[0] if self.eos_token_ids else None
        self.bos_token = self.template_tokens.get("bos_token", self._text(bos_token_id))
        self.eos_token = self.template_tokens.get("eos_token", self._text(eos_id))
        # tokenizer_config.json's add_eos_token (a SentencePiece `tokenizer.model`'s): the
        # eos_token after a prompt's text, as transformers' Llama tokenizer appends it
        self.add_eos_token = add_eos_token
        self._eos_append = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self._template = None
        self._byte_level: bool | None = None  # decided on first use (byte_stream)
        self._byte_fallback: bool | None = None  # decided on first use (fallback_byte)
        self._pieces: dict[bool, tuple[list[bytes], list[str | None]]] = {}  # byte_stream's
        self._as_text: HFTokenizer | None = None  # a copy that reads special-token text as text
        self._specials: re.Pattern | bool | None = False  # False: not looked up yet
        self.template_variables: frozenset[str] = frozenset()  # the names the template reads
        self._tool_template, self._tool_variables = None, frozenset()
        if chat_template:
            self._template, self.template_variables = _compiled(chat_template)
        if tool_chat_template:
            self._tool_template, self._tool_variables = _compiled(tool_chat_template)

    def __reduce__(self) -> tuple:
        """Pickles as its parts (the compiled template and byte tables are rebuilt): the engine
        process sends its tokenizer to the API process once."""
        return (
            _rebuild,
            (self._tok.to_str(), self.chat_template, self.bos_token_id, self.eos_token_ids,
             self.add_bos_token, self.tool_chat_template, self.sort_tool_keys,
             self.template_tokens, self.add_eos_token),
        )  # fmt: skip

    def template_for(self, tools: bool) -> str | None:
        """The template a chat renders with: with tools, the tool_use one where there is one
        (transformers' `get_chat_template`), else the default."""
        return self.tool_chat_template if tools and self._tool_template else self.chat_template

    def variables_for(self, tools: bool) -> frozenset[str]:
        """The names `template_for(tools)` reads."""
        return self._tool_variables if tools and self._tool_template else self.template_variables

    @property
    def backend(self) -> HFTokenizer:
        """The `tokenizers.Tokenizer` underneath (grammar compilers read its vocabulary)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_str(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def fallback_byte(self, token_id: int) -> int | None:
        """The byte of a byte-fallback token (SentencePiece's ``<0xF0>``); None for any other
        token, and for every token of a model without byte fallback."""
        if self._byte_fallback is None:
            flag = getattr(self._tok.model, "byte_fallback", None)
            if flag is None:  # a Unigram model (`spm_files`) has it only in its serialized form
                flag = json.loads(self._tok.model.__getstate__()).get("byte_fallback")
            self._byte_fallback = bool(flag)
        if not self._byte_fallback:
            return None
        m = _BYTE_TOKEN.fullmatch(self._tok.id_to_token(token_id) or "")
        return int(m.group(1), 16) if m else None

    def _text(self, token_id: int | None) -> str | None:
        return self._tok.id_to_token(token_id) if token_id is not None else None

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids; special tokens written in the text (e.g. ``<|im_start|>``) stay whole.

        `encode_batch` rather than `encode`: only the batch call releases the GIL, so a long
        prompt tokenized on a worker thread does not stall the server's event loop.
        """
        ids = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        bos = self.bos_token_id
        if add_special_tokens and self.add_bos_token and bos is not None and ids[:1] != [bos]:
            ids = [bos, *ids]
        if add_special_tokens and self.add_eos_token and self._eos_append is not None:
            ids.append(self._eos_append)
        return ids

    def encode_whole(self, text: str) -> list[int]:
        """Token ids as transformers' ``tokenizer(text)`` gives them: tokenizer.json's
        post-processor applied where it has one (Qwen3-Embedding's appends ``<|endoftext|>``, the
        row its last-token pooling reads), else `encode`'s. What embedding inputs are read with."""
        if getattr(self._tok, "post_processor", None) is None:
            return self.encode(text)
        return self._tok.encode_batch([text], add_special_tokens=True)[0].ids

    def encode_pair(self, first: str, second: str) -> list[int]:
        """Token ids of a text pair as transformers' ``tokenizer(first, second)`` gives them
        (BERT's ``[CLS] first [SEP] second [SEP]``, XLM-R's ``<s> first </s></s> second </s>``:
        tokenizer.json's post-processor): a cross-encoder's input."""
        return self._tok.encode(first, second, add_special_tokens=True).ids

    def encode_as_text(self, text: str) -> list[int]:
        """Token ids of `text` with special-token text (``<|im_start|>``) read as plain text,
        as user content must be; no BOS."""
        if self._as_text is None:
            copy = HFTokenizer.from_str(self._tok.to_str())
            copy.encode_special_tokens = True
            self._as_text = copy
        return self._as_text.encode_batch([text], add_special_tokens=False)[0].ids

    @property
    def special_text(self) -> re.Pattern | None:
        """A pattern that finds the text of any special token; None when there are none."""
        if self._specials is False:
            texts = [t.content for t in self._tok.get_added_tokens_decoder().values()
                     if t.special and t.content]  # fmt: skip
            texts.sort(key=len, reverse=True)
            self._specials = re.compile("|".join(map(re.escape, texts))) if texts else None
        return self._specials  # type: ignore[return-value]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def stream_decoder(
        self, context: Sequence[int], *, skip_special_tokens: bool = True
    ) -> Callable[[int], str | None] | None:
        """An incremental decoder seeded with `context` (the ids before the first new one;
        `clean_context`): for byte-level BPE a byte table (`byte_stream`), else `tokenizers`'
        own DecodeStream (one Rust call per token, ~10x cheaper than decoding two windows in
        Python). Returns None when neither applies (`tokenizers` < 0.22 and not byte-level)."""
        fast = self._byte_stream(context, skip_special_tokens)
        if fast is not None:
            return fast.step
        try:
            from tokenizers.decoders import DecodeStream

            ids = self.clean_context(context, skip_special_tokens=skip_special_tokens)
            stream = DecodeStream(skip_special_tokens=skip_special_tokens, ids=ids)
        except (ImportError, TypeError):
            return None
        return functools.partial(stream.step, self._tok)  # no Python frame per token

    def clean_context(
        self, context: Sequence[int], *, skip_special_tokens: bool = True
    ) -> list[int]:
        """`context` less its last ids while its text ends in an incomplete (or invalid)
        character: a stream seeded with them would take the output's first bytes as their rest
        and hand out the prompt's text again with them."""
        ids = list(context)
        while ids and self.decode(ids, skip_special_tokens=skip_special_tokens).endswith("\ufffd"):
            ids.pop()
        return ids

    def _byte_stream(self, context: Sequence[int], skip_special: bool) -> ByteStream | None:
        """The table-driven stream of `byte_stream` (same text, ~7x cheaper per token) where
        the decoder is plain ByteLevel; the byte table is built once per setting (~0.1 s)."""
        if self._byte_level is None:
            self._byte_level = is_plain_byte_level(self._tok)
        if not self._byte_level:
            return None
        tables = self._pieces.get(skip_special)
        if tables is None:
            pieces = byte_pieces(self._tok, skip_special)
            tables = self._pieces[skip_special] = (pieces, whole_texts(pieces))
        return ByteStream.after(tables[0], list(context), tables[1])

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        continue_final_message: bool = False,
        variables: dict[str, Any] | None = None,
    ) -> str:
        """Render messages with the model's own Jinja chat template (sandboxed); `tools` (OpenAI
        tool objects) are in its context as `tools`, as Hugging Face templates expect, and so
        are `variables` (a request's `chat_template_kwargs`, names of `TEMPLATE_NAMES` left out).
        `continue_final_message`: the text ends with the last message's content, left open for
        the model to continue (as transformers cuts it; no generation prompt then)."""
        if self._template is None:
            raise ValueError("this model has no chat template; use completions instead of chat")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError(f"messages[{i}] must be an object with a 'role'")
        extra = {k: v for k, v in (variables or {}).items() if k not in TEMPLATE_NAMES}
        template = self._tool_template if tools and self._tool_template else self._template
        text = template.render(
            **extra,
            messages=list(messages),
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            tools=([_sorted_keys(t) for t in tools] if self.sort_tool_keys else list(tools))
            if tools
            else None,
        )
        return _open_final_message(text, messages) if continue_final_message and messages else text


# What `apply_chat_template` puts in a template's context itself
TEMPLATE_NAMES = frozenset(
    {
        "messages",
        "tools",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
        "raise_exception",
        "strftime_now",
    }
)


def _sorted_keys(obj: Any) -> Any:
    """`obj` with every dict's keys in sorted order, nested (Kimi's `deep_sort_dict`)."""
    if isinstance(obj, dict):
        return {k: _sorted_keys(v) for k, v in sorted(obj.items())}
    if isinstance(obj, list):
        return [_sorted_keys(v) for v in obj]
    return obj


def _open_final_message(text: str, messages: Sequence[dict[str, Any]]) -> str:
    """`text` cut right after the last message's content (transformers' rule for
    `continue_final_message`: the last place the stripped content appears; its trailing
    spaces kept only where the template kept them). ValueError when it is not there."""
    content = messages[-1].get("content") or ""
    if not isinstance(content, str):
        raise ValueError("continue_final_message needs the last message's content as text")
    at = text.rfind(content.strip())
    if at == -1:
        raise ValueError("continue_final_message: the last message's content does not appear in "
                         "the chat template's rendering, so it cannot be continued")  # fmt: skip
    if text[at : at + len(content.lstrip())] == content:  # transformers' test, as it is
        return text[: at + len(content.lstrip())]
    return text[: at + len(content.strip())]


def _rebuild(
    data: str,
    chat_template: str | None,
    bos_token_id: int | None,
    eos_token_ids: Sequence[int],
    add_bos_token: bool,
    tool_chat_template: str | None = None,
    sort_tool_keys: bool = False,
    template_tokens: Mapping[str, str] | None = None,
    add_eos_token: bool = False,
) -> Tokenizer:
    return Tokenizer(
        HFTokenizer.from_str(data),
        chat_template=chat_template,
        bos_token_id=bos_token_id,
        eos_token_ids=eos_token_ids,
        add_bos_token=add_bos_token,
        tool_chat_template=tool_chat_template,
        sort_tool_keys=sort_tool_keys,
        template_tokens=template_tokens,
        add_eos_token=add_eos_token,
    )


def _compiled(template: str) -> tuple[jinja2.Template, frozenset[str]]:
    """A chat template compiled in transformers' environment (its globals, filters, tags), and
    the names it reads."""
    env = chat_template_environment()
    names = jinja2.meta.find_undeclared_variables(env.parse(template))
    return env.from_string(template), frozenset(names)

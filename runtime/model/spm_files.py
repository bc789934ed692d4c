"""Tokenizers shipped as a SentencePiece model (`tokenizer.model`) without a tokenizer.json.

Llama-2-era repos, InternLM3 (remote code `tokenization_internlm3.py`, which is not run) and
other checkpoints ship only `tokenizer.model` and `tokenizer_config.json`; vLLM serves them by
letting transformers convert the slow tokenizer. Here the model file is read with
`sentencepiece` (pieces, scores, types; imported only on this path: the GPU image's server
imports without it) and the few settings `sentencepiece` does not expose (model type, byte
fallback, the normalizer spec) from the file's protobuf fields (`read_spec`, no protobuf
package needed); `tokenizer.build_spm_tokenizer` (BPE models: Llama 2, Mistral, InternLM3,
Yi, Baichuan) or `build_unigram_tokenizer` (Unigram models: T5-style) rebuild it as a
`tokenizers.Tokenizer`, so encode, decode, streaming and chat templates take the path every
tokenizer.json takes. A 32,000-piece BPE model (Llama 2's size) builds in ~0.65 s on a
busy 2-core CPU, once per start (the merges are derived in Python, as for a GGUF's).

What transformers' slow tokenizer (and InternLM3's code) does is kept: the text is split at the
special and added tokens, and each piece between them is encoded as `SentencePieceProcessor`
encodes it (its own dummy prefix "\u2581" and whitespace rules: `normalizer_spec`), unless
tokenizer_config.json asks transformers' Llama tokenizer for `legacy: false` (one prefix, at the
start of the text, as its fast tokenizer puts it) or sets `add_prefix_space`. User-defined
pieces stay whole; tokenizer_config.json's `added_tokens_decoder` keeps its ids (ids past the
model's pieces follow them in order). Refused, in one line: tokenizer code other than
transformers' Llama tokenizer or InternLM3's (ChatGLM's and Baichuan's code number or split
tokens in Python), Word/Char models, and files that are not a SentencePiece model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagoda.runtime.model.special_tokens import token_text
from pagoda.runtime.model.template_files import read_json_object
from pagoda.runtime.model.tiktoken_files import code_module
from pagoda.runtime.model.tokenizer import (
    SPIECE_SPACE,
    _add_typed_tokens,
    build_spm_tokenizer,
    spm_decoder,
)
from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

SPM_FILE = "tokenizer.model"
UNIGRAM, BPE = 1, 2  # TrainerSpec.model_type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # SentencePiece.type
# tokenizer_config.json's `tokenizer_class` values read here, and the remote code (auto_map)
# whose encode is SentencePiece's own per text between added tokens (InternLM3's)
LLAMA_CLASSES = frozenset({"LlamaTokenizer", "LlamaTokenizerFast"})
KNOWN_CODE = {"tokenization_internlm3": "InternLM3Tokenizer"}


@dataclass(frozen=True)
class SpmSpec:
    """The TrainerSpec and NormalizerSpec fields encoding depends on (proto defaults)."""

    model_type: int = UNIGRAM
    byte_fallback: bool = False
    treat_whitespace_as_suffix: bool = False
    charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True
    types: tuple[int, ...] = ()  # each piece's type (`sentencepiece` has no is_user_defined)


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """A protobuf message's (field number, value) pairs: varints as ints, length-delimited
    and fixed-width fields as bytes. ValueError for anything that is not wire format."""
    out, at = [], 0

    def varint() -> int:
        nonlocal at
        value = shift = 0
        while True:
            if at >= len(data) or shift > 63:
                raise ValueError("truncated varint")
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while at < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, varint()))
            continue
        size = {1: 8, 5: 4}.get(wire)
        if size is None and wire == 2:
            size = varint()
        if size is None or at + size > len(data):
            raise ValueError(f"bad wire type {wire} or length")
        out.append((number, data[at : at + size]))
        at += size
    return out


def read_spec(proto: bytes) -> SpmSpec:
    """The spec of a serialized ModelProto (`SentencePieceProcessor.serialized_model_proto`):
    trainer_spec is field 2 (model_type 3, treat_whitespace_as_suffix 24, byte_fallback 35),
    normalizer_spec field 3 (precompiled_charsmap 2, add_dummy_prefix 3,
    remove_extra_whitespaces 4, escape_whitespaces 5)."""
    found: dict[str, Any] = {}
    types = []
    for number, value in _fields(proto):
        if number == 1 and isinstance(value, bytes):  # a piece: piece 1, score 2, type 3
            types.append(next((int(v) for f, v in _fields(value) if f == 3), NORMAL))
            continue
        if number == 2 and isinstance(value, bytes):
            names = {3: "model_type", 24: "treat_whitespace_as_suffix", 35: "byte_fallback"}
        elif number == 3 and isinstance(value, bytes):
            names = {2: "charsmap", 3: "add_dummy_prefix", 4: "remove_extra_whitespaces",
                     5: "escape_whitespaces"}  # fmt: skip
        else:
            continue
        for field, inner in _fields(value):
            if field in names:
                found[names[field]] = inner if (number, field) in ((3, 2), (2, 3)) else bool(inner)
    return SpmSpec(**found, types=tuple(types))


def _check_pieces(spec: SpmSpec, source: str) -> None:
    if spec.model_type not in (UNIGRAM, BPE):
        kind = {3: "Word", 4: "Char"}.get(spec.model_type, str(spec.model_type))
        raise ValueError(f"{source} is a SentencePiece {kind} model: BPE and Unigram are read")
    if spec.treat_whitespace_as_suffix or not spec.escape_whitespaces:
        raise ValueError(f"{source} puts spaces after pieces or does not escape them "
                         "(treat_whitespace_as_suffix / escape_whitespaces): not read here")  # fmt: skip


def tokenizer_code(model_dir: Path, tcfg: Mapping[str, Any]) -> str:
    """ "llama" (transformers' Llama tokenizer, or no class named) or "internlm3" (its remote
    code, reproduced); ValueError, one line, for any other tokenizer code."""
    module = code_module(tcfg)
    if module is not None:
        if module in KNOWN_CODE:
            return "internlm3"
        known = ", ".join(f"{m}.py" for m in KNOWN_CODE)
        raise ValueError(f"{model_dir} has {SPM_FILE} but no tokenizer.json, and its tokenizer "
                         f"code ({module}.py) is not one reproduced here ({known}, or "
                         "transformers' LlamaTokenizer): add a tokenizer.json")  # fmt: skip
    name = tcfg.get("tokenizer_class")
    if name is not None and name not in LLAMA_CLASSES:
        raise ValueError(f"{model_dir} has {SPM_FILE} but no tokenizer.json, and its "
                         f"tokenizer_class {name!r} is not read from it (LlamaTokenizer is): "
                         "add a tokenizer.json")  # fmt: skip
    return "llama"


def looks_like_spm(path: Path) -> bool:
    """A ModelProto starts with its first piece (field 1, length-delimited: byte 0x0a); a Git
    LFS pointer, an HTML page or a tiktoken file does not."""
    with path.open("rb") as f:
        return f.read(1) == b"\x0a"


def check_spm_dir(model_dir: Path, tcfg: Mapping[str, Any]) -> None:
    """What the server checks before it listens (the model is read at load)."""
    path = model_dir / SPM_FILE
    if not looks_like_spm(path):
        raise ValueError(f"{path} is not a SentencePiece model (truncated, or a Git LFS pointer?)")
    tokenizer_code(model_dir, tcfg)


def _steps(
    spec: SpmSpec, prefix: bool, first_only: bool
) -> tuple[normalizers.Normalizer, pre_tokenizers.PreTokenizer | None]:
    """SentencePiece's normalizer: its character map, then (remove_extra_whitespaces) no
    spaces at either end and one for a run, then the dummy prefix `prefix` on each text between
    added tokens and spaces as "\u2581"; `first_only`: the prefix and the spaces left to a
    Metaspace pre-tokenizer that puts it at the start of the text only (transformers' Llama
    tokenizer with `legacy: false`)."""
    steps: list[normalizers.Normalizer] = []
    if spec.charsmap:
        steps.append(normalizers.Precompiled(spec.charsmap))
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""),
                  normalizers.Replace(Regex(" {2,}"), " ")]  # fmt: skip
    if first_only:
        scheme = "first" if prefix else "never"
        return normalizers.Sequence(steps), pre_tokenizers.Metaspace(
            SPIECE_SPACE, scheme, split=False
        )
    if prefix:
        steps.append(normalizers.Prepend(SPIECE_SPACE))
    steps.append(normalizers.Replace(" ", SPIECE_SPACE))
    return normalizers.Sequence(steps), None


def build_unigram_tokenizer(
    pieces: list[tuple[str, float]],
    types: list[int],
    spec: SpmSpec,
    prefix: bool,
    first_only: bool,
    strip_first_space: bool,
) -> HFTokenizer:
    """A Unigram SentencePiece model as `tokenizers`' Unigram (transformers' SpmConverter)."""
    unk = next((i for i, t in enumerate(types) if t == UNKNOWN), None)
    tok = HFTokenizer(models.Unigram(pieces, unk_id=unk, byte_fallback=spec.byte_fallback))
    normalizer, pre_tokenizer = _steps(spec, prefix, first_only)
    tok.normalizer = normalizer
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    tok.decoder = spm_decoder(strip_first_space)
    _add_typed_tokens(tok, [p for p, _ in pieces], types)
    return tok


def _added_tokens(
    tok: HFTokenizer, tcfg: Mapping[str, Any], n_pieces: int, listed: Mapping[str, Any]
) -> None:
    """tokenizer_config.json's added_tokens_decoder at its ids: the model's piece where the id
    is one (the same text), else the next id past the pieces, in order; `listed`: an older
    layout's added_tokens.json ({text: id}) for the ids that the decoder does not name."""
    added = tcfg.get("added_tokens_decoder") or {}
    if not isinstance(added, Mapping) or not isinstance(listed, Mapping):
        raise ValueError("tokenizer_config.json added_tokens_decoder (or added_tokens.json) "
                         "is not an object")  # fmt: skip
    added = {**{str(i): {"content": t} for t, i in listed.items()}, **added}
    for key in sorted(added, key=lambda k: int(k) if str(k).isdigit() else -1):
        entry = added[key]
        content = entry.get("content") if isinstance(entry, Mapping) else None
        if not (str(key).isdigit() and isinstance(content, str) and content):
            raise ValueError(f"tokenizer_config.json added_tokens_decoder[{key!r}] is not "
                             "an id with a 'content'")  # fmt: skip
        want, special = int(key), bool(entry.get("special", False))
        if want < n_pieces and tok.id_to_token(want) != content:
            raise ValueError(f"tokenizer_config.json names token {want} {content!r}, but "
                             f"{SPM_FILE} has {tok.id_to_token(want)!r} there")  # fmt: skip
        token = AddedToken(content, special=special, normalized=False,
                           lstrip=bool(entry.get("lstrip")), rstrip=bool(entry.get("rstrip")),
                           single_word=bool(entry.get("single_word")))  # fmt: skip
        (tok.add_special_tokens if special else tok.add_tokens)([token])
        if tok.token_to_id(content) != want:
            raise ValueError(f"tokenizer_config.json's added token {content!r} would get id "
                             f"{tok.token_to_id(content)}, not its id {want}")  # fmt: skip


def _named_specials(tok: HFTokenizer, tcfg: Mapping[str, Any]) -> None:
    """bos/eos/unk/pad named by tokenizer_config.json are special (kept whole, skipped in
    output) where the vocabulary has them, as transformers treats them."""
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    texts = [token_text(tcfg.get(n)) for n in names]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in texts if t and tok.token_to_id(t) is not None])  # fmt: skip


def read_spm_dir(model_dir: Path, tcfg: Mapping[str, Any]) -> HFTokenizer:
    """The `tokenizers.Tokenizer` of a directory's `tokenizer.model` (module docstring)."""
    code = tokenizer_code(model_dir, tcfg)
    path = model_dir / SPM_FILE
    if not looks_like_spm(path):
        raise ValueError(f"{path} is not a SentencePiece model (truncated, or a Git LFS pointer?)")
    import sentencepiece  # only here: the GPU image's server imports without it

    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(path.read_bytes())
    except (RuntimeError, OSError) as e:
        raise ValueError(f"{path} is not a SentencePiece model: {str(e)[:200]}") from None
    spec = read_spec(sp.serialized_model_proto())
    _check_pieces(spec, str(path))
    n = sp.get_piece_size()
    if len(spec.types) != n:
        raise ValueError(f"{path}: {len(spec.types)} pieces read, sentencepiece has {n}")
    tokens = [sp.id_to_piece(i) for i in range(n)]
    scores = [sp.get_score(i) for i in range(n)]
    types = list(spec.types)
    prefix = spec.add_dummy_prefix
    if tcfg.get("add_prefix_space") is not None and code == "llama":
        prefix = bool(tcfg["add_prefix_space"])
    first_only = code == "llama" and tcfg.get("legacy") is False
    # InternLM3's decode drops the first space by its add_prefix_space (default true)
    strip = bool(tcfg.get("add_prefix_space", True)) if code == "internlm3" else prefix
    if spec.model_type == BPE:
        normalizer, pre_tokenizer = _steps(spec, prefix, first_only)
        tok = build_spm_tokenizer(
            tokens, scores, types, byte_fallback=spec.byte_fallback,
            mergeable={t for t, ty in zip(tokens, types) if ty == NORMAL},
            normalizer=normalizer, pre_tokenizer=pre_tokenizer, strip_first_space=strip,
        )  # fmt: skip
    else:
        pieces = list(zip(tokens, scores))
        tok = build_unigram_tokenizer(pieces, types, spec, prefix, first_only, strip)
    listed = model_dir / "added_tokens.json"
    _added_tokens(tok, tcfg, n, read_json_object(listed) if listed.is_file() else {})
    _named_specials(tok, tcfg)
    return tok

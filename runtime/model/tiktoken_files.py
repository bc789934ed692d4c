"""Tokenizers shipped as a tiktoken BPE file, read without running the model's remote code.

Kimi K2 (Instruct, Thinking, 0905), Kimi-Linear and Moonlight ship no tokenizer.json: their
vocabulary is `tiktoken.model` (one line per token: its bytes in base64, then its rank) and
their tokenizer is remote code (`tokenization_kimi.py`, `tokenization_moonshot.py`) that holds
the split regex and numbers the special tokens after the ranks (`tokenizer_config.json`'s
`added_tokens_decoder` names some, the rest of the reserved slots are
``<|reserved_token_{id}|>``). That code is not run: the regex comes from `pre_tokenizers`
(the one it holds; checked against the file's text where the file is there), and the ranks
become a `tokenizers` byte-level BPE whose merges are derived from them as transformers'
`TikTokenConverter` derives them, so encode, decode, streaming and chat templates take the
path every tokenizer.json takes. Building it is done once per start: the merges are found with
numpy (`token_splits`), which cut a K2-sized build (163,584 ranks, 335k merges) 1.7x, from
1.9 to 1.1 s on a busy 2-core CPU (`benchmarks/tokenizer_speed.py`); much of the rest is
`tokenizers` building its BPE. No built tokenizer is cached on disk: reading it back as
tokenizer.json took ~0.6x the build, a saving only where a restarted process finds the cache
of an earlier one (a new pod starts without it). A tiktoken file whose tokenizer code is not
known here is refused in one line: its split regex cannot be read from the file.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pagoda.runtime.model import pre_tokenizers, token_splits
from pagoda.runtime.model.byte_stream import _char_bytes
from tokenizers import AddedToken, decoders, models
from tokenizers import Tokenizer as HFTokenizer

TIKTOKEN_FILE = "tiktoken.model"


@dataclass(frozen=True)
class TiktokenCode:
    """What a tokenizer's remote code holds: its split regex, the alternatives its source
    joins with "|" into it (looked for in the file), and how many special-token slots follow
    the ranks."""

    pattern: str
    alternatives: tuple[str, ...]
    reserved: int


_KIMI_ALTERNATIVES = (
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
)  # fmt: skip
KIMI = TiktokenCode(pre_tokenizers.KIMI_K2, _KIMI_ALTERNATIVES, reserved=256 + 2)
# tokenizer_config.json's auto_map module -> the code's regex and slots (Kimi K2, Kimi-Linear
# and Kimi-VL ship tokenization_kimi.py; Moonlight tokenization_moonshot.py, the same code)
KNOWN_CODE = {"tokenization_kimi": KIMI, "tokenization_moonshot": KIMI}


def _parse_line(line: bytes) -> tuple[bytes, int]:
    token_b64, rank_text = line.split()
    return base64.b64decode(token_b64, validate=True), int(rank_text)


def looks_like_ranks(path: Path, edge: int = 4096) -> bool:
    """Whether the file's first and last lines are tiktoken lines (what a Git LFS pointer, an
    error page or a file cut mid-line is not), without reading the rest."""
    with path.open("rb") as f:
        head = f.read(edge)
        f.seek(0, 2)
        f.seek(max(0, f.tell() - edge))
        tail = f.read()
    try:
        _parse_line(head.splitlines()[0]), _parse_line(tail.splitlines()[-1])
    except (ValueError, IndexError, binascii.Error):
        return False
    return True


def read_ranks(path: Path) -> dict[bytes, int]:
    """The token bytes -> rank of a tiktoken BPE file (blank lines skipped, as tiktoken's
    `load_tiktoken_bpe`); ValueError naming the first bad line, a repeated token or rank, or
    ranks that are not 0..n-1 (the ids special tokens are numbered after)."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = _parse_line(line)
        except (ValueError, binascii.Error):
            raise ValueError(f"{path}:{number}: not a tiktoken line (base64 token, rank)") from None
        if token in ranks:
            raise ValueError(f"{path}:{number}: token {token!r} appears twice")
        ranks[token] = rank
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks are not 0..{len(ranks) - 1}, each once")
    return ranks


def merges_from_ranks(ranks: Mapping[bytes, int]) -> tuple[dict[str, int], list[tuple]]:
    """The byte-level vocabulary and BPE merges that encode as tiktoken's lowest-rank-first
    merging does (transformers' `TikTokenConverter.extract_vocab_merges_from_model`): every
    split of a token into two tokens is a merge, ordered by the merged token's rank, then by
    the ranks of its left and right parts. The splits are found all at once with numpy
    (`token_splits`); the tokens are spelled in GPT-2's characters (one per byte) all at once
    (their bytes as code points through a table, read back as one UTF-32 string)."""
    tokens = list(ranks)
    chars = np.zeros(256, dtype=np.uint32)  # GPT-2's byte alphabet: byte -> code point
    for char, byte in _char_bytes().items():
        chars[byte] = ord(char)
    data = np.frombuffer(b"".join(tokens), dtype=np.uint8)
    text = chars[data].tobytes().decode("utf-32-le")  # every token spelled, one char per byte
    ends = list(itertools.accumulate(map(len, tokens)))
    spelled = [text[end - len(token) : end] for token, end in zip(tokens, ends)]
    rank = np.fromiter(ranks.values(), dtype=np.int64, count=len(tokens))
    whole, left, right = token_splits.split_pairs(tokens)
    if len(rank) and int(rank.max()) < 1 << 21:  # the three ranks as one sort key
        order = np.argsort((rank[whole] << 42) | (rank[left] << 21) | rank[right])
    else:
        order = np.lexsort((rank[right], rank[left], rank[whole]))
    merges = [(spelled[a], spelled[b]) for a, b in zip(left[order].tolist(), right[order].tolist())]
    return dict(zip(spelled, rank.tolist())), merges


def special_tokens(
    n_ranks: int, reserved: int, added: Mapping[str, Any]
) -> list[tuple[int, str, bool]]:
    """(id, text, special) of the tokens after the ranks, as the Kimi code numbers them: the
    `reserved` slots from `n_ranks` (and any later id `added_tokens_decoder` names), each the
    text it names or ``<|reserved_token_{id}|>``."""
    named: dict[int, tuple[str, bool]] = {}
    for key, entry in added.items():
        content = entry.get("content") if isinstance(entry, Mapping) else None
        if not (str(key).isdigit() and isinstance(content, str) and content):
            raise ValueError(f"tokenizer_config.json added_tokens_decoder[{key!r}] is not "
                             "an id with a 'content'")  # fmt: skip
        if int(key) >= n_ranks:
            named[int(key)] = (content, bool(entry.get("special", True)))
    end = max([n_ranks + reserved, *(i + 1 for i in named)])
    return [(i, *named.get(i, (f"<|reserved_token_{i}|>", True))) for i in range(n_ranks, end)]


def build_tiktoken_tokenizer(
    ranks: Mapping[bytes, int], pattern: str, specials: list[tuple[int, str, bool]]
) -> HFTokenizer:
    """A `tokenizers` byte-level BPE that gives tiktoken's ids for `ranks` split by `pattern`,
    with `specials` (id, text, special) kept whole wherever their text appears."""
    vocab, merges = merges_from_ranks(ranks)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.build(pre_tokenizers.PreTokenizer((pattern,)))
    tok.decoder = decoders.ByteLevel()
    for special, run in itertools.groupby(specials, key=lambda s: s[2]):  # in id order
        tokens = [AddedToken(text, special=special, normalized=False) for _, text, _ in run]
        (tok.add_special_tokens if special else tok.add_tokens)(tokens)  # the next ids
    for want, text, _ in specials:
        if tok.token_to_id(text) != want:
            raise ValueError(f"special token {text!r} would get id {tok.token_to_id(text)}, "
                             f"not its id {want} (its text is also a BPE token)")  # fmt: skip
    return tok


def code_module(tcfg: Mapping[str, Any]) -> str | None:
    """The module of the tokenizer class tokenizer_config.json's `auto_map` names
    (``["tokenization_kimi.TikTokenTokenizer", null]`` -> "tokenization_kimi")."""
    auto_map = tcfg.get("auto_map")
    auto = auto_map.get("AutoTokenizer") if isinstance(auto_map, Mapping) else None
    names = [a for a in (auto if isinstance(auto, list) else [auto]) if isinstance(a, str)]
    return names[0].rsplit(".", 1)[0] if names else None


def tiktoken_code(model_dir: Path, tcfg: Mapping[str, Any]) -> TiktokenCode:
    """The known tokenizer code a directory's tokenizer_config.json names (`auto_map`), its
    regex checked against that file's text where the directory has it; ValueError otherwise."""
    module = code_module(tcfg)
    if module not in KNOWN_CODE:
        known = ", ".join(f"{m}.py" for m in KNOWN_CODE)
        raise ValueError(f"{model_dir} has {TIKTOKEN_FILE} but no tokenizer.json, and its "
                         f"tokenizer code ({module or 'none named in tokenizer_config.json'}) "
                         f"is not one whose split regex is known here ({known})")  # fmt: skip
    code = KNOWN_CODE[module]
    source = model_dir / f"{module}.py"
    if source.is_file():
        text = source.read_text(errors="replace")
        missing = [a for a in code.alternatives if a not in text]
        slots = re.search(rf"num_reserved_special_tokens\s*=\s*{code.reserved - 2}\b", text)
        if missing or not slots:
            raise ValueError(f"{source.name} in {model_dir} splits or numbers its special "
                             "tokens differently from the Kimi code known here: add a "
                             "tokenizer.json")  # fmt: skip
    return code


def sorts_tool_keys(model_dir: Path, tcfg: Mapping[str, Any]) -> bool:
    """Whether the directory's tokenizer code sorts the keys of `tools` before rendering the
    chat template (later Kimi releases' `deep_sort_dict(tools)`); False without the file."""
    source = model_dir / f"{code_module(tcfg)}.py"
    return source.is_file() and "deep_sort_dict(tools)" in source.read_text(errors="replace")


def read_tiktoken_dir(model_dir: Path, tcfg: Mapping[str, Any]) -> HFTokenizer:
    """The `tokenizers.Tokenizer` of a directory's `tiktoken.model` (module docstring)."""
    code = tiktoken_code(model_dir, tcfg)
    ranks = read_ranks(model_dir / TIKTOKEN_FILE)
    added = tcfg.get("added_tokens_decoder") or {}
    if not isinstance(added, Mapping):
        raise ValueError("tokenizer_config.json added_tokens_decoder is not an object")
    return build_tiktoken_tokenizer(
        ranks, code.pattern, special_tokens(len(ranks), code.reserved, added)
    )

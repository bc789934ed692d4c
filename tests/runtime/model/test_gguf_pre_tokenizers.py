"""A GGUF's `tokenizer.ggml.pre` against the Hugging Face tokenizer of a model of that family.

One small byte-level BPE is trained once; each family's tokenizer.json side is that BPE with the
pre-tokenizer (and normalizer, and `ignore_merges`) copied from the model's own tokenizer.json,
built by `tokenizers`; the GGUF side is a file written by `gguf` with the same vocabulary and
merges and llama.cpp's name for the pre-tokenizer, read by `pagoda.runtime.model.loader`.
Their token ids must agree on text that tells the splits apart (digit runs, contractions, CJK,
emoji, whitespace runs, newlines, code). An unknown name: `pagoda serve` says so in one line and
exits 2, as llama.cpp refuses it.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
import regex
from pagoda.runtime.model import pre_tokenizers
from pagoda.runtime.model.loader import read_tokenizer
from tokenizers import Regex, Tokenizer, decoders, models, trainers
from tokenizers import pre_tokenizers as hf_pre
from transformers.convert_slow_tokenizer import bytes_to_unicode

ROOT = Path(__file__).resolve().parents[3]

TEXT = (
    "Hello WORLD's they'RE I'll 12345678 3.14159 x=1000000; 你好，世界！こんにちは カタカナ 한국어 "
    "😀🎉 café Ωmega ΣΑΣ\n\n\n  indented\tTab  \r\n"
    "def f(a, b):\n    return a**2 + b//3  # done!!\n"
    "    \n\nCamelCaseWordsHTTPServer don't DON'T 2024-12-06 $100.00 ...\u3000end   "
)
CORPUS = [TEXT, TEXT.lower(), TEXT.upper(), "the quick brown fox 0123456789 " * 3]


def _split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


_BYTES = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
_GPT2 = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_O200K = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK3 = [
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
_DIGITS_THEN_GPT2 = [{"type": "Digits", "individual_digits": True}, _GPT2]
_NFC = {"type": "NFC"}

# llama.cpp's name -> (the model's tokenizer.json pre_tokenizer, normalizer, ignore_merges)
FAMILIES = {
    "llama-bpe": ([_split(_LLAMA3), _BYTES], None, True),  # Llama 3
    "qwen2": ([_split(_QWEN2), _BYTES], _NFC, False),  # Qwen2 / Qwen2.5
    "deepseek-v3": ([*map(_split, _DEEPSEEK3), _BYTES], None, False),  # DeepSeek-V3 / R1
    "gpt-4o": ([_split(_O200K), _BYTES], None, False),  # o200k (GPT-4o's)
    "command-r": (_DIGITS_THEN_GPT2, _NFC, False),  # Command-R
    "glm4": ([_split(_LLAMA3), _BYTES], None, False),  # GLM-4-0414
    "smollm": (_DIGITS_THEN_GPT2, None, False),  # SmolLM / SmolLM2
    "tekken": ([_split(_TEKKEN), _BYTES], None, True),  # Mistral Nemo's Tekken
    "gpt-2": ([_GPT2], None, False),
}


@pytest.fixture(scope="module")
def bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """One small byte-level BPE (vocabulary, merges), merges across pieces of every family."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = hf_pre.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=900, initial_alphabet=hf_pre.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS + [line for t in CORPUS for line in t.split()], trainer)
    data = json.loads(tok.to_str())["model"]
    return data["vocab"], [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
                           for m in data["merges"]]  # fmt: skip


def _hf_tokenizer(vocab, merges, family) -> Tokenizer:
    pre, normalizer, ignore_merges = family
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    data = json.loads(tok.to_str())
    data["pre_tokenizer"] = pre[0] if len(pre) == 1 else {"type": "Sequence", "pretokenizers": pre}
    data["normalizer"] = normalizer
    tok = Tokenizer.from_str(json.dumps(data))
    tok.decoder = decoders.ByteLevel()
    return tok


def write_tokenizer_gguf(path: Path, vocab: dict[str, int], merges, pre: str | None) -> Path:
    """A GGUF of a one-layer llama config without tensors: what the tokenizer read needs."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(2)
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    tokens = sorted(vocab, key=vocab.get)
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_eos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("pre", list(FAMILIES))
def test_gguf_pre_tokenizer_gives_the_hugging_face_tokenizers_ids(tmp_path, bpe, pre):
    vocab, merges = bpe
    expected = _hf_tokenizer(vocab, merges, FAMILIES[pre]).encode(TEXT).ids
    got = read_tokenizer(str(write_tokenizer_gguf(tmp_path / "t.gguf", vocab, merges, pre)))
    assert got.encode(TEXT, add_special_tokens=False) == expected
    assert got.decode(expected) == TEXT


KIMI_PAT = "|".join(  # tokenization_kimi.py's pat_str, run by `regex` (V1: sets with &&)
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)


def _rank_bpe(ranks: dict[bytes, int], piece: bytes, max_rank: int | None = None) -> list[bytes]:
    """tiktoken's BPE: merge the adjacent pair whose join ranks lowest, until none is ranked
    (below `max_rank`: how llama.cpp's converter finds the pair a token was merged from)."""
    parts = [bytes([b]) for b in piece]
    while True:
        ranked = [(ranks[a + b], i) for i, (a, b) in enumerate(itertools.pairwise(parts))
                  if a + b in ranks]  # fmt: skip
        if not ranked or (max_rank is not None and min(ranked)[0] >= max_rank):
            return parts
        i = min(ranked)[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def test_kimi_k2_gguf_gives_tiktokens_ids(tmp_path, bpe):
    """Kimi-K2 ships a tiktoken model, no tokenizer.json: the oracle is tiktoken's algorithm
    (ranks, tokenization_kimi.py's regex run by `regex`); the GGUF holds the merges llama.cpp's
    converter derives from the ranks."""
    byte_chars = bytes_to_unicode()  # GPT-2's byte -> character, as the converter spells tokens
    chars = {c: b for b, c in byte_chars.items()}
    vocab, _ = bpe
    ranks = {bytes(chars[c] for c in tok): i for tok, i in vocab.items()}
    spell = {v: k for k, v in vocab.items()}
    merges = [
        tuple("".join(byte_chars[b] for b in part) for part in parts)
        for token, rank in ranks.items()
        if len(token) > 1 and len(parts := _rank_bpe(ranks, token, max_rank=rank)) == 2
    ]
    text = TEXT + " 中文Kimi混合TEXT漢字"
    expected = [ranks[p] for piece in regex.findall(KIMI_PAT, text, flags=regex.V1)
                for p in _rank_bpe(ranks, piece.encode())]  # fmt: skip
    got = read_tokenizer(str(write_tokenizer_gguf(tmp_path / "k.gguf", vocab, merges, "kimi-k2")))
    assert got.encode(text, add_special_tokens=False) == expected, [spell[i] for i in expected]


def test_every_llama_cpp_name_builds_and_splits_without_losing_text():
    for name, pre in pre_tokenizers.PRE_TOKENIZERS.items():
        pieces = pre_tokenizers.build(pre).pre_tokenize_str(TEXT)  # Oniguruma reads each regex
        whole = pre_tokenizers.build(pre_tokenizers.PreTokenizer(())).pre_tokenize_str(TEXT)
        assert "".join(p for p, _ in pieces) == whole[0][0], name


def test_a_gguf_without_a_pre_tokenizer_splits_as_llama_cpps_default_and_says_so(
    tmp_path, bpe, caplog
):
    path = write_tokenizer_gguf(tmp_path / "t.gguf", *bpe, None)
    got = read_tokenizer(str(path)).backend.pre_tokenizer.pre_tokenize_str("x 12345 a+b")
    assert [p for p, _ in got] == ["x", "Ġ", "123", "45", "Ġa", "+", "b"]  # "default": 4 regexes
    assert "no tokenizer.ggml.pre" in caplog.text


@pytest.mark.parametrize("pre", ["no-such-pre", "afmoe"])
def test_a_pre_tokenizer_llama_cpp_refuses_is_refused(tmp_path, bpe, pre):
    path = write_tokenizer_gguf(tmp_path / "t.gguf", *bpe, pre)
    with pytest.raises(ValueError, match=f"tokenizer.ggml.pre {pre!r}"):
        read_tokenizer(str(path))


def test_pagoda_serve_on_an_unknown_pre_tokenizer_says_so_in_one_line_and_exits_2(tmp_path, bpe):
    path = write_tokenizer_gguf(tmp_path / "t.gguf", *bpe, "llama-nine")
    result = subprocess.run(
        [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--port", "0",
         "--no-engine-process", "--model", str(path)],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pre-tokenizer tokenizer.ggml.pre 'llama-nine'" in lines[0], lines


def _as_regex_splits(pre: pre_tokenizers.PreTokenizer) -> hf_pre.PreTokenizer:
    """Every regex as an Oniguruma `Split`, then the bytes mapped (the form `build` improves)."""
    return hf_pre.Sequence(
        [hf_pre.Split(Regex(r), behavior="isolated") for r in pre.splits]
        + [hf_pre.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def _steps(pre: hf_pre.PreTokenizer) -> list[tuple[str, object]]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    steps = json.loads(tok.to_str())["pre_tokenizer"]["pretokenizers"]
    return [(s["type"], s.get("use_regex", s.get("individual_digits"))) for s in steps]


def test_digit_and_gpt2_splits_take_the_native_pre_tokenizers():
    """`\\p{N}` as `Digits`, a last GPT-2 regex as `ByteLevel`'s own (SmolLM's tokenizer.json
    form; as Oniguruma splits SmolLM2's GGUF encoded ~10 % slower), the pieces unchanged for
    every llama.cpp name."""
    build, lookup = pre_tokenizers.build, pre_tokenizers.lookup
    assert _steps(build(lookup("smollm"))) == [("Digits", True), ("ByteLevel", True)]
    assert _steps(build(lookup("gpt-2"))) == [("ByteLevel", True)]
    assert _steps(build(lookup("llama-bpe"))) == [("Split", None), ("ByteLevel", False)]
    text = TEXT + " ٣٤ ²³ Ⅻ\t\tx \u00a0y"  # other numerals, runs of other whitespace
    for name, pre in pre_tokenizers.PRE_TOKENIZERS.items():
        want = _as_regex_splits(pre).pre_tokenize_str(text)
        assert build(pre).pre_tokenize_str(text) == want, name

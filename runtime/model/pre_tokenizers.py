"""Byte-level BPE pre-tokenizers by their llama.cpp name (a GGUF's `tokenizer.ggml.pre`).

A GGUF carries the vocabulary and merges but not the pre-tokenizer, only the name llama.cpp gave
it (`llama-vocab.cpp`: each name -> a `LLAMA_VOCAB_PRE_TYPE_*` -> the regexes applied in turn,
each splitting the pieces the previous one left, matches and the text between them kept). The
table holds the same names and regexes, in the form of the model's own tokenizer.json where
llama.cpp rewrote one for std::regex (`(?i:'s|...)` for its `'[sS]|...`, `\\p{Lu}` classes for
its lookaheads): `tokenizers`' regex engine (Oniguruma) reads them as written, so the pieces are
the Hugging Face tokenizer's (Kimi-K2's, code in llama.cpp, is tokenization_kimi.py's regex,
class intersections and all). A name llama.cpp does not know is refused (llama.cpp: "unknown
pre-tokenizer type"), and so are the few it knows whose splitting is code rather than a regex
(AFMoE's digit groups) or that are not byte-level (Gemma 4's, Sarvam's, "whitespace").
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
GPT4O = (  # o200k's
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA_CPP_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
YOUTU = [
    r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_LLAMA_CPP_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_LLAMA_CPP_CONTRACTIONS}?"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
_DEEPSEEK3_WORDS = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
)
DEEPSEEK3 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
SPARK2_5 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
    r"\p{N}",
]
DEEPSEEK_LLM = [
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",  # \u: the compatibility letters as written (not NFC)
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
]
DEEPSEEK_CODER = ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"]
_GPT2_NO_TAIL = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
FALCON = [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2_NO_TAIL, r"[0-9][0-9][0-9]"]
DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2_NO_TAIL, r"\p{N}+", r"[0-9][0-9][0-9]"]
STARCODER = [r"\p{N}", _GPT2_NO_TAIL]  # digits one by one, then GPT-2's
QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
JAIS2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
    r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
CHAMELEON = [
    r"<sentinel:[0-9]+>",
    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    _GPT2_NO_TAIL,
]
_MARKED = r"(?=[\p{L}\p{M}])"
GRANITE_EMB_MULTI = (  # llama.cpp's own form (no tokenizer.json original in its source)
    rf"[^\r\n\p{{L}}\p{{N}}]?({_MARKED}([^a-z]))*({_MARKED}([^A-Z]))+{_LLAMA_CPP_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?({_MARKED}([^a-z]))+({_MARKED}([^A-Z]))*{_LLAMA_CPP_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TINY_AYA = [r"\d{1,3}(?=(?:\d{3})*\b)", GPT4O]
SUPERBPE = [r"\p{N}+", r"(?=(\d{3})+(?!\d))"]
BAILINGMOE = (  # the tokenizer.json's possessive quantifiers (Oniguruma has them)
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*"
    r"|\s*[\r\n]|\s+(?!\S)|\s+"
)
SEED_CODER = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LAGUNA = [
    r"[^\n]+|[\n]+",
    _LLAMA_CPP_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
]
EXAONE_MOE = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"
)
_NOT_HAN_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_NOT_HAN_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
KIMI_K2 = (  # tokenization_kimi.py's pat_str (llama.cpp runs it as code: std::regex lacks &&)
    r"[\p{Han}]+"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_NOT_HAN_UPPER}*{_NOT_HAN_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_NOT_HAN_UPPER}+{_NOT_HAN_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MINICPM5 = [
    r"\p{N}{1,3}",
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
]


@dataclass(frozen=True)
class PreTokenizer:
    """The regexes llama.cpp applies in turn, and whether a whole word found in the vocabulary
    is taken as one token before any merge (llama.cpp's `ignore_merges`, tokenizers' too)."""

    splits: tuple[str, ...]
    ignore_merges: bool = False


def _names(names: str, splits: str | list[str], ignore_merges: bool = False) -> dict:
    split = tuple([splits] if isinstance(splits, str) else splits)
    return {name: PreTokenizer(split, ignore_merges) for name in names.split()}


# llama-vocab.cpp's names, grouped by the LLAMA_VOCAB_PRE_TYPE_* each maps to
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_names("default", DEFAULT),
    **_names(
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
        LLAMA3,
        ignore_merges=True,
    ),
    **_names("dbrx smaug-bpe", LLAMA3),
    **_names("jais-2", JAIS2),
    **_names("deepseek-llm", DEEPSEEK_LLM),
    **_names("deepseek-coder", DEEPSEEK_CODER),
    **_names("deepseek-v3 hunyuan-dense joyai-llm hy_v4", DEEPSEEK3),
    **_names("spark2_5", SPARK2_5),
    **_names("youtu", YOUTU, ignore_merges=True),
    **_names("falcon", FALCON),
    **_names("starcoder refact command-r smollm codeshell exaone minerva-7b mellum2", STARCODER),
    **_names(
        "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum "
        "modern-bert jina-v1-en jina-v2-code roberta-bpe mpt olmo jais trillion "
        "granite-docling exaone4",
        GPT2,
    ),
    **_names("qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open", QWEN2),
    **_names("qwen35", QWEN35),
    **_names("poro-chat bloom gpt3-finnish", BLOOM),
    **_names("glm4 chatglm-bpe", LLAMA3),  # GLM-4's tokenizer.json: Llama 3's regex
    **_names("viking", [BLOOM, r"\p{N}"]),
    **_names("tekken", TEKKEN, ignore_merges=True),
    **_names("chameleon", CHAMELEON),
    **_names("gpt-4o llama4 kanana2 talkie minimax-m2", GPT4O),
    **_names("granite-embed-multi-97m", GRANITE_EMB_MULTI, ignore_merges=True),
    **_names("tiny_aya cohere2moe", TINY_AYA),
    **_names("superbpe", SUPERBPE),
    **_names("bailingmoe bailingmoe2 llada-moe", BAILINGMOE),
    **_names("seed-coder", SEED_CODER),
    **_names("ufakzeka", UFAKZEKA),
    **_names("grok-2", QWEN2),
    **_names("laguna", LAGUNA),
    **_names("exaone-moe", EXAONE_MOE),
    **_names("minicpm5", MINICPM5, ignore_merges=True),
    **_names("kimi-k2", KIMI_K2),  # tiktoken's ranks, written as merges by the converter
}
# Names llama.cpp knows whose splitting is not a byte-level regex sequence
NOT_SUPPORTED = {
    "afmoe": "AFMoE's digit grouping is code in llama.cpp",
    "gemma4": "Gemma 4's BPE reads raw UTF-8, not bytes",
    "granite-embed-multi-311m": "it is a Gemma 4-style BPE over raw UTF-8, not bytes",
    "sarvam-moe": "Sarvam's BPE reads raw UTF-8, not bytes",
    "whitespace": "a whitespace split over raw UTF-8 is not byte-level BPE",
}


def lookup(pre: str | None) -> PreTokenizer:
    """The pre-tokenizer of a GGUF's `tokenizer.ggml.pre`; a missing name is llama.cpp's
    "default". ValueError naming it for a name llama.cpp refuses or one not supported here."""
    name = pre or "default"
    if name in NOT_SUPPORTED:
        raise ValueError(
            f"GGUF tokenizer.ggml.pre {name!r} is not supported: {NOT_SUPPORTED[name]}"
        )
    if name not in PRE_TOKENIZERS:
        raise ValueError(f"unknown GGUF pre-tokenizer tokenizer.ggml.pre {name!r} (llama.cpp "
                         "refuses it too); its split regex is not known, so tokens would be "
                         "wrong")  # fmt: skip
    return PRE_TOKENIZERS[name]


def build(pre: PreTokenizer) -> pre_tokenizers.PreTokenizer:
    """The `tokenizers` pre-tokenizer: each regex in turn (matches and the text between kept,
    as llama.cpp's split keeps them), then the bytes as GPT-2's characters.

    Two splits take `tokenizers`' native form, as the models' own tokenizer.json files write
    them (SmolLM's, StarCoder's: `Digits`, then `ByteLevel` with its regex): `\\p{N}` is
    `Digits(individual_digits=True)` (the same characters: Rust's `char::is_numeric`), and a
    last regex that is GPT-2's (with or without its final `\\s+`: whitespace nothing else
    matches stays a piece of its own either way) is `ByteLevel`'s own, split and mapped to
    bytes in one pass. Through Oniguruma as a `Split` each, SmolLM2's GGUF encoded ~10 %
    slower (`benchmarks/tokenizer_speed.py`)."""
    splits = list(pre.splits)
    native_gpt2 = bool(splits) and splits[-1] in (GPT2, _GPT2_NO_TAIL)
    if native_gpt2:
        splits.pop()
    steps = [
        pre_tokenizers.Digits(individual_digits=True)
        if r == r"\p{N}"
        else pre_tokenizers.Split(Regex(r), behavior="isolated")
        for r in splits
    ]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=native_gpt2))
    return pre_tokenizers.Sequence(steps)

"""Tiny SentencePiece models trained offline (`SentencePieceTrainer`) on multilingual text, a
hostile text set, and the oracle: transformers' slow SentencePiece tokenizer (it splits the text
at the special tokens and encodes each piece with `SentencePieceProcessor.encode`; transformers'
slow→fast converter needs protobuf, which is not installed here)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import sentencepiece as spm

TEXT = (
    "the quick brown fox jumps over a lazy dog . Hello world , said the model ; "
    "Größe café naïve façade über São Paulo ñandú "
    "東京 日本語 の テキスト です 中文 文本 测试 你好 世界 "
    "Привет мир как дела مرحبا بالعالم नमस्ते "
    "🙂 😀 🚀 x=12345 6789 def main ( ) : return 0"
)
USER_DEFINED = ["<|im_start|>", "<|im_end|>", "<|action|>"]
HOSTILE = [
    "Hello world",
    " Hello",
    "   three leading",
    "two  spaces   and    four",
    "trailing   ",
    "a\n\nb\tc\r\nd",
    "\n leading newline",
    "\t\ttabs",
    "emoji 🙂😀 here 🚀🚀",
    "東京 中文 测试 Größe café",
    "naïve ñ e\u0301 ｆｕｌｌｗｉｄｔｈ \u00a0nbsp",
    "x <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|> z<|im_end|>",
    "<s>bos inside</s> text",
    "1234567 digits 3.14159",
    "",
    " ",
    "   ",
    "ǅ unseen ψ ꙮ \U0001f9ff",
    "\u2581literal meta",
    "<|action|>call<|action|> ",
    "def main():\n    return 0\n",
]


def corpus(lines: int = 2000, seed: int = 0) -> list[str]:
    rng, words = random.Random(seed), TEXT.split(" ")
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) for _ in range(lines)]


def train(kind: str, byte_fallback: bool, **options) -> bytes:
    """A serialized `tokenizer.model` (`kind`: "bpe" or "unigram") with USER_DEFINED pieces;
    `options` override the Llama-2-like defaults (identity normalizer, whitespace kept)."""
    out = io.BytesIO()
    args = dict(
        sentence_iterator=iter(corpus()), model_writer=out, model_type=kind,
        vocab_size=420 if byte_fallback else 300, hard_vocab_limit=False,
        byte_fallback=byte_fallback, user_defined_symbols=USER_DEFINED,
        character_coverage=0.995 if byte_fallback else 1.0,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=True, allow_whitespace_only_pieces=True,
        minloglevel=2, num_threads=1,
    )  # fmt: skip
    args.update(options)
    spm.SentencePieceTrainer.train(**args)
    return out.getvalue()


def write_spm_dir(path: Path, model: bytes, **config) -> dict:
    """`tokenizer.model` and a Llama-2-style tokenizer_config.json (the user-defined pieces
    named special in its added_tokens_decoder, as InternLM3's names them); returns the config."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.model").write_bytes(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    added = {
        str(i): {"content": sp.id_to_piece(i), "special": True, "normalized": False,
                 "lstrip": False, "rstrip": False, "single_word": False}
        for i in range(sp.get_piece_size())
        if sp.is_control(i) or sp.is_unknown(i) or sp.id_to_piece(i) in USER_DEFINED
    }  # fmt: skip
    tcfg = {
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
        "added_tokens_decoder": added,
        "chat_template": "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    }  # fmt: skip
    tcfg.update(config)
    (path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    return tcfg


def slow_tokenizer(path: Path, specials: list[str] = USER_DEFINED):
    """transformers' slow SentencePiece tokenizer (legacy: each text between special tokens
    encoded by `SentencePieceProcessor.encode`) for `path`'s tokenizer.model."""
    from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

    return SentencePieceBackend(
        vocab_file=str(path / "tokenizer.model"), bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", additional_special_tokens=list(specials), legacy=True,
    )  # fmt: skip

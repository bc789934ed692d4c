"""A Kimi-style tiktoken directory for tests (`tiktoken.model`, tokenizer_config.json) and
tiktoken's algorithm written out as the oracle (`tiktoken` is not installed here): the text cut at
special tokens, split by tokenization_kimi.py's regex run by `regex`, each piece merged lowest
rank first. The ranks are a small byte-level BPE trained on tricky text."""

from __future__ import annotations

import base64
import itertools
import json

import regex
from pagoda.runtime.model import tiktoken_files
from tokenizers import Regex, Tokenizer, models, trainers
from tokenizers import pre_tokenizers as hf_pre
from transformers.convert_slow_tokenizer import bytes_to_unicode

PAT = "|".join(tiktoken_files.KIMI.alternatives)  # as tokenization_kimi.py joins them
TEXT = (
    "Hello WORLD's they'RE I'll 12345678 3.14159 x=1000000; 你好，世界！中文Kimi混合TEXT漢字 "
    "こんにちは カタカナ 한국어 😀🎉👍🏽 café Ωmega ΣΑΣ\n\n\n  indented\tTab  \r\n"
    "def f(a, b):\n    return a**2 + b//3  # done!!\n    \n\n"
    "CamelCaseWordsHTTPServer don't DON'T 2024-12-06 $100.00 ...\u3000end   "
)
NAMED = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
         6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
         17: "<|im_middle|>", 254: "[UNK]", 255: "[PAD]"}  # fmt: skip  # K2's, after the ranks
TEMPLATE = (  # Kimi K2's layout
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif m['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    "{{ m['content'] }}<|im_end|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def train_ranks() -> dict[bytes, int]:
    """A byte-level BPE trained on TEXT split by Kimi's regex; ranks in the trainer's order
    (the 256 bytes, then each merge's result), as tiktoken's files hold them."""
    chars = {c: b for b, c in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = hf_pre.Sequence(
        [hf_pre.Split(Regex(PAT), "isolated"),
         hf_pre.ByteLevel(add_prefix_space=False, use_regex=False)]
    )  # fmt: skip
    trainer = trainers.BpeTrainer(
        vocab_size=700, initial_alphabet=hf_pre.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([TEXT, TEXT.lower(), TEXT.upper(), "the quick brown fox " * 3], trainer)
    vocab = tok.get_vocab()
    return {bytes(chars[c] for c in t): i for t, i in sorted(vocab.items(), key=lambda x: x[1])}


def _rank_bpe(ranks: dict[bytes, int], piece: bytes) -> list[int]:
    """tiktoken's merge loop: the whole piece if ranked, else join the adjacent pair whose
    join ranks lowest (leftmost on a tie) until no join is ranked."""
    if piece in ranks:
        return [ranks[piece]]
    parts = [bytes([b]) for b in piece]
    while True:
        ranked = [(ranks[a + b], i) for i, (a, b) in enumerate(itertools.pairwise(parts))
                  if a + b in ranks]  # fmt: skip
        if not ranked:
            return [ranks[p] for p in parts]
        i = min(ranked)[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def tiktoken_encode(ranks: dict[bytes, int], specials: dict[str, int], text: str) -> list[int]:
    """tiktoken's `Encoding.encode(text, allowed_special="all")`, as tokenization_kimi calls it."""
    cut = regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)))
    ids, start = [], 0
    for m in [*(cut.finditer(text) if specials else []), None]:
        end = m.start() if m else len(text)
        for piece in regex.findall(PAT, text[start:end], flags=regex.V1):
            ids += _rank_bpe(ranks, piece.encode())
        if m:
            ids.append(specials[m.group()])
            start = m.end()
    return ids


def write_tiktoken_dir(path, ranks: dict[bytes, int], module: str = "tokenization_kimi") -> dict:
    """tiktoken.model and tokenizer_config.json as Kimi K2's repository has them; returns the
    special tokens' ids by text."""
    lines = [
        f"{base64.b64encode(t).decode()} {r}"
        for t, r in sorted(ranks.items(), key=lambda tr: tr[1])
    ]
    (path / "tiktoken.model").write_text("\n".join(lines) + "\n")
    n = len(ranks)
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    added = {str(n + i): {"content": t, **flags, "special": True} for i, t in NAMED.items()}
    tcfg = {"tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]",
            "pad_token": "[PAD]", "unk_token": "[UNK]", "added_tokens_decoder": added,
            "auto_map": {"AutoTokenizer": [f"{module}.TikTokenTokenizer", None]},
            "chat_template": TEMPLATE}  # fmt: skip
    (path / "tokenizer_config.json").write_text(json.dumps(tcfg))
    specials = {t: n + i for i, t in NAMED.items()}
    specials |= {f"<|reserved_token_{i}|>": i for i in range(n, n + 258) if i - n not in NAMED}
    return specials

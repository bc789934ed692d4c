"""A Llama-2-style SentencePiece tokenizer built offline with `tokenizers` (imported by tests)."""

from __future__ import annotations

import json

from pagoda.runtime.model.tokenizer import Tokenizer
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, trainers

TEXT = "Hello world, the capital of France is Paris. naïve café 日本語 🙂🎉 ok fine. " * 4
BYTE_IDS = range(3, 259)  # <0x00>..<0xFF>


def byte_fallback_tokenizer() -> Tokenizer:
    """BPE with byte fallback (<0x00>..<0xFF> in the vocabulary after <unk> <s> </s>), "▁" for
    spaces and a prefix one, Strip in the decoder: Llama 2's tokenizer.json, trained on TEXT."""
    tok = HFTokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator([TEXT], trainer)
    data = json.loads(tok.to_str())
    trained = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    names = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    names += [t for t, _ in trained if t not in names]
    data["model"]["vocab"] = {t: i for i, t in enumerate(names)}
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    data["decoder"] = json.loads(
        decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)]).__getstate__()
    )
    hf = HFTokenizer.from_str(json.dumps(data))
    return Tokenizer(hf, chat_template=None, bos_token_id=1, eos_token_ids=(2,))

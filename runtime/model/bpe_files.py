"""Tokenizers shipped as GPT-2's two files, `vocab.json` and `merges.txt`, without a
tokenizer.json (OPT's checkpoints, older GPT-2 and BLOOM-era ones): built as transformers 5's
`GPT2Tokenizer` builds its `tokenizers` backend from them (a byte-level BPE, no subword prefix
or suffix, `add_prefix_space` from tokenizer_config.json, the byte-level decoder), so encode,
decode, streaming and chat templates take the path every tokenizer.json takes. The special
tokens tokenizer_config.json (or special_tokens_map.json) names (`bos_token`, `eos_token`,
`unk_token`, `pad_token`, `added_tokens_decoder`; bos/eos/unk named by neither file are
GPT2Tokenizer's default `<|endoftext|>`, where the vocabulary has it) are added as special:
never split, skipped when decoding. Whether a
prompt gets BOS first is tokenizer_config.json's `add_bos_token` (OPT's `</s>`), as the loader
reads it for any tokenizer without a post-processor (`hf_loader._adds_bos`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

VOCAB, MERGES, SPECIAL_MAP = "vocab.json", "merges.txt", "special_tokens_map.json"
_NAMED = ("bos_token", "eos_token", "unk_token", "pad_token")
# what transformers' GPT2Tokenizer takes for a token neither file names (None: named null)
_DEFAULTS = dict.fromkeys(("bos_token", "eos_token", "unk_token"), "<|endoftext|>")


def has_bpe_files(model_dir: Path) -> bool:
    return (model_dir / VOCAB).exists() and (model_dir / MERGES).exists()


def _content(entry: Any) -> str | None:
    """A special token's text: tokenizer_config.json writes a string or an AddedToken dict."""
    if isinstance(entry, Mapping):
        entry = entry.get("content")
    return entry if isinstance(entry, str) and entry else None


def _special_map(model_dir: Path) -> Mapping[str, Any]:
    """special_tokens_map.json's object (OPT's names its tokens there), or {}."""
    from pagoda.runtime.model.template_files import read_json_object

    return read_json_object(model_dir / SPECIAL_MAP)


def read_bpe_dir(model_dir: Path, tcfg: Mapping[str, Any]) -> Tokenizer:
    """The `tokenizers.Tokenizer` of a directory's vocab.json and merges.txt (module
    docstring); ValueError, one line, for files `tokenizers` cannot read."""
    try:
        vocab = json.loads((model_dir / VOCAB).read_text(encoding="utf-8"))
        model = models.BPE.from_file(str(model_dir / VOCAB), str(model_dir / MERGES),
                                     dropout=None, continuing_subword_prefix="",
                                     end_of_word_suffix="", fuse_unk=False)  # fmt: skip
    except Exception as e:  # JSON's, tokenizers' own: one line either way
        raise ValueError(f"{VOCAB} / {MERGES} are unreadable: {e}") from None
    tok = Tokenizer(model)
    add_prefix_space = bool(tcfg.get("add_prefix_space", False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    added = tcfg.get("added_tokens_decoder") or {}
    if not isinstance(added, Mapping):
        raise ValueError("tokenizer_config.json added_tokens_decoder is not an object")
    special: dict[str, bool] = {}
    named = _special_map(model_dir)  # (transformers reads both; tokenizer_config.json wins)
    for name in _NAMED:  # GPT2Tokenizer's default for the three it names: <|endoftext|>
        text = _content(tcfg.get(name, named.get(name, _DEFAULTS.get(name))))
        if text is not None and text in vocab:
            special[text] = True
    for _, entry in sorted(added.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
        text = _content(entry)
        if text is not None:
            special.setdefault(
                text, bool(entry.get("special", True)) if isinstance(entry, Mapping) else True
            )
    tok.add_special_tokens([AddedToken(t, special=True) for t, s in special.items() if s])
    tok.add_tokens([AddedToken(t, special=False) for t, s in special.items() if not s])
    return tok

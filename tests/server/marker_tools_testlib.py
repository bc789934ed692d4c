"""A vocabulary with harmony's and DeepSeek's call markers as special tokens (SmolLM2's
byte-level BPE and those tokens after it), and a tiny random checkpoint that uses it: what
`tool_choice` required / named is tested on for `--tool-call-parser openai|deepseek_v3|
deepseek_v31` (`tool_markers.py`)."""

from __future__ import annotations

import json

HARMONY = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|call|>",
           "<|return|>"]  # fmt: skip
DEEPSEEK = ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜end▁of▁sentence｜>"]  # fmt: skip
STOPS = ["<|call|>", "<|return|>", "<｜end▁of▁sentence｜>"]  # gpt-oss's and DeepSeek's EOS
# gpt-oss's prompt end (harmony_testlib's template, its tools in a developer message)
TEMPLATE = (
    "<|start|>system<|message|>Reasoning: medium<|end|>"
    "{%- if tools %}<|start|>developer<|message|># Tools\n{% for t in tools %}"
    "type {{ t.function.name }} = (_: {{ (t.function.parameters or {}) | tojson }}) => any;\n"
    "{% endfor %}<|end|>{%- endif %}"
    "{%- for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def marker_backend():
    """SmolLM2's `tokenizers.Tokenizer` with the markers added as special tokens."""
    import structured_testlib
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer.from_str(structured_testlib.smol_tokenizer().backend.to_str())
    tok.add_special_tokens([AddedToken(t, special=True) for t in HARMONY + DEEPSEEK])
    return tok


def marker_tokenizer():
    """`marker_backend` as the runtime's Tokenizer, its stop tokens `STOPS`."""
    from pagoda.runtime.model.tokenizer import Tokenizer

    backend = marker_backend()
    return Tokenizer(backend, chat_template=TEMPLATE, bos_token_id=None,
                     eos_token_ids=[backend.token_to_id(t) for t in STOPS])  # fmt: skip


def write_marker_model(path) -> None:
    """A tiny random Qwen3 checkpoint with `marker_backend`'s vocabulary and `TEMPLATE`."""
    import torch
    import transformers

    backend = marker_backend()
    eos = [backend.token_to_id(t) for t in STOPS]
    config = transformers.Qwen3Config(
        vocab_size=backend.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        max_position_embeddings=1024, eos_token_id=eos, bos_token_id=None,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(path)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))

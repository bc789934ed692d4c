"""Hugging Face directories (config.json + safetensors + tokenizer.json) for Llama, Mistral and
Qwen2, with rope scaling variants: greedy tokens and logits match transformers."""

from __future__ import annotations

import json

import pytest
import torch
from hf_oracle import hf_greedy
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model
from tokenizers import Tokenizer, models, pre_tokenizers

transformers = pytest.importorskip("transformers")

BASE = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rope_theta=10000.0,
    eos_token_id=2,
    bos_token_id=1,
)
CASES = {
    "llama-llama3-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
    ),
    "llama-linear-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
    ),
    "llama-yarn-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "qwen2-tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
}


def write_tokenizer(path) -> None:
    vocab = {f"w{i}": i for i in range(300)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    template = "{% for m in messages %}w3 {{ m['content'] }} w4 {% endfor %}"
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))


@pytest.mark.parametrize("case", list(CASES))
def test_hf_directory_matches_transformers(tmp_path, case):
    cfg_cls, model_cls, extra = CASES[case]
    torch.manual_seed(0)
    config = getattr(transformers, cfg_cls)(**BASE, **extra)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # random init is too flat to make greedy decoding meaningful
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    model.save_pretrained(tmp_path)
    write_tokenizer(tmp_path)

    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == case.split("-")[0]
    assert loaded.config.attention_bias == (case.startswith("qwen2"))
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=64)
    prompts = [[(7 * i + 3) % 300 for i in range(n)] for n in (5, 150)]
    seen = {}
    llm.engine.runner.logits_observer = lambda reqs, lg: [
        seen.setdefault(r.request_id, []).append(row.clone()) for r, row in zip(reqs, lg)
    ]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
    )
    for out, p in zip(outs, prompts):
        ref_tokens, ref_logits = hf_greedy(model, p, 6)
        assert out.outputs[0].token_ids == ref_tokens
        worst = max(float((a - b).abs().max()) for a, b in zip(seen[out.request_id], ref_logits))
        assert worst < 1e-3
    assert llm.tokenizer.apply_chat_template([{"role": "user", "content": "w9"}]) == "w3 w9 w4 "


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture"):
        load_model(str(tmp_path))


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="neither a built-in name"):
        load_model("no-such-model")

"""Hugging Face directories (config.json + safetensors + tokenizer.json) for Llama, Mistral and
Qwen2, with rope scaling variants: greedy tokens and logits match transformers."""

from __future__ import annotations

import json

import pytest
from hf_oracle import hf_greedy, make_tiny_llama
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

transformers = pytest.importorskip("transformers")

CASES = {
    "llama-llama3-rope": (
        "Llama",
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
        "Llama",
        dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
    ),
    "llama-yarn-rope": (
        "Llama",
        dict(
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
    ),
    "mistral": ("Mistral", dict(sliding_window=None)),
    "qwen2-tied": ("Qwen2", dict(tie_word_embeddings=True)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hf_directory_matches_transformers(tmp_path, case):
    arch, extra = CASES[case]
    model = make_tiny_llama(tmp_path, arch=arch, **extra)

    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == case.split("-")[0]
    assert loaded.config.attention_bias == (case.startswith("qwen2"))
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=64)
    prompts = [[(7 * i + 3) % 300 for i in range(n)] for n in (5, 150)]
    seen = {}
    llm.engine.runner.logits_hook = lambda reqs, lg: [
        seen.setdefault(r.request_id, []).append(row.clone()) for r, row in zip(reqs, lg.float())
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


@pytest.mark.parametrize("case", ["llama-llama3-rope", "qwen2-tied"])  # qwen2: biases, tied head
def test_a_bf16_directory_runs_on_its_16_bit_weights_in_float32(tmp_path, case):
    """A float32 CPU engine (no native bf16) reads a bf16 checkpoint's matrices in place through
    `qgemm` (2 bytes a weight) and computes transformers' float32 model of those weights."""
    import torch
    from pagoda.runtime.cpu import qgemm

    if qgemm.load() is None:
        pytest.skip("no C++ compiler or no AVX2 + FMA + F16C here")
    arch, extra = CASES[case]
    model = make_tiny_llama(tmp_path, arch=arch, **extra).to(torch.bfloat16)
    model.save_pretrained(tmp_path)  # the same directory, now with bf16 safetensors
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_memory=8 << 20)
    linears = llm.engine.runner.model.linears()
    assert {getattr(x.fast, "kinds", None) for x in linears} == {("BF16",)}
    assert all(x.weight is None and x.packed is None for x in linears)  # no float32 copies
    seen = {}
    llm.engine.runner.logits_hook = lambda reqs, lg: [
        seen.setdefault(r.request_id, []).append(row.clone()) for r, row in zip(reqs, lg.float())
    ]
    prompt = [(5 * i + 1) % 300 for i in range(40)]
    (out,) = llm.generate(
        {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    )
    # loaded afresh: `model.float()` would keep the rotary frequencies rounded to bf16
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ref_tokens, ref_logits = hf_greedy(ref, prompt, 6)
    assert out.outputs[0].token_ids == ref_tokens
    assert max(float((a - b).abs().max()) for a, b in zip(seen[out.request_id], ref_logits)) < 1e-3


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["T5ForConditionalGeneration"]})
    )
    with pytest.raises(ValueError, match="unsupported architecture"):
        load_model(str(tmp_path))


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="neither a built-in name"):
        load_model("no-such-model")


@pytest.mark.parametrize("key", ["num_attention_heads", "hidden_size", "vocab_size"])
def test_a_config_without_a_required_field_names_it(tmp_path, key):
    make_tiny_llama(tmp_path, arch="Llama")
    config = json.loads((tmp_path / "config.json").read_text())
    del config[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"config.json lacks '{key}', which a llama model needs"):
        load_model(str(tmp_path))

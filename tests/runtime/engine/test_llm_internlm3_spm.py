"""`LLM.chat` on a tiny InternLM3 laid out as internlm/internlm3-8b-instruct is: config.json
naming `InternLM3ForCausalLM` with its `qkv_bias` / `bias`, no tokenizer.json, a SentencePiece
`tokenizer.model` and a tokenizer_config.json whose `auto_map` names `tokenization_internlm3.py`
(not run: `model/spm_files.py` rebuilds it). The prompt is transformers' slow tokenizer's ids of
the rendered chat, the answer transformers' greedy tokens."""

from __future__ import annotations

import json

import pytest
import sentencepiece as spm
import torch
import transformers
from hf_oracle import drop_tokenizer, hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM
from pagoda.runtime.sampling.params import SamplingParams
from sentencepiece_testlib import slow_tokenizer, train, write_spm_dir


@pytest.mark.slow
def test_llm_chat_on_an_internlm3_with_only_a_tokenizer_model(tmp_path):
    model_bytes = train("bpe", True)
    n = spm.SentencePieceProcessor(model_proto=model_bytes).get_piece_size()
    make_tiny_model(tmp_path, "InternLM3", scale=6.0, vocab_size=n, head_dim=32,
                    attention_bias=True, mlp_bias=True)  # fmt: skip
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["InternLM3ForCausalLM"]
    cfg["qkv_bias"], cfg["bias"] = cfg.pop("attention_bias"), cfg.pop("mlp_bias")
    cfg["rope_theta"] = (cfg.pop("rope_parameters", None) or {}).get("rope_theta", 10000.0)
    cfg["rope_scaling"] = None  # the hub's config.json: the older rotary keys
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    # the oracle: transformers reading the hub-shaped config.json back
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    drop_tokenizer(tmp_path)
    write_spm_dir(
        tmp_path, model_bytes, tokenizer_class="InternLM3Tokenizer",
        auto_map={"AutoTokenizer": ["tokenization_internlm3.InternLM3Tokenizer", None]},
    )  # fmt: skip
    messages = [{"role": "user", "content": " 你好  Größe 🙂\n\tx=12345"}]
    rendered = "<s><|im_start|>user\n 你好  Größe 🙂\n\tx=12345<|im_end|>\n<|im_start|>assistant\n"
    prompt = slow_tokenizer(tmp_path).encode(rendered, add_special_tokens=False)
    want, _ = hf_greedy_plain(model, prompt, 8)
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=128, kv_cache_memory=8 << 20)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    (result,) = llm.chat(messages, params, use_tqdm=False)
    assert result.prompt_token_ids == prompt
    assert list(result.outputs[0].token_ids) == want

"""Special tokens a checkpoint names outside config.json: the end-of-turn token only
tokenizer_config.json names (its `eos_token`) stops generation, as vLLM stops at the
tokenizer's EOS; generation_config.json's ids add to config.json's; a GGUF stops at every
end-of-generation id llama.cpp reads; a chat template's `bos_token` / `eos_token` are
tokenizer_config.json's strings, as transformers renders them."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model import gguf_loader
from pagoda.runtime.model.gguf_reader import open_reader
from pagoda.runtime.model.loader import load_model, read_tokenizer

transformers = pytest.importorskip("transformers")
PROMPT = [(7 * i + 3) % 290 + 5 for i in range(30)]


def _tokenizer_config(path, **fields) -> None:
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**cfg, **fields}))


def test_eos_named_only_by_tokenizer_config_stops_generation(tmp_path):
    model = make_tiny_model(tmp_path, "Qwen3", head_dim=64)  # config.json: eos 2
    greedy = hf_greedy_plain(model, PROMPT, 6)[0]
    eos = {"content": f"w{greedy[2]}", "special": True, "__type": "AddedToken"}
    _tokenizer_config(tmp_path, eos_token=eos)
    gen = {"eos_token_id": [greedy[4]]}  # generation_config.json's ids join config.json's
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    assert transformers.AutoTokenizer.from_pretrained(tmp_path).eos_token_id == greedy[2]
    loaded = load_model(str(tmp_path))
    assert loaded.config.eos_token_ids == (greedy[4], 2, greedy[2])
    assert read_tokenizer(str(tmp_path)).eos_token_ids == loaded.config.eos_token_ids
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0, max_tokens=6))
    assert out[0].outputs[0].token_ids == greedy[:3]
    assert out[0].outputs[0].finish_reason == "stop"


TEMPLATE = "[{{ bos_token }}|{{ eos_token }}]{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.mark.parametrize(
    "fields",
    [
        {"bos_token": None, "eos_token": "w7"},  # Qwen's null BOS beside config's bos_token_id
        {"bos_token": {"content": "w8", "__type": "AddedToken"},
         "eos_token": {"content": "w9", "special": True, "__type": "AddedToken"}},
    ],
)  # fmt: skip
def test_template_bos_and_eos_are_tokenizer_config_strings(tmp_path, fields):
    make_tiny_model(tmp_path, "Qwen3", head_dim=64)  # config.json: bos 1, eos 2
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(fields))
    (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
    messages = [{"role": "user", "content": "w5"}]
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    want = hf.apply_chat_template(messages, tokenize=False)
    tok = read_tokenizer(str(tmp_path))
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == want
    assert want != "[w1|w2]w5"  # not the text of config.json's ids
    got = LLM(model=str(tmp_path), dtype="float32", kv_cache_memory=8 << 20).get_tokenizer()
    assert (got.bos_token, got.eos_token) == (hf.bos_token, hf.eos_token)
    assert (got.bos_token_id, got.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)


def test_gguf_stops_at_eos_eot_and_eom(tmp_path):
    """llama.cpp's end-of-generation ids: tokenizer.ggml.eos_token_id, eot_token_id and
    eom_token_id (Llama 3.1's <|eom_id|>)."""
    path = tmp_path / "ids.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list([f"t{i}" for i in range(10)])
    w.add_token_types([1] * 10)
    w.add_token_merges([])
    w.add_eos_token_id(2)
    w.add_eot_token_id(5)
    w.add_uint32("tokenizer.ggml.eom_token_id", 6)
    w.add_tensor("token_embd.weight", np.zeros((10, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = open_reader(path)
    assert gguf_loader.read_config(reader).eos_token_ids == (2, 5, 6)

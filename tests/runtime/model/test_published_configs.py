"""Published config.json files of the Mistral 3 / Ministral checkpoints as they are on the hub
(sparse: what transformers' config classes fill in is left out), read as transformers reads
them, and the chat template rendered with what they imply."""

from __future__ import annotations

import json

import pytest
from hf_oracle import save_word_tokenizer
from pagoda.runtime.model.hf_loader import read_tokenizer
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")

# mistralai/Mistral-Small-3.1-24B-Instruct-2503's config.json (3.2-2506's and Magistral-Small-
# 2509's alike), shrunk: its text_config names no BOS nor EOS id
PIXTRAL = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "head_dim": 16,
           "num_attention_heads": 2, "num_hidden_layers": 1, "image_size": 28, "patch_size": 14}  # fmt: skip
MISTRAL_SMALL_3_1 = {
    "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
    "image_token_index": 10, "multimodal_projector_bias": False, "projector_hidden_act": "gelu",
    "spatial_merge_size": 2, "vision_feature_layer": -1, "vision_config": PIXTRAL,
    "text_config": {"model_type": "mistral", "head_dim": 16, "hidden_act": "silu",
                    "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 131072,
                    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
                    "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0, "sliding_window": None,
                    "vocab_size": 300},
}  # fmt: skip
# the processor's chat template opens with `bos_token` (chat_template.json)
TEMPLATE = ("{{- bos_token }} {% for m in messages %}{{ 'w3 ' + m['content'] + ' w4 ' }}"
            "{% endfor %}")  # fmt: skip


@pytest.mark.parametrize("text_type", ["mistral", "ministral"])
def test_a_mistral3_text_config_without_ids_reads_transformers_bos_and_eos(tmp_path, text_type):
    """Mistral-Small-3.1's text_config has no bos_token_id / eos_token_id (nor a
    generation_config.json here): MistralConfig's (and MinistralConfig's) 1 and 2, so that the
    template's `bos_token` is <s>'s and the prompt starts with BOS, as transformers renders it."""
    cfg = json.loads(json.dumps(MISTRAL_SMALL_3_1))
    cfg["text_config"]["model_type"] = text_type
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).get_text_config()
    ours = read_model_config(str(tmp_path))
    assert (ours.bos_token_id, list(ours.eos_token_ids)) == (1, [2])
    assert (ours.bos_token_id, ours.eos_token_ids[0]) == (theirs.bos_token_id, theirs.eos_token_id)
    save_word_tokenizer(tmp_path, 300)
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    tok = read_tokenizer(tmp_path, ours)
    text = tok.apply_chat_template([{"role": "user", "content": "w9"}])
    assert tok.encode(text, add_special_tokens=False) == [1, 3, 9, 4]

"""NanoChat (`NanoChatForCausalLM`) against transformers, token for token and logits within 1e-3
(float32), on tiny random checkpoints transformers writes itself: prompts chunked into 16-token
steps, three prompts sharing steps, a warm prefix cache, and a pool small enough to preempt.
Weightless RMSNorms (the embeddings' too), the rotary turning the other way, weightless q/k
norms after it, `fc2(relu(fc1(x))²)`, the logits soft-capped (a cap small enough to change the
picks); nanochat-nocap: no cap, one KV head. Also the weights estimate at one and two ranks
(its layers split as Llama's: heads and widths; the norms and the rotary are each rank's own).
"""

from __future__ import annotations

import json

import pytest
from arch_cases import (
    built_fixture,
    case_fixture,
    gpu_test,
    greedy_test,
)
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
CASES = {
    "nanochat": dict(final_logit_softcapping=2.0, head_dim=16),
    "nanochat-nocap": dict(final_logit_softcapping=None, num_key_value_heads=1),
}


def write_case(name: str, path):
    return make_tiny_model(path, "NanoChat", **CASES[name], eos_token_id=2, pad_token_id=0)


built = built_fixture(write_case)


case = case_fixture(CASES)
test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_estimate_is_what_the_model_holds(built, tp):
    from model_bytes import check_estimate

    check_estimate(built("nanochat")[0], tp)


def test_sparse_config_reads_as_transformers(tmp_path):
    """A config.json naming the shape alone: NanoChatConfig's ReLU², cap 15, untied head."""
    cfg = dict(architectures=["NanoChatForCausalLM"], model_type="nanochat", hidden_size=64,
               intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               vocab_size=300)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    c = read_model_config(str(tmp_path))
    f = c.family
    assert f.final_logit_softcapping == theirs.final_logit_softcapping == 15.0
    assert f.hidden_act == "relu2" and not f.gated_mlp and not c.tie_word_embeddings
    assert c.num_kv_heads == theirs.num_key_value_heads == 4
    assert c.rms_norm_eps == theirs.rms_norm_eps


test_gpu_matches_transformers_with_graphs = gpu_test()

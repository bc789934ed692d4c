"""The new families' forward passes queue no device-to-host sync, checked on a CPU (DeepSeek-V2/V3,
gpt-oss, GLM-4, Cohere, Cohere 2, SmolLM3, OLMo 3, GLM-4.5, Llama 4, EXAONE 4, ERNIE 4.5 MoE,
Hunyuan MoE, PhiMoE, AfMoE, Zamba2, Gemma 4).

On CUDA a decode step is replayed from a CUDA graph and every other step is launched without
waiting for the device; an ``.item()``, a ``.tolist()``, a data-dependent shape (``nonzero``,
``masked_select``, ``unique``) or a Python branch on a tensor's value in a model's forward
would stall the step (and break graph capture). Here each family's tiny checkpoint runs on the
Triton backend (its kernels in Triton's interpreter: the CUDA path's launchers) while a torch
dispatch mode records the aten ops that synchronize on CUDA, in `LlamaModel.forward` only (the
readback and the scheduler's host work are outside it). The experts run as on CUDA: gpt-oss's
in the fused-MoE kernel, the routed experts of the other families densely (no per-expert
counts read on the host, as `moe.masked_experts` runs them without the fused kernel).
"""

from __future__ import annotations

import os

import pytest
from arch_cases import prompts
from hf_oracle import _LM_CLASSES, make_tiny_model
from hybrid_cases import CASES as HYBRID_CASES
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model
from sync_watch import SyncWatch

pytestmark = [
    pytest.mark.slow,  # the Triton interpreter: ~3-6 s a family
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 on a CPU"
    ),
]

_LM_CLASSES.setdefault("Llama4Text", "Llama4ForCausalLM")  # as test_llama4.py
_LM_CLASSES.setdefault("Gemma4Text", "Gemma4ForCausalLM")
MLA = dict(kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, num_key_value_heads=4)
FAMILIES = {
    "deepseek-v3": ("DeepseekV3", dict(MLA, q_lora_rank=24, v_head_dim=64, n_routed_experts=8,
                    num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                    n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1)),
    "deepseek-v2-lite": ("DeepseekV2", dict(MLA, q_lora_rank=None, v_head_dim=32,
                         n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=2,
                         moe_intermediate_size=32, first_k_dense_replace=1)),
    "gpt-oss": ("GptOss", dict(num_local_experts=4, num_experts_per_tok=2, head_dim=32,
                intermediate_size=64, sliding_window=9,
                layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2)),
    "glm4": ("Glm4", dict(head_dim=32)),
    "cohere": ("Cohere", dict(use_qk_norm=True, attention_bias=True)),
    "cohere2": ("Cohere2", dict(num_hidden_layers=4, sliding_window=10, sliding_window_pattern=2)),
    "smollm3": ("SmolLM3", dict(num_hidden_layers=4, no_rope_layer_interval=2,
                use_sliding_window=True, sliding_window=10)),
    "olmo3": ("Olmo3", dict(num_hidden_layers=4, sliding_window=10)),
    "glm45": ("Glm4Moe", dict(use_qk_norm=True, attention_bias=True, head_dim=32,
              n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
              routed_scaling_factor=2.5, norm_topk_prob=True, n_shared_experts=1,
              moe_intermediate_size=32, first_k_dense_replace=1, num_hidden_layers=3)),
    "llama4": ("Llama4Text", dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size=32,
               intermediate_size_mlp=96, num_hidden_layers=4, head_dim=16,
               no_rope_layer_interval=2, interleave_moe_layer_step=1, use_qk_norm=True,
               attn_temperature_tuning=True, floor_scale=8, attn_scale=0.5,
               attention_chunk_size=128)),
    "exaone4": ("Exaone4", dict(num_hidden_layers=4, sliding_window=10, sliding_window_pattern=2)),
    # the new MoE families whose layers or routers add ops of their own (MiniMax-M2, dots.llm1,
    # EXAONE MoE and FlexOlmo only reuse ones checked here)
    "ernie45-moe": ("Ernie4_5_Moe", dict(moe_num_experts=8, moe_k=2, moe_intermediate_size=32)),
    "hunyuan-moe": ("HunYuanMoEV1", dict(num_experts=8, moe_topk=2, head_dim=16, rope_parameters={
                    "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 1e4})),
    "phimoe": ("Phimoe", dict(num_local_experts=8, head_dim=16, attention_bias=True,
               lm_head_bias=True, router_jitter_noise=0.3, sliding_window=11)),
    "afmoe": ("Afmoe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
              head_dim=32, num_hidden_layers=4, sliding_window=11, global_attn_every_n_layers=2,
              mup_enabled=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    # Zamba2's forward of its own: shared blocks over the kept embeddings, LoRA adapters
    # (tests/runtime/hybrid_cases.py)
    "zamba2": HYBRID_CASES["zamba2"],
    # per-layer inputs, head sizes 16 and 32, KV-shared layers (keys as values), the MoE block
    "gemma4": ("Gemma4Text", dict(num_hidden_layers=3, head_dim=16, global_head_dim=32,
               layer_types=["sliding_attention", "full_attention", "full_attention"],
               sliding_window=10, hidden_size_per_layer_input=8, vocab_size_per_layer_input=300,
               num_kv_shared_layers=1, attention_k_eq_v=True, num_global_key_value_heads=1,
               enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)),
}  # fmt: skip


def dense_experts(x, topk_weights, topk_ids, expert):
    """`moe.grouped_experts` without the host's per-expert counts (`moe.masked_experts`: every
    expert over every row, weighted by a scattered [T, E] routing matrix)."""
    from pagoda.runtime.model.moe import masked_experts

    n = len(expert.__self__.experts)  # the layer's (`SparseMoE`) experts
    return masked_experts(x, topk_weights.float(), topk_ids, expert, n)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_forward_queues_no_host_sync(tmp_path, monkeypatch, family):
    from pagoda.kernels.fused_moe import fused_experts
    from pagoda.runtime.model import gpt_oss, llama4, moe

    arch, overrides = FAMILIES[family]
    make_tiny_model(tmp_path, arch, **overrides)
    monkeypatch.setattr(moe, "grouped_experts", dense_experts)
    monkeypatch.setattr(llama4, "grouped_experts", dense_experts)
    monkeypatch.setattr(gpt_oss, "fused_kernel", lambda device: fused_experts)
    llm = LLM(loaded=load_model(str(tmp_path)), attention_backend="triton", dtype="float32",
              kv_cache_memory=16 << 20, max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    model = llm.engine.runner.model
    forward, seen, calls = model.forward, [], [0]

    mixed = [0]
    schedule = llm.engine.scheduler.schedule

    def scheduled():
        out = schedule()
        mixed[0] += 0 < out.num_decodes < len(out.scheduled)  # decodes beside a chunk
        return out

    llm.engine.scheduler.schedule = scheduled

    def watched(*args, **kwargs):
        with SyncWatch() as watch:
            out = forward(*args, **kwargs)
        seen.extend(watch.seen)
        calls[0] += 1
        return out

    monkeypatch.setattr(model, "forward", watched)
    # chunked prompts (30 tokens: past every window), mixed steps (a decode beside the other's
    # chunk), decodes; the Triton interpreter's cost is per step, so few of them
    p = prompts()
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p[0][:30]}, {"prompt_token_ids": p[1][:20]}], params)
    assert calls[0] > 5 and mixed[0] > 0
    assert not seen, f"{family}: {sorted(set(seen))} in the forward"

"""LongCat-Flash (`LongcatFlashForCausalLM`, model/longcat_flash.py) against transformers 5's
modeling_longcat_flash.py: a tiny checkpoint of two layers (four latent-attention sublayers with
LoRA scales, each with its own KV cache), the shortcut MoE whose router picks among real and
zero experts (correction biases drawn so that both kinds are picked). Greedy tokens and logits as
transformers', in a batch of unequal prompts over 16-token steps (chunked prefill), on a warm
prefix cache and preempted; the published config read as transformers reads it, a missing
tensor refused in one line, the weights estimate; two tensor-parallel ranks as transformers
(FP8 is refused by family_options' row, walked in tests/runtime/test_family_options.py)."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import (
    NEW,
    check_chunked_cached_batched,
    check_preempted,
    check_two_ranks,
    gpu_test,
    prompts,
)
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")

CONFIG = dict(
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, ffn_hidden_size=96, expert_ffn_hidden_size=32,
    n_routed_experts=4, zero_expert_num=3, moe_topk=3, q_lora_rank=32, kv_lora_rank=16,
    qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8, v_head_dim=16, routed_scaling_factor=1.5,
)  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = tmp_path_factory.mktemp("longcat")
    model = make_tiny_model(path, "LongcatFlash", **CONFIG)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # choice-only biases that move the picks between real and zero experts
        for layer in model.model.layers:
            bias = layer.mlp.router.e_score_correction_bias
            bias.copy_(0.3 * torch.randn(bias.shape, generator=g))
    model.save_pretrained(path)
    reference = [hf_greedy_plain(model, p, NEW) for p in prompts()]
    return path, model, load_model(str(path)), reference


def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(built):
    _, model, loaded, reference = built
    picks = []  # both kinds of expert are picked on these prompts
    hook = model.model.layers[0].mlp.router.register_forward_hook(
        lambda m, i, out: picks.append(out[2]))  # fmt: skip
    with torch.no_grad():
        model(torch.tensor([prompts()[0]]))
    hook.remove()
    assert (picks[0] >= 4).any() and (picks[0] < 4).any()
    check_chunked_cached_batched(loaded, reference, "longcat_flash")
    check_preempted(loaded, reference, "longcat_flash")


def test_published_config_reads_as_transformers(tmp_path):
    """LongCat-Flash-Chat's config.json (its shape, the keys transformers' defaults leave
    out): sublayers, widths, routing and the weights estimate of the 560B model as
    transformers counts its parameters on the meta device."""
    cfg = dict(architectures=["LongcatFlashForCausalLM"], model_type="longcat_flash",
               vocab_size=131072, hidden_size=6144, ffn_hidden_size=12288,
               expert_ffn_hidden_size=2048, num_layers=28, num_attention_heads=64,
               kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
               v_head_dim=128, n_routed_experts=512, zero_expert_num=256, moe_topk=12,
               routed_scaling_factor=6.0, zero_expert_type="identity", router_bias=False,
               max_position_embeddings=131072, rope_theta=10000000.0, rms_norm_eps=1e-5,
               attention_method="MLA", mla_scale_q_lora=True, mla_scale_kv_lora=True)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = read_model_config(str(tmp_path))
    want = transformers.AutoConfig.from_pretrained(str(tmp_path))
    f = c.family
    assert (c.num_layers, c.num_kv_layers) == (want.num_hidden_layers,) * 2 == (56, 56)
    assert (c.intermediate_size, f.moe_intermediate_size) == (12288, 2048)
    assert (f.num_experts, f.routing.zero_experts, f.num_experts_per_tok) == (512, 256, 12)
    assert f.routing.routed_scaling_factor == 6.0 and not f.norm_topk_prob
    assert c.rope_theta == want.rope_parameters["rope_theta"]
    assert (c.head_dim, c.num_kv_heads) == (512 + 64, 1)  # one latent row a token and sublayer
    from pagoda.runtime.server.weights import from_shapes

    with torch.device("meta"):  # transformers' own count
        model = transformers.AutoModelForCausalLM.from_config(want)
    params = sum(p.numel() for p in model.parameters())
    assert params == 560_664_958_976  # (the model card's 560B)
    routers = 28 * (512 + 256) * (6144 + 1)  # held in float32 (their correction biases too)
    assert from_shapes(c, torch.bfloat16, False) == (params + 28 * 768) * 2 + routers * 2


def test_a_missing_tensor_is_refused_in_one_line_in_the_files_names(built, tmp_path):
    from safetensors.torch import load_file, save_file

    path = built[0]
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.self_attn.1.q_b_proj.weight"]
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.1\.self_attn\.1\.q_b_proj") as e:
        load_model(str(tmp_path))
    assert "\n" not in str(e.value)


def test_the_weights_estimates_are_what_the_model_holds(built):
    """From the shapes alone (`from_shapes`), and from the checkpoint's tensors (bf16)."""
    from model_bytes import check_estimate
    from pagoda.runtime.server.weights import from_shapes

    check_estimate(built[0], rel=0)

    c = read_model_config(str(built[0]))
    held = sum(p.numel() for p in built[1].parameters())
    held += sum(b.numel() for n, b in built[1].named_buffers() if "correction_bias" in n)
    assert from_shapes(c, torch.float32, False) == held * 4


@pytest.fixture(scope="module")
def case(built):
    return ("longcat_flash", *built)


def _zero_experts_in_the_fused_kernel(name, runner):
    """The shortcut MoE's real experts run the fused kernel, the zero picks as its id -1."""
    assert runner.model.layers[0].shortcut.routed.fused is not None, name


# on CUDA (benchmarks/gpu_check.sh's families3): CUDA graphs, the fused kernel's none_ids
test_gpu_matches_transformers_with_graphs = gpu_test(_zero_experts_in_the_fused_kernel)


@pytest.mark.slow  # a second process (gloo): ~5 s on 2 busy cores
def test_two_ranks_match_transformers(built):
    """Two ranks: each sublayer's latent attention by heads, the dense MLPs and the routed
    experts by width, the zero experts' identity added once after the experts' sum;
    transformers' tokens and logits chunked, preempted and on a warm cache, rank 0's weights
    as the estimate counts them."""
    from model_bytes import check_estimate

    path, _, loaded, reference = built
    check_two_ranks(path, loaded, reference, "longcat_flash")
    check_estimate(path, 2, rel=0)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_from_shapes_as_from_its_tensors(built, tp):
    """`fit`'s count from config.json alone (`from_shapes`, 16 bits, one rank's share) against
    the headers' as CUDA holds them: the sublayers' latent attention by heads
    (kv_b as the absorbed W_UK and W_UV), the MLPs and experts by width, the routers in float32."""
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path = built[0]
    mc = read_model_config(str(path))
    ckpt = weights.read_checkpoint(path, mc.architecture)
    got, _ = weights.resident(ckpt, mc, Placement(torch.bfloat16, "cuda", tp, None))
    assert got == weights.from_shapes(mc, torch.bfloat16, False, tp)

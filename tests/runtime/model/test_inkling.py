"""Inkling (`InklingForCausalLM`) beyond the token-for-token case of test_hybrid_ssm.py (the
"inkling" entry of tests/runtime/hybrid_cases.py: relative logits cut at 12 distances and at the
window's 8, short convs over the conv state, a window layer with its own KV heads and a dense
MLP, a full layer with its logit scaling and routed + shared experts; chunked, batched, on a warm prefix
cache, preempted, against transformers): the relative logits in the torch backend against a
dense reference; the conditional-generation checkpoint read text-only; every layer a KV cache
and a conv state; the weights estimate; the checkpoint check; what is refused in one line; the
published config read as transformers counts it."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import NEW, check, generate, prompts
from hybrid_cases import check_missing_refused, check_refused
from pagoda.runtime import LLM
from pagoda.runtime.attention import get_attention_backend
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")

# Inkling's published shape: transformers' InklingTextConfig defaults (thinkingmachines/Inkling:
# 66 layers of 6144, 64 query heads, 8 KV heads on the full layers and 16 on the window ones,
# 256 experts, 2 shared), as a multimodal checkpoint's text_config
PUBLISHED_TEXT = {"model_type": "inkling_text", "mlp_layer_types": None}
PUBLISHED = {"architectures": ["InklingForConditionalGeneration"],
             "model_type": "inkling_mm_model", "text_config": PUBLISHED_TEXT}  # fmt: skip


def test_relative_logits_in_the_torch_backend():
    """A prefill chunk on cached context and a decode row: each score plus its query's logit
    at the key's backward distance below the extent (none beyond), within a window or not, as
    a dense softmax computes it; a backend without `rel_logits` refuses the logits."""
    from pagoda.runtime.attention.base import AttentionMetadata

    torch.manual_seed(0)
    h, hkv, d, e, bs = 4, 2, 16, 5, 16
    be = get_attention_backend("torch", torch.device("cpu"), h, hkv, d, 0.25, rel_logits=True)
    be.allocate_kv_cache(4, bs, torch.float32, torch.device("cpu"))
    assert be.kernel is None  # (the CPU kernel adds no relative logits)
    k_cache, v_cache = be.allocate_kv_cache(4, bs, torch.float32, torch.device("cpu"))
    lens = [1, 7]  # a decode at position 20, a 7-token chunk at 10..16
    ctx = [21, 17]
    t = sum(lens)
    q = torch.randn(t, h, d)
    rel = torch.randn(t, h, e)
    keys = [torch.randn(n, hkv, d) for n in ctx]
    vals = [torch.randn(n, hkv, d) for n in ctx]
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    for i, n in enumerate(ctx):  # the context before the step's tokens
        old = n - lens[i]
        slots = torch.tensor([int(tables[i, p // bs]) * bs + p % bs for p in range(old)])
        be.write_kv(keys[i][:old], vals[i][:old], k_cache, v_cache, slots)
    step_k = torch.cat([keys[0][-1:], keys[1][-7:]])
    step_v = torch.cat([vals[0][-1:], vals[1][-7:]])
    slots = [int(tables[s, p // bs]) * bs + p % bs for s, p in [(0, 20), *((1, p) for p in
                                                                 range(10, 17))]]  # fmt: skip
    for window in (None, 4):
        meta = AttentionMetadata(
            num_seqs=2, num_decodes=1, num_tokens=t, max_query_len=7, max_seq_len=21,
            query_start_loc=torch.tensor([0, 1, 8], dtype=torch.int32),
            seq_lens=torch.tensor(ctx, dtype=torch.int32), block_tables=tables,
            slot_mapping=torch.tensor(slots, dtype=torch.int64), block_size=bs,
            query_lens_host=lens, seq_lens_host=ctx,
        )  # fmt: skip
        be.prepare(meta)
        out = be.forward(q, step_k, step_v, k_cache, v_cache, meta, window=window, rel_bias=rel)
        rows = [(0, 0, 20)] + [(1, 1 + j, 10 + j) for j in range(7)]
        for s, row, pos in rows:
            kk = keys[s][: pos + 1].repeat_interleave(h // hkv, dim=1)  # [n, H, D]
            vv = vals[s][: pos + 1].repeat_interleave(h // hkv, dim=1)
            scores = torch.einsum("hd,nhd->hn", q[row], kk) * 0.25
            dist = pos - torch.arange(pos + 1)
            bias = rel[row][:, dist.clamp(max=e - 1)] * (dist < e)
            allowed = dist < window if window else torch.ones_like(dist, dtype=torch.bool)
            p = torch.softmax((scores + bias).masked_fill(~allowed, float("-inf")), dim=-1)
            want = torch.einsum("hn,nhd->hd", p, vv)
            torch.testing.assert_close(out[row], want, atol=1e-5, rtol=1e-5)
    plain = get_attention_backend("torch", torch.device("cpu"), h, hkv, d, 0.25)
    with pytest.raises(ValueError, match="need a backend built with rel_logits=True"):
        plain.forward(q, step_k, step_v, k_cache, v_cache, meta, rel_bias=rel)


def test_triton_refused_and_auto_picks_torch_in_one_line():
    with pytest.raises(ValueError, match="cannot add relative-position logits") as e:
        get_attention_backend("triton", torch.device("cuda"), 4, 2, 16, 1.0, rel_logits=True)
    assert "\n" not in str(e.value)
    auto = get_attention_backend("auto", torch.device("cuda"), 4, 2, 16, 1.0, rel_logits=True)
    assert auto.name == "torch" and auto.rel_logits


def test_state_slots_estimate_checkpoint_check_and_refusals(built):
    """Every layer keeps a KV cache (the window layer its own shape) and a conv state of its
    four convs' inputs; the weights estimate against the built model, and from the shapes alone
    (one rank or two) within 3% of the tensors' count; the checkpoint check
    names a missing conv, relative-logit, shared-expert or embedding-norm tensor; three ranks
    (not dividing the heads) and FP8 refused in one line (two ranks: test_tp_hybrid.py)."""
    from model_bytes import check_estimate

    path, _, loaded, _ = built("inkling", reference=False)
    mc = loaded.config
    m = mc.family.mamba
    assert mc.num_kv_layers == m.num_layers == 2 and m.d_conv == 4
    assert mc.kv_layer_shapes == ((4, 16), (2, 16))
    assert m.conv_dim == 2 * 4 * 16 + 2 * 64 and mc.family.window(0) == 8
    assert mc.family.window(1) is None and mc.family.relative_logits
    check_estimate(path, rel=0.02)
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    ckpt = weights.read_checkpoint(path, mc.architecture)
    for tp in (1, 2):  # from the shapes alone: a rank's heads, KV heads and experts' width
        got, _ = weights.resident(ckpt, mc, Placement(torch.bfloat16, "cuda", tp, None))
        assert weights.from_shapes(mc, torch.bfloat16, False, tp) == pytest.approx(got, rel=0.03)
    p = "model.layers.1."
    check_missing_refused(loaded, [p + "self_attn.v_sconv.conv1d.weight",
                                   p + "self_attn.rel_logits_proj.proj",
                                   p + "mlp.shared_experts.down_proj", p + "mlp_sconv.conv1d.weight",
                                   "model.embed_tokens.embed_norm.weight"])  # fmt: skip
    check_refused("inkling", mc)


def test_conditional_generation_checkpoint_reads_text_only(built, tmp_path):
    """`InklingForConditionalGeneration` (the text model under `model.language_model.`, the
    vision and audio towers beside it, not read) with the tiny text model's weights: the
    engine's tokens and logits are transformers' text model's."""
    from safetensors.torch import load_file, save_file

    path, _, _, reference = built("inkling")
    text = json.loads((path / "config.json").read_text())
    top = {"architectures": ["InklingForConditionalGeneration"], "model_type": "inkling_mm_model",
           "text_config": {**text, "architectures": None}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(top))
    for f in path.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    tensors = {n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n: t
               for n, t in load_file(path / "model.safetensors").items()}  # fmt: skip
    tensors["model.vision_tower.encoder.0.weight"] = torch.zeros(4, 4)
    tensors["model.audio_tower.embeddings.weight"] = torch.zeros(4, 4)
    save_file(tensors, tmp_path / "model.safetensors")
    assert read_model_config(str(tmp_path)).architecture == "inkling"
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    got = generate(llm, prompts()[:2])
    for i, want in enumerate(reference[:2]):
        check(got[i], want, f"conditional generation: prompt {i}")
    assert len(got[0][0]) == NEW


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"swa_num_attention_heads": 32}, "swa_num_attention_heads 32 differing"),
        ({"unpadded_vocab_size": 200_058}, "unpadded_vocab_size 200058 below vocab_size"),
        ({"shared_expert_sink": False}, "shared_expert_sink false is not supported"),
        ({"layer_types": ["full_attention"]}, r"layer_types \['full_attention'\] are not"),
        ({"mlp_layer_types": ["moe"]}, "mlp_layer_types must name each of the 1 layers"),
    ],
)
def test_what_it_does_not_run_is_refused_in_one_line(tmp_path, edit, words):
    cfg = {"architectures": ["InklingForCausalLM"], "model_type": "inkling_text",
           "num_hidden_layers": 1, **edit}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)


def test_published_config_reads_as_transformers_does(tmp_path):
    """The published shape (transformers' defaults, a multimodal wrapper's text_config; the
    checkpoint's older `sconv_kernel_size` key): window layers all but every sixth with 16 KV
    heads, 256 experts of 3072 and 2 shared in every layer, the text model's parameter count
    as transformers counts it on the meta device."""
    text = {**PUBLISHED_TEXT, "sconv_kernel_size": 3}
    (tmp_path / "config.json").write_text(json.dumps({**PUBLISHED, "text_config": text}))
    mc = read_model_config(str(tmp_path))
    f, m = mc.family, mc.family.mamba
    assert mc.architecture == "inkling" and not mc.tie_word_embeddings and m.d_conv == 3
    assert (f.num_experts, f.num_experts_per_tok, f.moe_intermediate_size) == (256, 6, 3072)
    assert f.window(5) is None and f.window(4) == 512 and mc.kv_layer_shapes[4] == (16, 128)
    assert mc.kv_layer_shapes[5] == (8, 128) and m.inkling.shared_experts == 2
    cfg = transformers.InklingTextConfig(conv_kernel_size=3)
    with torch.device("meta"):
        model = transformers.InklingForCausalLM(cfg)
    hf = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    assert mc.num_params == hf

"""Inkling 2 (`Inkling2ForCausalLM`) beyond the token-for-token case of test_hybrid_ssm.py (the
"inkling2" entry of tests/runtime/hybrid_cases.py: block attention residuals over blocks of two
layers, L2 clips, per-token sinks, the full layer's dynamic k/v convs and log scaling,
softcapped experts, a head narrower than the embedding, soft-capped logits; chunked, batched,
on a warm prefix cache, preempted, against transformers, from the checkpoint transformers
saves in the published names): per-token sinks in the torch backend; every layer a KV cache
and a conv state; the weights estimate; the checkpoint check; what is refused in one line; the
published config read as transformers counts it; Inkling2Loop's ("inkling2-loop": its further
passes' caches, estimate, checkpoint check, refusals, published config, conditional checkpoint)."""

from __future__ import annotations

import json

import pytest
import torch
from hybrid_cases import check_missing_refused, check_refused
from pagoda.runtime.attention import get_attention_backend
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")

PUBLISHED = {"architectures": ["Inkling2ForConditionalGeneration"], "model_type": "inkling2",
             "text_config": {"model_type": "inkling2_text"}}  # fmt: skip
LOOP = {"architectures": ["Inkling2LoopForConditionalGeneration"], "model_type": "inkling2_loop",
        "text_config": {"model_type": "inkling2_loop_text"}}  # fmt: skip


def test_per_token_sinks_in_the_torch_backend():
    """A sink logit per query row joins that row's softmax denominator alone (a decode row
    and a 5-token prompt in one step), as a dense softmax with the sink's column computes it."""
    from pagoda.runtime.attention.base import AttentionMetadata

    torch.manual_seed(0)
    h, hkv, d, bs = 4, 2, 16, 16
    be = get_attention_backend("torch", torch.device("cpu"), h, hkv, d, 0.25, sinks=True)
    k_cache, v_cache = be.allocate_kv_cache(2, bs, torch.float32, torch.device("cpu"))
    keys, vals = torch.randn(9, hkv, d), torch.randn(9, hkv, d)
    be.write_kv(keys[:3], vals[:3], k_cache, v_cache, torch.arange(3))  # sequence 0's first 3
    q, sinks = torch.randn(6, h, d), torch.randn(6, h)
    step_k, step_v = torch.cat([keys[3:4], keys[4:]]), torch.cat([vals[3:4], vals[4:]])
    slots = torch.tensor([3, 16, 17, 18, 19, 20])
    meta = AttentionMetadata(
        num_seqs=2, num_decodes=1, num_tokens=6, max_query_len=5, max_seq_len=5,
        query_start_loc=torch.tensor([0, 1, 6], dtype=torch.int32),
        seq_lens=torch.tensor([4, 5], dtype=torch.int32),
        block_tables=torch.tensor([[0], [1]], dtype=torch.int32), slot_mapping=slots,
        block_size=bs, query_lens_host=[1, 5], seq_lens_host=[4, 5],
    )  # fmt: skip
    be.prepare(meta)
    out = be.forward(q, step_k, step_v, k_cache, v_cache, meta, sinks=sinks)
    for row, (first, pos) in enumerate([(0, 3), *((4, j) for j in range(5))]):
        kk = keys[first : first + pos + 1].repeat_interleave(2, dim=1)
        vv = vals[first : first + pos + 1].repeat_interleave(2, dim=1)
        s = torch.einsum("hd,nhd->hn", q[row], kk) * 0.25
        p = torch.softmax(torch.cat([s, sinks[row][:, None]], dim=-1), dim=-1)[:, :-1]
        torch.testing.assert_close(out[row], torch.einsum("hn,nhd->hd", p, vv))


def test_state_slots_estimate_checkpoint_check_and_refusals(built):
    """Every layer a KV cache (the window layers their own shape) and a conv state; the
    weights estimate against the built model; the checkpoint check names a missing dynamic
    conv, block-residual query or sink tensor (in the published names); three ranks (not
    dividing the heads) and FP8 refused in one line (two ranks: test_tp_hybrid.py)."""
    from model_bytes import check_estimate

    path, _, loaded, _ = built("inkling2", reference=False)
    mc = loaded.config
    m = mc.family.mamba
    assert mc.num_kv_layers == m.num_layers == 3 and mc.vocab_size == 290
    assert mc.kv_layer_shapes == ((4, 16), (2, 16), (4, 16)) and mc.family.window(1) is None
    check_estimate(path, rel=0.02)
    check_missing_refused(loaded, ["model.layers.1.self_attn.k_proj.sconv.weight_proj.weight",
                                   "model.layers.2.attention_input.query",
                                   "model.layers.0.self_attn.sink_proj.weight"])  # fmt: skip
    check_refused("inkling2", mc)


def test_loop_caches_estimate_checkpoint_check_and_refusals(built):
    """Inkling2Loop ("inkling2-loop": layers 1-2 run three times): a KV cache and a conv state
    for each layer and for each further pass of the looped ones (their shapes the layer's);
    the weights estimate; the checkpoint check names a missing message gate or message query
    (the published names); three ranks and FP8 refused in one line."""
    from model_bytes import check_estimate

    path, _, loaded, _ = built("inkling2-loop", reference=False)
    mc = loaded.config
    assert mc.family.mamba.inkling2.loop == (1, 3, 3, 8)
    assert mc.num_kv_layers == mc.family.mamba.num_layers == 4 + 2 * 2
    assert mc.kv_layer_shapes == ((4, 16), (2, 16), (4, 16), (2, 16)) + ((2, 16), (4, 16)) * 2
    check_estimate(path, rel=0.02)
    check_missing_refused(loaded, ["model.layers.2.mlp_message_gate.forget_gate_proj.weight",
                                   "model.middle_cycle_cross_pass_kv_queries"])  # fmt: skip
    check_refused("inkling2-loop", mc)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"swa_head_dim": 64}, "swa_head_dim 64 differing"),
        ({"scoring_func": "softmax"}, "scoring_func 'softmax' is not supported"),
        ({"layer_types": ["full_attention"]}, "layer_types must name each of the 1 layers"),
        ({"model_type": "inkling2_loop_text"}, "inkling2_loop needs 0 < loop_layer_index_start"),
    ],
)
def test_what_it_does_not_run_is_refused_in_one_line(tmp_path, edit, words):
    cfg = {"architectures": ["Inkling2ForCausalLM"], "model_type": "inkling2_text",
           "num_hidden_layers": 1, **edit}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)


def test_published_config_reads_as_transformers_does(tmp_path):
    """The published shape (transformers' defaults as a multimodal text_config; the older
    `intermediate_size` key for the experts): window layers but every sixth, 384 experts of
    1536, logits 200058 wide, the text model's parameter count as transformers counts it."""
    text = {**PUBLISHED["text_config"], "intermediate_size": 1536}
    (tmp_path / "config.json").write_text(json.dumps({**PUBLISHED, "text_config": text}))
    mc = read_model_config(str(tmp_path))
    f = mc.family
    assert mc.architecture == "inkling2" and mc.vocab_size == 200_058
    assert (f.num_experts, f.num_experts_per_tok, f.moe_intermediate_size) == (384, 8, 1536)
    assert f.window(4) == 1024 and f.window(5) is None and f.final_logit_softcapping == 30.0
    with torch.device("meta"):
        model = transformers.Inkling2ForCausalLM(transformers.Inkling2TextConfig(
            moe_intermediate_size=1536))  # fmt: skip
    hf = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    assert mc.num_params == hf


def test_published_loop_config_reads_as_transformers_does(tmp_path):
    """Inkling2Loop's published shape (its own defaults): layers 6-17 looped three times (a KV
    cache and a conv state per layer and further pass), the text model's parameter count as
    transformers counts it."""
    (tmp_path / "config.json").write_text(json.dumps(LOOP))
    mc = read_model_config(str(tmp_path))
    f = mc.family
    assert mc.architecture == "inkling2" and f.mamba.inkling2.loop == (6, 18, 3, 64)
    assert (mc.hidden_size, mc.num_layers, f.num_experts) == (2304, 24, 128)
    assert mc.num_kv_layers == 24 + 2 * 12
    with torch.device("meta"):
        model = transformers.Inkling2LoopForCausalLM(transformers.Inkling2LoopTextConfig())
    hf = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    assert mc.num_params == hf


@pytest.mark.parametrize(("name", "top"), [("inkling2", PUBLISHED), ("inkling2-loop", LOOP)])
def test_conditional_generation_checkpoint_reads_text_only(built, tmp_path, name, top):
    """`Inkling2ForConditionalGeneration` and `Inkling2LoopForConditionalGeneration` (the same
    `model.llm.` names beside `model.visual.`, not read): the engine's tokens and logits are
    transformers' text model's."""
    from arch_cases import check, generate, prompts
    from pagoda.runtime import LLM
    from safetensors.torch import load_file, save_file

    path, _, _, reference = built(name)
    text = json.loads((path / "config.json").read_text())
    top = {**top, "text_config": {**text, "architectures": None}}
    (tmp_path / "config.json").write_text(json.dumps(top))
    for f in path.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    tensors = load_file(path / "model.safetensors")
    tensors["model.visual.proj_in.weight"] = torch.zeros(4, 4)
    save_file(tensors, tmp_path / "model.safetensors")
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    got = generate(llm, prompts()[:1])
    check(got[0], reference[0], "conditional generation")

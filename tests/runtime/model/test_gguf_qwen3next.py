"""llama.cpp GGUFs of Qwen3-Next (`qwen3next`), Qwen3.5 (`qwen35`) and Qwen3.5-MoE
(`qwen35moe`) (`model/gguf_qwen3next.py`): a tiny transformers checkpoint written as llama.cpp's
converter writes it (its Qwen3NextModel / Qwen3.5 classes: keys, the norms as 1 + w, A as
-exp(A_log), the conv squeezed, dt_bias as `ssm_dt.bias`, Qwen3-Next's in_proj_qkvz split into
`attn_qkv` and `attn_gate`, Qwen3.5's value heads tiled where key heads are fewer, the experts
stacked; Q8_0 matrices); the engine on the file matches transformers on the checkpoint with the
file's dequantized values, token for token, in a batch of unequal prompts in 16-token steps."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
import torch
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime.model.gguf_loader import load_gguf
from test_gguf_archs import PROMPTS, _check_estimate, _generate
from test_gguf_classic import _store, _written
from test_gguf_families import _byte_level_vocab, _oracle

transformers = pytest.importorskip("transformers")

LIN, FULL = "linear_attention", "full_attention"
SMALL = dict(head_dim=16, num_attention_heads=4, num_key_value_heads=2)
# case: (transformers config prefix, overrides, llama.cpp's architecture, the engine's)
CASES = {
    # two value heads a key head, experts with the shared expert and its gate; the experts'
    # gate and up fused (`--fuse-gate-up-exps`)
    "qwen3next": ("Qwen3Next", dict(
        **SMALL, num_hidden_layers=4, layer_types=[LIN, FULL, LIN, FULL],
        full_attention_interval=2, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=64, norm_topk_prob=True),
        "qwen3next", "qwen3_next"),
    # a dense MLP, fewer key heads than value heads (the converter's tiled value heads)
    "qwen35": ("Qwen3_5Text", dict(
        **SMALL, num_hidden_layers=3, layer_types=[LIN, LIN, FULL], full_attention_interval=3,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, linear_conv_kernel_dim=3), "qwen35", "qwen3_5"),
    # experts in every layer, as many key heads as value heads; a multi-token-prediction
    # block after the decoder's (not read)
    "qwen35moe": ("Qwen3_5MoeText", dict(
        **SMALL, num_hidden_layers=2, layer_types=[LIN, FULL], full_attention_interval=2,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32), "qwen35moe", "qwen3_5_moe"),
}  # fmt: skip
_ENUM = {"qwen3next": "QWEN3NEXT", "qwen35": "QWEN35", "qwen35moe": "QWEN35MOE"}


def _metadata(w, c: dict, mtp: int) -> None:
    """Qwen2MoeModel's and Qwen3NextModel's `set_gguf_parameters` (`mtp`: the Qwen3.5
    multi-token-prediction blocks after the decoder's, `_Qwen35MtpMixin`'s)."""
    w.add_block_count(c["num_hidden_layers"] + mtp)
    if mtp:
        w.add_nextn_predict_layers(mtp)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    if c.get("num_experts"):
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(c["linear_key_head_dim"])
    w.add_ssm_group_count(c["linear_num_key_heads"])
    w.add_ssm_time_step_rank(c["linear_num_value_heads"])
    w.add_ssm_inner_size(c["linear_value_head_dim"] * c["linear_num_value_heads"])
    w.add_full_attention_interval(c["full_attention_interval"])
    partial = c["rope_parameters"].get("partial_rotary_factor", 0.25)
    w.add_rope_dimension_count(int(c["head_dim"] * partial))


def _tile(t: np.ndarray, dim: int, k: int, r: int, d: int) -> np.ndarray:
    """The converter's `_reorder_v_heads`: value heads grouped by key head -> tiled."""
    shape = list(t.shape)
    grouped = t.reshape(*shape[:dim], k, r, d, *shape[dim + 1 :])
    return np.swapaxes(grouped, dim, dim + 1).reshape(shape)


def _untile(t: np.ndarray, dim: int, k: int, r: int, d: int) -> np.ndarray:
    shape = list(t.shape)
    tiled = t.reshape(*shape[:dim], r, k, d, *shape[dim + 1 :])
    return np.swapaxes(tiled, dim, dim + 1).reshape(shape)


def convert(
    path, hf_dir, arch: str, mtp: bool = False, fuse: bool = False
) -> dict[str, torch.Tensor]:
    """The checkpoint in `hf_dir` as llama.cpp's converter writes it for `arch` (`mtp`: with
    a multi-token-prediction block after the decoder's, a copy of its last layer and the
    `nextn` tensors, which the engine does not read; `fuse`: the experts' gate and up in one
    `ffn_gate_up_exps`, `--fuse-gate-up-exps`); its tensors as the file gives them back,
    in the checkpoint's layout."""
    from safetensors.torch import load_file

    c = transformers.AutoConfig.from_pretrained(hf_dir).to_dict()
    sd = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, r = c["linear_key_head_dim"], c["linear_value_head_dim"], hv // hk
    tiled = arch != "qwen3next" and hk != hv  # `_LinearAttentionVReorderBase`
    qk = 2 * hk * dk  # the q and k rows (channels) before v's
    w = gguf.GGUFWriter(str(path), arch)
    _metadata(w, c, int(mtp))
    tokens, types, merges = _byte_level_vocab(c["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(c["vocab_size"] - 1)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[_ENUM[arch]], c["num_hidden_layers"])
    expected: dict[str, np.ndarray] = {}
    experts: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for hf, arr in sd.items():
        layer = hf.split(".")[2] if hf.startswith("model.layers.") else None
        if m := re.match(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+)\.weight$", hf):
            experts.setdefault((m[1], m[3]), {})[int(m[2])] = arr
            continue
        stored, back = arr, lambda a: a
        if tiled and ".linear_attn." in hf and not hf.endswith("linear_attn.norm.weight"):
            if hf.endswith(("in_proj_qkv.weight", "conv1d.weight")):
                stored = np.concatenate([arr[:qk], _tile(arr[qk:], 0, hk, r, dv)])
                back = lambda a: np.concatenate([a[:qk], _untile(a[qk:], 0, hk, r, dv)])  # noqa: E731
            elif hf.endswith("in_proj_z.weight"):
                stored, back = _tile(arr, 0, hk, r, dv), lambda a: _untile(a, 0, hk, r, dv)
            elif hf.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias")):
                stored, back = _tile(arr, 0, hk, r, 1), lambda a: _untile(a, 0, hk, r, 1)
            elif hf.endswith("out_proj.weight"):
                stored, back = _tile(arr, 1, hk, r, dv), lambda a: _untile(a, 1, hk, r, dv)
        if hf.endswith(".A_log"):
            a, b = stored, back
            stored, back = -np.exp(a), lambda x, b=b: b(np.log(-x))
            expected[hf] = back(_store(w, f"blk.{layer}.ssm_a", stored))
            continue
        if hf.endswith(".dt_bias"):
            expected[hf] = back(_store(w, f"blk.{layer}.ssm_dt.bias", stored))
            continue
        if "conv1d" in hf:
            b = back
            stored, back = stored.squeeze(1), lambda x, b=b: b(x)[:, None, :]
        elif hf.endswith("norm.weight") and not hf.endswith("linear_attn.norm.weight"):
            stored, back = stored + 1, lambda x: x - 1
        if hf.endswith("in_proj_qkvz.weight"):  # [q, k, v, z] by key head -> qkv, z
            per = arr.reshape(hk, 2 * dk + 2 * r * dv, -1)
            q, k, v, z = np.split(per, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
            flat = [t.reshape(-1, arr.shape[-1]) for t in (q, k, v, z)]
            qkv = _store(w, f"blk.{layer}.attn_qkv.weight", np.concatenate(flat[:3]))
            zz = _store(w, f"blk.{layer}.attn_gate.weight", flat[3])
            q, k, v = np.split(qkv, [hk * dk, 2 * hk * dk])
            parts = [q.reshape(hk, dk, -1), k.reshape(hk, dk, -1), v.reshape(hk, r * dv, -1),
                     zz.reshape(hk, r * dv, -1)]  # fmt: skip
            expected[hf] = np.concatenate(parts, axis=1).reshape(arr.shape)
            continue
        gname = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert gname is not None, hf
        expected[hf] = back(_store(w, gname, stored))
    parts = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}
    for (layer, part), per in experts.items():
        if fuse and part != "down_proj":
            continue
        stacked = _store(w, f"blk.{layer}.{parts[part]}.weight",
                         np.stack([per[e] for e in sorted(per)]))  # fmt: skip
        for e in sorted(per):
            expected[f"model.layers.{layer}.mlp.experts.{e}.{part}.weight"] = stacked[e]
    for layer in sorted({layer for layer, _ in experts}) if fuse else ():
        gate, up = (experts[(layer, p)] for p in ("gate_proj", "up_proj"))
        both = np.stack([np.concatenate([gate[e], up[e]]) for e in sorted(gate)])
        stacked = _store(w, f"blk.{layer}.ffn_gate_up_exps.weight", both)
        n = stacked.shape[1] // 2
        for e in sorted(gate):
            expected[f"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight"] = stacked[e, :n]
            expected[f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight"] = stacked[e, n:]
    if mtp:  # (Q8_0 and F32 as the decoder's)
        n, hidden = c["num_hidden_layers"], c["hidden_size"]
        last = f"blk.{n - 1}."
        for name, ti in list(w.tensors[-1].items()):
            if name.startswith(last):
                w.add_tensor(f"blk.{n}." + name[len(last) :], ti.tensor,
                             raw_shape=ti.tensor.shape, raw_dtype=ti.dtype)  # fmt: skip
        w.add_tensor(f"blk.{n}.nextn.eh_proj.weight", np.ones((hidden, 2 * hidden), np.float32))
        w.add_tensor(f"blk.{n}.nextn.enorm.weight", np.ones(hidden, np.float32))
    return _written(w, expected)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_qwen3next_family_matches_transformers_on_its_dequantized_weights(tmp_path, case):
    hf_arch, overrides, arch, engine = CASES[case]
    make_tiny_model(tmp_path / "hf", hf_arch, **overrides)
    path = tmp_path / f"{case}.gguf"
    expected = convert(path, tmp_path / "hf", arch, mtp=case == "qwen35moe",
                       fuse=case == "qwen3next")  # fmt: skip
    oracle = _oracle(tmp_path, expected)
    config, _, _, _ = load_gguf(path)
    assert config.architecture == engine
    assert config.family.mamba.layers == tuple(t == LIN for t in overrides["layer_types"])
    want = [hf_greedy_plain(oracle, p, 6)[0] for p in PROMPTS]
    assert _generate(path, PROMPTS) == want, case
    _check_estimate(path, "bfloat16")

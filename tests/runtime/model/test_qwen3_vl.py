"""Qwen3-VL and Qwen3-VL-MoE (`model/qwen3_vl.py`, `model/qwen3_vl_vision.py`, Qwen2-VL's
inputs and M-RoPE rows): tiny random checkpoints written by transformers
(tests/runtime/qwen3_vl_testlib.py: learned positions large enough to matter, DeepStack after
two blocks); the engine's greedy tokens are transformers' `generate` for prompts with one
image and two images of different sizes batched with a text-only one (six tokens: decodes
after the image at the M-RoPE delta), with chunked prefill splitting an image, on a warm
prefix cache, on two ranks over gloo (tensor parallelism: the DeepStack rows broadcast), and (MoE) with its experts stored in the hub's transposed layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model
from qwen2_vl_testlib import cases, expanded, hf_generate, image
from qwen3_vl_testlib import MOE, PROCESSOR, make_tiny_qwen3_vl

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # two checkpoints written and run by transformers; nothing timed
NEW = 6
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
CASES = cases([image(0, (70, 90)), image(1, (130, 40)), image(2, (40, 40))])
_BUILT: dict[str, tuple] = {}


def _tiny(kind: str, tmp_path_factory) -> tuple:
    """(checkpoint path, loaded model, transformers' tokens of `CASES`), built once a kind."""
    if kind not in _BUILT:
        path = tmp_path_factory.mktemp(kind)
        model = make_tiny_qwen3_vl(path, kind)
        reference = [hf_generate(model, expanded(p["prompt_token_ids"], ims, PROCESSOR), ims,
                                 NEW, PROCESSOR) for p, ims in CASES]  # fmt: skip
        _BUILT[kind] = (path, load_model(str(path)), reference)
    return _BUILT[kind]


@pytest.fixture(scope="module", params=["qwen3_vl", "qwen3_vl_moe"])
def tiny(request, tmp_path_factory):
    return _tiny(request.param, tmp_path_factory)


def _run(llm: LLM, prompts) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_one_and_two_images_batched_with_text_are_transformers(tiny):
    _, loaded, reference = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20)
    assert _run(llm, [p for p, _ in CASES]) == reference


def test_chunked_prefill_splitting_an_image_and_a_prefix_hit_are_transformers(tiny):
    _, loaded, reference = tiny
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=8,
              max_num_batched_tokens=16, max_num_seqs=4, enable_prefix_caching=True)  # fmt: skip
    prompts = [p for p, _ in CASES]
    assert _run(llm, prompts) == reference
    assert _run(llm, prompts[:2]) == reference[:2]  # the same images again: cache hits


def test_two_ranks_read_the_deepstack_rows_rank_0_sends(tiny):
    """Tensor parallelism over gloo, two ranks, 8-token chunks (an image split across steps):
    rank 0 alone holds the tower; each step's feature rows (the merged features and both
    DeepStack blocks', three hidden sizes wide) and M-RoPE positions are broadcast; the
    heads, MLP rows and (MoE) each expert's rows split; transformers' tokens."""
    path, loaded, reference = tiny
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, dtype="float32",
             max_num_batched_tokens=8, max_num_seqs=3, block_size=8,
             kv_cache_memory=8 << 20) as two:  # fmt: skip
        model = two.engine.runner.model
        assert model.image_feature_width == 3 * loaded.config.hidden_size
        assert two.engine.runner.channel.hidden == model.image_feature_width
        assert _run(two, [p for p, _ in CASES]) == reference
        assert model.tower is not None
        if loaded.config.architecture == "qwen3_vl_moe":  # each expert's gate and up: half
            gate_up = model.layers[0].mlp.experts[0][0]  # their rows on this rank
            half = MOE["moe_intermediate_size"] // 2
            assert gate_up(torch.zeros(1, loaded.config.hidden_size)).shape == (1, 2 * half)
        two.engine.check_integrity()


def _hub_layout(tmp_path_factory):
    """The tiny Qwen3-VL-MoE with its stacked experts transposed, as the hub stores them."""
    import shutil

    from safetensors.torch import load_file, save_file

    path, _, reference = _tiny("qwen3_vl_moe", tmp_path_factory)
    hub = tmp_path_factory.mktemp("hub_layout")
    shutil.copytree(path, hub, dirs_exist_ok=True)
    tensors = load_file(hub / "model.safetensors")
    stacked = [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert stacked
    for n in stacked:
        tensors[n] = tensors[n].transpose(1, 2).contiguous()
    save_file(tensors, hub / "model.safetensors", metadata={"format": "pt"})
    return hub, reference


def test_moe_experts_in_the_hubs_transposed_layout_are_read(tmp_path_factory):
    """transformers 5 saves the stacked experts [E, out, in]; the published checkpoints hold
    them [E, in, out] (transformers transposes where the shape says so): the same tokens."""
    hub, reference = _hub_layout(tmp_path_factory)
    llm = LLM(loaded=load_model(str(hub)), dtype="float32", kv_cache_memory=8 << 20)
    assert _run(llm, [p for p, _ in CASES[:2]]) == reference[:2]


def test_the_weights_estimate_is_what_the_model_holds(tiny, tmp_path_factory):
    """`server/weights.py`'s count (the tower's parameters, the stacked experts in either
    layout) within 2% of what the built bf16 model holds."""
    from model_bytes import check_estimate

    check_estimate(tiny[0])
    if tiny[1].config.architecture == "qwen3_vl_moe":
        check_estimate(_hub_layout(tmp_path_factory)[0])


@pytest.mark.parametrize("section", [(24, 20, 20), (2, 3, 3), (16, 24, 24)])
def test_interleaved_sections_are_transformers_recomposition(section):
    """Each rotary frequency's axis (t 0, h 1, w 2) as `Qwen3VLTextRotaryEmbedding` composes
    them (every axis's frequencies tagged with its index)."""
    import types

    from pagoda.runtime.model.qwen2_vl import mrope_selector
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    half = sum(section)
    tagged = torch.arange(3.0)[:, None, None, None].expand(3, 1, 1, half).clone()
    me = types.SimpleNamespace(mrope_section=list(section))
    want = Qwen3VLTextRotaryEmbedding.recomposition_frequencies(me, tagged)[0, 0]
    sel = mrope_selector(section, interleaved=True)
    assert want.tolist() == np.concatenate([sel, sel]).astype(float).tolist()

"""Warm-up covers every attention kernel variant serving then hits (Triton backend).

Under the interpreter nothing compiles, so coverage is checked directly: both launchers are
wrapped to record each launch's compile key (launch config, split count, block-table width
class); every key seen while serving a varied workload must already have been seen in warm-up.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
from hf_oracle import make_tiny_llama

pytest.importorskip("triton")

from pagoda.kernels import attention, decode_attention, prefill_attention, unified_attention
from pagoda.kernels import config as kc
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.engine import warmup
from pagoda.runtime.model.loader import load_model

if os.environ["TRITON_INTERPRET"] != "1":
    pytest.skip("coverage is checked under the interpreter", allow_module_level=True)


@pytest.fixture
def split_friendly_configs(tmp_path, monkeypatch):
    """default.json with short split segments, so small contexts use several split counts."""
    data = json.loads((kc.PACKAGE_CONFIG_DIR / "default.json").read_text())
    for bucket in data["kernels"]["decode_attention"]:
        bucket["config"]["min_tokens_per_split"] = 16
    (tmp_path / "default.json").write_text(json.dumps(data))
    monkeypatch.setenv(kc.CONFIG_DIR_ENV, str(tmp_path))
    kc.clear_config_cache()
    yield
    kc.clear_config_cache()


@pytest.fixture
def launches(monkeypatch):
    seen: list[tuple] = []

    def wrap(module, name, kind):
        real = getattr(module, name)

        def recorded(**kw):
            width = kw["block_tables"].stride(0)
            cls = "one" if width == 1 else "div16" if width % 16 == 0 else "other"
            split = kw.get("num_splits", kw.get("one_token_per_seq", False))
            chunked = kw.get("attention_chunk") is not None  # the CHUNKED variants
            spans = kw.get("image_spans") is not None  # the HAS_SPANS variants
            seen.append((kind, tuple(sorted(kw["config"].items())), split, cls, chunked, spans))
            real(**kw)

        monkeypatch.setattr(module, name, recorded)
        monkeypatch.setattr(attention, name, recorded)  # the dispatcher's own reference

    wrap(decode_attention, "launch_decode_attention", "decode")
    wrap(unified_attention, "launch_unified_attention", "unified")
    wrap(prefill_attention, "launch_prefill_attention", "prefill")
    return seen


# Per-shape configs run on Llama 4 only: its NoPE layers warm and launch exactly the variants a
# plain Llama's layers do (measured 2026-12-07: equal sets, 15 warmed, 3 launched), so a plain
# Llama by shape (12.8 s of CI) checked nothing more; a model without chunked layers warming no
# CHUNKED variant is checked by the batch-invariant case (one code path for both modes).
@pytest.mark.parametrize(
    ("invariant", "model"),
    [(True, "llama"), (False, "llama4")],
    ids=["batch-invariant", "by-shape-chunked"],
)
@pytest.mark.slow
def test_serving_hits_only_warmed_variants(tmp_path, split_friendly_configs, launches, invariant,
                                           model):  # fmt: skip
    """Per-shape configs: split counts and prefill buckets, with and without Llama 4's
    attention chunk (its chunked layers, chunks of 8, beside its NoPE ones); batch-invariant:
    the prefill kernel's decode and prefill launches only, and no chunked variant."""
    if model == "llama4":
        from hf_oracle import _LM_CLASSES, make_tiny_model

        _LM_CLASSES.setdefault("Llama4Text", "Llama4ForCausalLM")
        make_tiny_model(tmp_path / "m", "Llama4Text", num_local_experts=2, intermediate_size=32,
                        intermediate_size_mlp=64, head_dim=16, no_rope_layer_interval=2,
                        attention_chunk_size=8)  # fmt: skip
    else:
        make_tiny_llama(tmp_path / "m")
    args = dict(dtype="float32", kv_cache_memory=4 << 20, max_num_batched_tokens=48, max_num_seqs=4)
    llm = LLM(str(tmp_path / "m"), loaded=load_model(str(tmp_path / "m")), attention_backend="triton",
              max_model_len=96, batch_invariant=invariant, **args)  # fmt: skip
    warmup.warm_up(llm.engine)
    warmed = set(launches)
    if invariant:
        assert {(k[0], k[2]) for k in warmed} == {("prefill", True), ("prefill", False)}
    else:
        # several split counts, on the NoPE layers (no chunk) by themselves
        assert {k[2] for k in warmed if k[0] == "decode" and not k[4]} >= {1, 2, 4}
    assert {k[4] for k in warmed} == ({False, True} if model == "llama4" else {False})
    launches.clear()
    # Short on purpose (interpreted decode is the cost), yet it reaches every variant: prefill
    # chunks of widths 2, 3, 5; four decodes crossing from width 5 to 6 (78 + 3 > 80); the last
    # prompt (5 tokens: the small prefill bucket) joining beside width 6, then decoding alone
    # through widths 1 and 2 (hence its 13 tokens).
    prompts = [[(7 * i + n) % 290 + 3 for i in range(n)] for n in (3, 17, 40, 78, 5)]
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (6, 6, 6, 6, 13)
    ]
    llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert launches and set(launches) <= warmed, set(launches) - warmed


def test_kernel_cases_are_one_per_variant(split_friendly_configs):
    import torch

    geo = warmup.Geometry(4, 2, 16, 16, torch.float32, torch.device("cpu"))
    cases = warmup.kernel_cases(geo, max_num_seqs=4, max_model_len=96, max_num_batched_tokens=48)
    decodes = [c for c in cases if c[2] == 0]
    prefills = [c for c in cases if c[2] > 0]
    assert len(decodes) == len(set(decodes)) and prefills and all(c[0] == 0 for c in prefills)
    assert (
        warmup._widths(1) == [1, 2, 16]
        and warmup._widths(16) == [16, 17]
        and warmup._widths(5) == [5, 16]
    )


def test_a_model_with_image_spans_warms_the_spans_variants(launches):
    """Gemma 3's images (`Geometry.image_spans`): each prefill case also launches the prefill
    kernel with spans (its HAS_SPANS variant), at every width; decode cases never do."""
    import torch

    geo = warmup.Geometry(4, 2, 16, 16, torch.float32, torch.device("cpu"), image_spans=True)
    widths = len(warmup._widths(1))  # (one block a sequence: 3 width classes)
    assert warmup.run_kernel_case(geo, 0, 5, 5) == 2 * widths
    assert warmup.run_kernel_case(geo, 2, 16, 0) == widths
    prefill = [k for k in launches if k[0] == "prefill" and k[2] is False]
    assert sorted(k[5] for k in prefill) == [False] * widths + [True] * widths
    assert not any(k[5] for k in launches if k not in prefill)

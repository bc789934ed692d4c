"""`family_options.py`, walked: every registered family against every option, through the
checks `pagoda serve` runs before it binds (`launch.check_dtype`, `launch.check_parallel`, the
HF loader's checkpoint read): an option a family's row declares untested is refused in one line
naming the option, the architecture, the reason and what to use instead; every other option
passes the family check. One refusal as a process too (exit 2, one line)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import llama4_vision_testlib
import pytest
from pagoda.runtime import family_options
from pagoda.runtime.config import CacheConfig, EngineConfig, ModelConfig
from pagoda.runtime.family_options import MESSAGES, OPTIONS, UNTESTED, Untested
from pagoda.runtime.model.loader import read_model_config
from pagoda.runtime.model.registry import MODEL_CLASSES
from pagoda.runtime.parallelism import Parallelism
from pagoda.runtime.server.launch import check_dtype, check_parallel

ROOT = Path(__file__).resolve().parents[2]
# a shape every check of the tensor-parallel arithmetic splits over 2 ranks: what is left to
# refuse is the family's row (the architecture is all the family check reads)
SHAPE = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=16)  # fmt: skip
INSTEAD = {"tensor_parallel": "; serve it on one device", "fp8": "; serve it in 16 or 32 bits",
           "kv_cache": "; use --kv-cache-dtype auto",
           "float16": "; use --dtype bfloat16 or float32",
           "fp8_checkpoint": "; serve a 16-bit one"}  # fmt: skip
FLAG = {"tensor_parallel": "--tensor-parallel-size 2 ", "fp8": "--quantization fp8 ",
        "kv_cache": "--kv-cache-dtype {kv} ", "float16": "in float16",
        "fp8_checkpoint": "an FP8 "}  # fmt: skip


def _asked(option: str, kv: str = "int8") -> EngineConfig:
    """An EngineConfig that asks for `option` (FP8 set in place: a CPU's config refuses FP8
    itself where the Triton interpreter is off, before any family check)."""
    cfg = EngineConfig(model="m", dtype="float16" if option == "float16" else "float32")
    if option == "fp8":
        object.__setattr__(cfg, "quantization", "fp8")
    if option == "kv_cache":
        cache = CacheConfig(kv_cache_dtype="int8")
        object.__setattr__(cache, "kv_cache_dtype", kv)
        object.__setattr__(cfg, "cache", cache)
    if option == "tensor_parallel":
        cfg = dataclasses.replace(cfg, parallel=Parallelism(tensor_parallel_size=2))
    return cfg


def _serve_checks(cfg: EngineConfig, mc: ModelConfig) -> str | None:
    """What preflight's family checks say of `cfg` on `mc` (None: nothing refused)."""
    try:
        check_dtype(cfg, mc)
        check_parallel(mc, cfg)
    except ValueError as e:
        return str(e)
    return None


def _assert_refusal(line: str, arch: str, option: str, **values: str) -> None:
    reason = getattr(UNTESTED[arch], option)
    assert "\n" not in line and FLAG[option].format(**values) in line, line
    assert f" {arch} " in line and f"({reason})" in line and line.endswith(INSTEAD[option]), line


def test_every_row_is_a_registered_family_and_names_what_it_refuses() -> None:
    family_options.check_registered(MODEL_CLASSES)  # (the registry's import ran it too)
    assert set(MESSAGES) == set(OPTIONS) and all(row.options for row in UNTESTED.values())
    with pytest.raises(ValueError, match="rows for no registered architecture"):
        family_options.check_registered(set(MODEL_CLASSES) - {"jetmoe"})
    with pytest.raises(ValueError, match="must name an option"):
        Untested()
    with pytest.raises(ValueError, match="one bare line"):
        Untested(fp8="not tested.")
    with pytest.raises(ValueError, match="unknown option"):
        family_options.tested("llama", "int4")


@pytest.mark.parametrize("option", ["tensor_parallel", "fp8", "kv_cache", "float16"])
def test_each_family_is_refused_exactly_the_options_its_row_declares(option) -> None:
    refused = 0
    for arch in MODEL_CLASSES:
        mc = dataclasses.replace(SHAPE, architecture=arch)
        for kv in ("int8", "fp8") if option == "kv_cache" else ("int8",):
            line = _serve_checks(_asked(option, kv), mc)
            if family_options.tested(arch, option):
                assert line is None, (arch, option, line)
                continue
            assert line is not None, (arch, option)
            _assert_refusal(line, arch, option, kv=kv)
            refused += 1
    # (each option but tensor parallelism has rows: gemma2/3/4 in float16, DSA's KV cache;
    # every family runs on several ranks, so none is refused --tensor-parallel-size)
    assert refused >= (0 if option == "tensor_parallel" else 2)


# config.json of each family not tested with FP8 checkpoints (a new row needs one here)
GEMMA4 = {"architectures": ["Gemma4ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
          "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 2,
          "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": None,
          "attention_k_eq_v": False, "sliding_window": 512, "vocab_size": 300,
          "vocab_size_per_layer_input": 300, "hidden_size_per_layer_input": 8,
          "num_kv_shared_layers": 0, "use_double_wide_mlp": False,
          "layer_types": ["sliding_attention", "full_attention"], "model_type": "gemma4_text",
          "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25,
                                                 "rope_theta": 1e6, "rope_type": "proportional"},
                              "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}}  # fmt: skip
GEMMA4_UNIFIED = {**GEMMA4, "architectures": ["Gemma4UnifiedForCausalLM"],
                  "model_type": "gemma4_unified_text"}  # fmt: skip
ARIA = {"architectures": ["AriaTextForCausalLM"], "model_type": "aria_text", "vocab_size": 300,
        "hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 4,
        "num_hidden_layers": 2}  # fmt: skip
GEMMA3N = {"architectures": ["Gemma3nForCausalLM"], "model_type": "gemma3n_text",
           "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
           "num_key_value_heads": 1, "num_hidden_layers": 2, "head_dim": 16, "vocab_size": 300,
           "vocab_size_per_layer_input": 300, "hidden_size_per_layer_input": 8,
           "num_kv_shared_layers": 0, "laurel_rank": 8,
           "layer_types": ["sliding_attention", "full_attention"]}  # fmt: skip
MIMO = {"architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash",
        "vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "head_dim": 24,
        "v_head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 1,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "n_group": 2, "topk_group": 1, "num_hidden_layers": 2, "sliding_window": 5,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {k: {"rope_type": "default", "rope_theta": 1e4,
                                "partial_rotary_factor": 0.334}
                            for k in ("full_attention", "sliding_attention")}}  # fmt: skip
MINICPM5 = {"architectures": ["MiniCPM5MoeForCausalLM"], "model_type": "minicpm5_moe"}
HY_V4 = {"architectures": ["HYV4ForCausalLM"], "model_type": "hy_v4", "vocab_size": 300,
         "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_hidden_layers": 2, "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 32,
         "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8,
         "num_experts_per_tok": 2, "moe_intermediate_size": 32, "index_head_dim": 32,
         "index_n_heads": 4, "index_topk": 8}  # fmt: skip
QWEN4 = {"architectures": ["Qwen4ExpForCausalLM"], "model_type": "qwen4_exp_text",
         "vocab_size": 300, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "num_hidden_layers": 2, "layer_types": ["linear_attention",
         "full_attention"], "linear_num_key_heads": 2, "linear_num_value_heads": 2,
         "num_experts": 4, "num_experts_per_tok": 2, "hc_count": 2, "hc_lowrank": 16}  # fmt: skip
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300,
         "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2}  # fmt: skip
AXK2 = {"architectures": ["AXK2ForCausalLM"], "model_type": "axk2", "num_hidden_layers": 2}
BEAM = {"architectures": ["BeamForCausalLM"], "model_type": "beam", "num_hidden_layers": 2}
DOTS3 = {"architectures": ["Dots3NoteForCausalLM"], "model_type": "dots3_note_text",
         "num_hidden_layers": 2, "use_sliding_window": False}  # fmt: skip
GLM5_NEXT = {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
             "text_config": {"num_hidden_layers": 4}}  # fmt: skip
MINIMAX_M3 = {"architectures": ["MiniMaxM3VLForCausalLM"], "model_type": "minimax_m3_vl_text",
              "num_hidden_layers": 2}  # fmt: skip
BERT = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 300, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2}  # fmt: skip
XLMR = {**BERT, "architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta"}
MODERNBERT = {**BERT, "architectures": ["ModernBertModel"], "model_type": "modernbert"}
LLAVA = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
         "text_config": {**LLAMA, "architectures": None}}  # fmt: skip
QWEN2_VL = {"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
            "text_config": {**LLAMA, "architectures": None, "model_type": "qwen2_vl_text"}}  # fmt: skip
QWEN2_5_VL = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
              "text_config": {**LLAMA, "architectures": None, "model_type": "qwen2_5_vl_text"}}  # fmt: skip
QWEN3_VL = {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
            "text_config": {**LLAMA, "architectures": None, "model_type": "qwen3_vl_text"}}  # fmt: skip
QWEN3_VL_MOE = {"architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
                "text_config": {**LLAMA, "architectures": None, "model_type": "qwen3_vl_moe_text",
                                "num_experts": 4}}  # fmt: skip
IDEFICS3 = {"architectures": ["SmolVLMForConditionalGeneration"], "model_type": "smolvlm",
            "text_config": {**LLAMA, "architectures": None}}  # fmt: skip
LLAVA_NEXT = {"architectures": ["LlavaNextForConditionalGeneration"], "model_type": "llava_next",
              "image_grid_pinpoints": [[224, 448], [448, 224]],
              "text_config": {**LLAMA, "architectures": None}}  # fmt: skip
LLAVA_NEXT_MISTRAL = {**LLAVA_NEXT, "text_config": {**LLAMA, "architectures": None,
                                                    "model_type": "mistral"}}  # fmt: skip
LLAVA_ONEVISION = {"architectures": ["LlavaOnevisionForConditionalGeneration"],
                   "model_type": "llava_onevision",
                   "text_config": {**LLAMA, "architectures": None, "model_type": "qwen2"}}  # fmt: skip
LLAMA4_VISION = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                 "text_config": {"model_type": "llama4_text", "num_hidden_layers": 2},
                 "vision_config": {**llama4_vision_testlib.VISION,
                                   "model_type": "llama4_vision_model"},
                 "image_token_index": llama4_vision_testlib.PATCH_ID}  # fmt: skip
MISTRAL3 = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
            "vision_config": {"model_type": "pixtral", "hidden_size": 32, "num_attention_heads": 2},
            "text_config": {**LLAMA, "architectures": None, "model_type": "mistral"}}  # fmt: skip
INTERNVL = {"architectures": ["InternVLForConditionalGeneration"], "model_type": "internvl",
            "text_config": {**LLAMA, "architectures": None, "model_type": "qwen2"}}  # fmt: skip
INTERNVL_QWEN3 = {**INTERNVL, "text_config": {**LLAMA, "architectures": None,
                                              "model_type": "qwen3"}}  # fmt: skip
INTERNVL_QWEN3_MOE = {**INTERNVL, "text_config": {**LLAMA, "architectures": None,
                                                  "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
                                                  "moe_intermediate_size": 32}}  # fmt: skip
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3"}


def test_fp8_checkpoints_are_refused_for_the_families_that_declare_it(tmp_path) -> None:
    untested = {a for a, row in UNTESTED.items() if row.fp8_checkpoint}
    configs = {"gemma4": GEMMA4, "gemma4_unified": GEMMA4_UNIFIED, "gemma3n": GEMMA3N, "mimo_v2_flash": MIMO, "aria_text": ARIA, "axk2": AXK2, "minicpm5_moe": MINICPM5,
               "hy_v4": HY_V4, "qwen4_exp": QWEN4, "beam": BEAM,
               "dots3_note_text": DOTS3, "glm5_next": GLM5_NEXT, "minimax_m3": MINIMAX_M3,
               "bert": BERT, "roberta": XLMR, "modernbert": MODERNBERT,
               "llava": LLAVA, "qwen2_vl": QWEN2_VL, "qwen2_5_vl": QWEN2_5_VL,
               "qwen3_vl": QWEN3_VL, "qwen3_vl_moe": QWEN3_VL_MOE,
               "idefics3": IDEFICS3, "llava_next": LLAVA_NEXT,
               "llava_next_mistral": LLAVA_NEXT_MISTRAL, "llava_onevision": LLAVA_ONEVISION,
               "mistral3": MISTRAL3,
               "internvl": INTERNVL, "internvl_qwen3": INTERNVL_QWEN3,
               "internvl_qwen3_moe": INTERNVL_QWEN3_MOE}  # fmt: skip
    assert set(configs) == untested, "a family row refusing FP8 checkpoints needs a config here"
    for arch, cfg in {**configs, "llama": LLAMA}.items():
        d = tmp_path / arch
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        if arch == "mistral3":  # (its images read: the tokenizer names [IMG_BREAK], [IMG_END])
            from pixtral_testlib import tokenizer

            tokenizer(d)
        assert read_model_config(str(d)).architecture == arch  # 16-bit: read
        (d / "config.json").write_text(json.dumps({**cfg, "quantization_config": FP8}))
        if arch == "llama":
            assert read_model_config(str(d)).architecture == "llama"
            continue
        with pytest.raises(ValueError) as e:
            read_model_config(str(d))
        _assert_refusal(str(e.value), arch, "fp8_checkpoint")


def test_an_fp8_llama4_checkpoint_is_read_text_only(tmp_path) -> None:
    """Llama 4 reads images where its tokenizer has their tokens (`llama4_vision`, its own
    row); an FP8 checkpoint of it (Maverick's release) is read as its text model, as before."""
    llama4_vision_testlib.write_processor_files(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA4_VISION))
    assert read_model_config(str(tmp_path)).architecture == "llama4_vision"
    fp8 = {**LLAMA4_VISION, "quantization_config": FP8}
    (tmp_path / "config.json").write_text(json.dumps(fp8))
    config = read_model_config(str(tmp_path))
    assert config.architecture == "llama4" and config.vision is None


def test_a_refused_option_is_one_line_and_exit_2_from_pagoda_serve(tmp_path) -> None:
    """`pagoda serve` on a config.json alone (the refusal comes before any weight is read)."""
    (tmp_path / "config.json").write_text(json.dumps({**QWEN2_VL, "quantization_config": FP8}))
    cmd = [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--port", "0",
           "--model", str(tmp_path)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagoda serve: error: "), result.stderr
    _assert_refusal(lines[0].removeprefix("pagoda serve: error: "), "qwen2_vl", "fp8_checkpoint")
    assert "Traceback" not in result.stderr and "listening on" not in result.stderr


def test_every_recurrent_case_whose_layers_are_untested_in_fp8_has_a_row_that_says_so(tmp_path):
    """The rows name architectures, so a family with layers FP8 is not tested on (a recurrent
    mixer other than Mamba2's: Mamba-1, the short conv, Gated DeltaNet, KDA; Zamba2's shared
    blocks) must have a row refusing it: read from each hybrid test case's config.json (as
    transformers writes it), none is left to `--quantization fp8`."""
    import transformers
    from hf_oracle import _LM_CLASSES, TINY
    from hybrid_cases import CASES

    seen = set()
    for name, (arch, overrides) in CASES.items():
        config = getattr(transformers, f"{arch}Config")(**(dict(TINY, pad_token_id=0) | overrides))
        config.architectures = [_LM_CLASSES.get(arch, f"{arch}ForCausalLM")]
        config.save_pretrained(tmp_path / name)
        mc = read_model_config(str(tmp_path / name))
        m = mc.family.mamba
        if m is not None and (m.mixer != "mamba2" or m.zamba2 is not None):
            seen.add(m.mixer)
            assert not family_options.tested(mc.architecture, "fp8"), name
    assert {"mamba1", "short_conv", "gated_deltanet", "kda", "mamba2"} <= seen

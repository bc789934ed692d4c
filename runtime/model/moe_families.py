"""The config readers of the mixture-of-experts families (and their dense siblings) added
beside DeepSeek's and GLM-4.5's, gathered so that the shared tables (`hf_tables`'
HF_ARCHITECTURES and defaults, `family_fields.FIELDS`, `registry.MODEL_CLASSES`) take them in
one entry each. Each module names its architectures (config.json's ->
`ModelConfig.architecture`), transformers' config defaults, its model class, `family_fields`
(`family_fields.Fields`' signature) and, where the family has them, the keys whose null means
none (`NULLABLE`), a partial rotary (`PARTIAL_ROTARY`) and its own rotary reading (`rope`)."""

from __future__ import annotations

from pagoda.runtime.model import (
    afmoe_config,
    aria_config,
    beam_config,
    cohere2_moe_config,
    cohere_compass_config,
    dbrx_config,
    doge_config,
    dory_config,
    dots1_config,
    ergo_config,
    ernie4_5_moe_config,
    exaone_moe_config,
    flex_olmo_config,
    flint_config,
    granite_swa_config,
    hrm_text_config,
    hunyuan_config,
    hy_v3_config,
    jetmoe_config,
    kolibri1_config,
    laguna_config,
    longcat_flash_config,
    mellum_config,
    mimo_v2_flash_config,
    minicpm5_moe_config,
    minimax_m2_config,
    minimax_m3_config,
    mllama_config,
    phimoe_config,
    solar_open_config,
)

MODULES = (
    ernie4_5_moe_config,
    hunyuan_config,
    dots1_config,
    minimax_m2_config,
    phimoe_config,
    exaone_moe_config,
    flex_olmo_config,
    afmoe_config,
    dbrx_config,
    solar_open_config,
    cohere2_moe_config,
    hy_v3_config,
    jetmoe_config,
    laguna_config,
    mimo_v2_flash_config,
    minicpm5_moe_config,
    granite_swa_config,
    kolibri1_config,
    mellum_config,
    ergo_config,
    longcat_flash_config,
    dory_config,
    flint_config,
    beam_config,
    doge_config,
    minimax_m3_config,
    mllama_config,
    aria_config,
    hrm_text_config,
    cohere_compass_config,
)
ARCHITECTURES = {k: v for m in MODULES for k, v in m.ARCHITECTURES.items()}
DEFAULTS = {k: v for m in MODULES for k, v in m.DEFAULTS.items()}
MODEL_CLASSES = {k: v for m in MODULES for k, v in m.MODEL_CLASSES.items()}
FIELDS = {arch: m.family_fields for m in MODULES for arch in m.ARCHITECTURES.values()}
# multimodal wrappers read text-only: their text model's family by text_config's model_type,
# and the wrapper's own tie_word_embeddings default (`hf_tables.TEXT_MODEL_TYPES`, `WRAPPER_TIES`)
TEXT_MODEL_TYPES = {k: v for m in MODULES for k, v in getattr(m, "TEXT_MODEL_TYPES", {}).items()}
WRAPPER_TIES = {k: v for m in MODULES for k, v in getattr(m, "WRAPPER_TIES", {}).items()}
# config.json keys whose null means "none" rather than the default
NULLABLE = {k: v for m in MODULES for k, v in getattr(m, "NULLABLE", {}).items()}
# the config.json key of the norms' eps where it is not rms_norm_eps
EPS = {k: v for m in MODULES for k, v in getattr(m, "EPS", {}).items()}
# the families whose rotary may be partial (`partial_rotary_factor`)
PARTIAL_ROTARY = tuple(a for m in MODULES for a in getattr(m, "PARTIAL_ROTARY", ()))
# a family's own rotary reading, (cfg, theta, rope_scaling, head_dim) -> (theta, rope_scaling)
ROPE = {arch: m.rope for m in MODULES if hasattr(m, "rope") for arch in m.ARCHITECTURES.values()}
# a family's stored tensor names listed as its model reads them, (weights) -> None (the HF loader
# and the weights estimate run it on the opened checkpoint)
RENAMES = {arch: m.rename_tensors for m in MODULES if hasattr(m, "rename_tensors")
           for arch in m.ARCHITECTURES.values()}  # fmt: skip
# what a family changes in the tensors `checkpoint_shapes.expected_shapes` lists, (c, out) -> None
CHECKPOINT_SHAPES = {arch: m.checkpoint_shapes for m in MODULES if hasattr(m, "checkpoint_shapes")
                     for arch in m.ARCHITECTURES.values()}  # fmt: skip

"""The config readers of the mixture-of-experts families added beside DeepSeek's and GLM-4.5's,
gathered so that the shared tables (`hf_loader.HF_ARCHITECTURES` and its defaults,
`family_fields.FIELDS`, `registry.MODEL_CLASSES`) take them in one entry each. Each module
names its architectures (config.json's -> `ModelConfig.architecture`), transformers' config
defaults, its model class, and `family_fields` (`family_fields.Fields`' signature)."""

from __future__ import annotations

from pagoda.runtime.model import ernie4_5_moe_config

MODULES = (ernie4_5_moe_config,)
ARCHITECTURES = {k: v for m in MODULES for k, v in m.ARCHITECTURES.items()}
DEFAULTS = {k: v for m in MODULES for k, v in m.DEFAULTS.items()}
MODEL_CLASSES = {k: v for m in MODULES for k, v in m.MODEL_CLASSES.items()}
FIELDS = {arch: m.family_fields for m in MODULES for arch in m.ARCHITECTURES.values()}

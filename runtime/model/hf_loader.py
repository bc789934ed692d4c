"""Hugging Face model directory → (ModelConfig, tensors, Tokenizer, sampling defaults).

Reads `config.json` (for Gemma 3's multimodal checkpoints, its `text_config`), the safetensors
weights (`safetensors_weights`: one file or shards named by `model.safetensors.index.json`, read
lazily), `tokenizer.json` (or a tiktoken file: `tiktoken_files`) with the chat template
(`template_files`: a processor's `chat_template.json`, `chat_template.jinja` or
`tokenizer_config.json`), and
`generation_config.json` (EOS ids, sampling defaults).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagoda.runtime.config import FamilyConfig, ModelConfig
from pagoda.runtime.model import (
    config_keys,
    family_fields,
    moe_families,
    special_tokens,
    tiktoken_files,
)
from pagoda.runtime.model import deepseek_config as deepseek
from pagoda.runtime.model import glm4_moe_config as glm4_moe
from pagoda.runtime.model import llama4_config as llama4
from pagoda.runtime.model import mamba_config as hybrid
from pagoda.runtime.model.checkpoint_check import check_checkpoint
from pagoda.runtime.model.ops import rope_inv_freq, rotary_dim
from pagoda.runtime.model.safetensors_weights import INDEX, SafetensorsWeights
from pagoda.runtime.model.template_files import read_chat_template, read_tool_template
from pagoda.runtime.model.template_files import read_json_object as _read_json
from pagoda.runtime.model.tokenizer import Tokenizer
from tokenizers import Tokenizer as HFTokenizer

if TYPE_CHECKING:
    from pagoda.runtime.quantization.fp8 import Fp8Scheme

# `architectures` in config.json -> `ModelConfig.architecture`
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Phi3ForCausalLM": "phi3",  # Phi-3, Phi-3.5-mini, phi-4, Phi-4-mini (model/phi3.py)
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its text model; the vision tower is not read
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Olmo2ForCausalLM": "olmo2",
    "Olmo3ForCausalLM": "olmo3",  # OLMo 2's layer, sliding-window layers (model/olmo2.py)
    "GraniteForCausalLM": "granite",
    "GraniteMoeForCausalLM": "granitemoe",
    "OlmoeForCausalLM": "olmoe",
    "GlmForCausalLM": "glm",  # GLM-4-9B-chat-hf (model/glm4.py)
    "Glm4ForCausalLM": "glm4",  # GLM-4-0414, GLM-Z1 (model/glm4.py)
    "SmolLM3ForCausalLM": "smollm3",  # Llama with NoPE layers (`FamilyConfig.rope_layers`)
    "CohereForCausalLM": "cohere",  # Command R / R+, Aya (model/cohere.py)
    "Cohere2ForCausalLM": "cohere2",  # Command R7B, Command A (model/cohere.py)
    **deepseek.ARCHITECTURES,  # DeepSeek-V2/V3, Kimi K2, Moonlight (model/deepseek.py)
    "GptOssForCausalLM": "gpt_oss",  # gpt-oss-20b/120b: sinks, biased experts (model/gpt_oss.py)
    # Mistral-Small-3.1/3.2, Devstral-Small, Magistral-Small: the text model (`text_config`,
    # its `model_type` naming the family: `_TEXT_MODEL_TYPES`); the vision tower is not read
    "Mistral3ForConditionalGeneration": "mistral",
    "MinistralForCausalLM": "ministral",  # Ministral-8B-2410: window layers by layer_types
    "Exaone4ForCausalLM": "exaone4",  # EXAONE 4.0 (model/exaone4.py)
    "SeedOssForCausalLM": "seed_oss",  # Seed-OSS-36B: Llama's with q/k/v biases
    "Ernie4_5ForCausalLM": "ernie4_5",  # ERNIE-4.5-0.3B: interleaved rotary (ernie4_5.py)
    "ArceeForCausalLM": "arcee",  # AFM-4.5B: ReLU² MLP, no gate (ungated_mlp.py)
    "Starcoder2ForCausalLM": "starcoder2",  # LayerNorm with biases, GELU MLP (starcoder2.py)
    "ApertusForCausalLM": "apertus",  # xIELU MLP, q/k norms (apertus.py)
    "Ministral3ForCausalLM": "ministral3",  # Ministral 3: yarn, q scaled by position (ministral3.py)
    **glm4_moe.ARCHITECTURES,  # GLM-4.5, GLM-4.5-Air, GLM-4.6 (model/glm4_moe.py)
    # EXAONE 3.0 / 3.5: Llama's, GPT-style names (safetensors_weights); EXAONE 4.5: its text model
    "ExaoneForCausalLM": "exaone",
    "Exaone4_5_ForConditionalGeneration": "exaone4",
    "NemotronForCausalLM": "nemotron",  # LayerNorm1P, ReLU² MLP, partial rotary (nemotron.py)
    "InternLM3ForCausalLM": "internlm3",  # Llama's (qkv_bias / bias)
    "GemmaForCausalLM": "gemma",  # Gemma 2's norms and GeGLU in Llama's layer (gemma2.py)
    "OlmoForCausalLM": "olmo",  # OLMo v1: parameter-free LayerNorm, clip_qkv (olmo.py)
    "MiniCPM3ForCausalLM": "minicpm3",  # DeepSeek's latent attention, muP scales (minicpm3.py)
    "FalconForCausalLM": "falcon",  # falcon-7b/40b/180b: fused q/k/v, parallel layer (falcon.py)
    "GPTNeoXForCausalLM": "gpt_neox",  # Pythia, GPT-NeoX-20B: Falcon's model (falcon.py)
    "StableLmForCausalLM": "stablelm",  # StableLM (2): LayerNorms, partial rotary (stablelm.py)
    "Jais2ForCausalLM": "jais2",  # Nemotron's model without 1 + w or a partial rotary
    "VaultGemmaForCausalLM": "vaultgemma",  # Gemma 2's, two norms a layer (gemma2.py)
    "HyperCLOVAXForCausalLM": "hyperclovax",  # Granite's, peri-norms (model/granite.py)
    "HeliumForCausalLM": "helium",  # Helium-1: interleaved rotary (model/helium.py)
    "CwmForCausalLM": "cwm",  # Code World Model: Llama's, window layers (layer_types)
    "PhiForCausalLM": "phi",
    "GPTJForCausalLM": "gptj",  # GPT-J: Phi's model with the interleaved rotary (model/phi.py)  # phi-2: parallel layer, LayerNorm with biases, GELU MLP (phi.py)
    **llama4.ARCHITECTURES,  # Llama 4 Scout, Maverick: the text model (model/llama4.py)
    **hybrid.ARCHITECTURES,  # Granite 4.0, Bamba: Mamba2 and attention layers (granite_hybrid.py)
    **moe_families.ARCHITECTURES,  # ERNIE 4.5 MoE, ... (model/moe_families.py)
}
# a multimodal wrapper's text model, by its text_config's model_type (transformers' default
# first); another model_type is refused
_TEXT_MODEL_TYPES = {
    "Mistral3ForConditionalGeneration": {"mistral": "mistral", "ministral": "ministral",
                                         "ministral3": "ministral3"},
    "Exaone4_5_ForConditionalGeneration": {"exaone4": "exaone4", "exaone4_5_text": "exaone4"},
}  # fmt: skip
# a wrapper's own default for tie_word_embeddings (else true, as Gemma 3's and Mistral 3's)
_WRAPPER_TIES = {"exaone4_5": False}
SUPPORTED = HF_ARCHITECTURES  # the same table under the name importers use
# What transformers assumes when config.json leaves a field out (Gemma 3's text_config is
# sparse in the published multimodal checkpoints); elsewhere 10,000 for rope_theta, 1e-6 for
# rms_norm_eps, 2048 for max_position_embeddings, no window and num_key_value_heads = heads.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3": {
        "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
        "max_position_embeddings": 131_072, "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh", "bos_token_id": 2, "eos_token_id": 1,
    },
    "gemma2": {
        "vocab_size": 256_000, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256,
        "sliding_window": 4096, "max_position_embeddings": 8192, "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh", "bos_token_id": 2, "eos_token_id": 1,
        "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
    },
    "phi3": {"original_max_position_embeddings": 4096, "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-5},  # Phi3Config's (its class default for the original context)
    "mistral": {"num_key_value_heads": 8, "max_position_embeddings": 131_072,
                "sliding_window": 4096, "bos_token_id": 1, "eos_token_id": 2},
    "exaone4": {"rms_norm_eps": 1e-5, "sliding_window": 4096, "sliding_window_pattern": 4,
                "num_key_value_heads": 32,
                "bos_token_id": 0, "eos_token_id": 2},
    "ministral": {"num_key_value_heads": 8, "max_position_embeddings": 131_072,
                  "sliding_window": 4096, "rms_norm_eps": 1e-6, "bos_token_id": 1,
                  "eos_token_id": 2},
    "ministral3": {"num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 262_144, "bos_token_id": 1, "eos_token_id": 2},
    "seed_oss": {"attention_bias": True, "head_dim": 128, "rms_norm_eps": 1e-6,
                 "num_key_value_heads": 8, "max_position_embeddings": 524_288,
                 "bos_token_id": 0, "eos_token_id": 2},
    "ernie4_5": {"num_key_value_heads": 2, "head_dim": 128, "rms_norm_eps": 1e-5,
                 "rope_theta": 500_000.0,  # transformers' default_theta
                 "max_position_embeddings": 131_072, "tie_word_embeddings": True,
                 "bos_token_id": 1, "eos_token_id": 2},
    "arcee": {"hidden_act": "relu2", "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
              "bos_token_id": 128_000, "eos_token_id": 128_001},
    "starcoder2": {"hidden_act": "gelu_pytorch_tanh", "norm_epsilon": 1e-5, "use_bias": True,
                   "num_key_value_heads": 2, "max_position_embeddings": 4096,
                   "tie_word_embeddings": True, "bos_token_id": 50256, "eos_token_id": 50256},
    "apertus": {"hidden_act": "xielu", "rms_norm_eps": 1e-5, "max_position_embeddings": 65_536,
                "rope_theta": 12_000_000.0,  # transformers' default_theta
                "bos_token_id": 1, "eos_token_id": 2},
    "exaone": {"vocab_size": 102_400, "intermediate_size": 14_336, "num_key_value_heads": 8,
               "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500_000.0,
               "bos_token_id": 1, "eos_token_id": 361},
    "nemotron": {"hidden_act": "relu2", "norm_eps": 1e-5, "partial_rotary_factor": 0.5,
                 "max_position_embeddings": 4096, "bos_token_id": 2, "eos_token_id": 3},
    "internlm3": {"vocab_size": 128_512, "num_key_value_heads": 2, "head_dim": 128,
                  "max_position_embeddings": 32_768, "rms_norm_eps": 1e-5, "bos_token_id": 1,
                  "eos_token_id": 2},
    "gemma": {"vocab_size": 256_000, "hidden_size": 3072, "intermediate_size": 24_576,
              "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
              "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192,
              "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1},
    "olmo": {"vocab_size": 50_304, "hidden_size": 4096, "intermediate_size": 11_008,
             "num_hidden_layers": 32, "num_attention_heads": 32, "pad_token_id": 1,
             "eos_token_id": 50_279},
    "minicpm3": {"vocab_size": 73_448, "hidden_size": 2560, "intermediate_size": 6400,
                 "num_hidden_layers": 62, "num_attention_heads": 40, "rms_norm_eps": 1e-5,
                 "max_position_embeddings": 32_768, "tie_word_embeddings": True,
                 "kv_lora_rank": 256, "q_lora_rank": 768, "qk_nope_head_dim": 64,
                 "qk_rope_head_dim": 32, "scale_emb": 12, "scale_depth": 1.4,
                 "dim_model_base": 256, "rope_interleave": False, "bos_token_id": 1,
                 "eos_token_id": 2},
    "falcon": {"vocab_size": 65_024, "hidden_size": 4544, "num_hidden_layers": 32,
               "num_attention_heads": 71, "layer_norm_epsilon": 1e-5, "hidden_act": "gelu",
               "multi_query": True, "parallel_attn": True, "new_decoder_architecture": False,
               "max_position_embeddings": 2048, "tie_word_embeddings": True,
               "bos_token_id": 11, "eos_token_id": 11},
    "gpt_neox": {"vocab_size": 50_432, "hidden_size": 6144, "num_hidden_layers": 44,
                 "num_attention_heads": 64, "intermediate_size": 24_576, "hidden_act": "gelu",
                 "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25, "attention_bias": True,
                 "use_parallel_residual": True, "max_position_embeddings": 2048,
                 "bos_token_id": 0, "eos_token_id": 2},
    "stablelm": {"vocab_size": 50_304, "intermediate_size": 6912, "hidden_size": 2560,
                 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                 "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25,
                 "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 0},
    "jais2": {"vocab_size": 150_272, "hidden_size": 3328, "intermediate_size": 26_624,
              "num_attention_heads": 26, "hidden_act": "relu2", "max_position_embeddings": 8192,
              "layer_norm_eps": 1e-5, "attention_bias": True, "mlp_bias": True,
              "bos_token_id": 0, "eos_token_id": 150_024},
    "hyperclovax": {"bos_token_id": 1, "eos_token_id": 2},
    "gptj": {"vocab_size": 50_400, "max_position_embeddings": 2048, "hidden_size": 4096,
             "num_hidden_layers": 28, "num_attention_heads": 16, "rotary_dim": 64,
             "hidden_act": "gelu_new", "layer_norm_epsilon": 1e-5, "bos_token_id": 50_256,
             "eos_token_id": 50_256},
    "cwm": {"vocab_size": 128_256, "hidden_size": 6144, "intermediate_size": 21_504,
            "num_hidden_layers": 64, "num_attention_heads": 48, "num_key_value_heads": 8,
            "head_dim": 128, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5,
            "sliding_window": 8192, "bos_token_id": 128_000,
            "eos_token_id": [128_001, 128_008, 128_009]},
    "helium": {"vocab_size": 48_000, "hidden_size": 2560, "intermediate_size": 7040,
               "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 20,
               "head_dim": 128, "rms_norm_eps": 1e-8, "max_position_embeddings": 4096,
               "rope_theta": 100_000.0,  # transformers' default_theta
               "bos_token_id": 1, "eos_token_id": 2},
    "phi": {"vocab_size": 51_200, "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 24, "num_attention_heads": 32, "hidden_act": "gelu_new",
            "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.5, "attention_bias": True,
            "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "num_key_value_heads": 8,
                "max_position_embeddings": 131_072, "rope_theta": 1_000_000.0,
                "rms_norm_eps": 1e-5},
    "qwen2": {"max_position_embeddings": 32_768},
    "qwen3": {"max_position_embeddings": 32_768, "head_dim": 128},
    "qwen3moe": {"num_experts_per_tok": 8, "norm_topk_prob": False,  # 128 experts (below)
                 "num_key_value_heads": 4, "max_position_embeddings": 32_768},
    "qwen2moe": {"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                 "shared_expert_intermediate_size": 5632, "norm_topk_prob": False,
                 "qkv_bias": True, "max_position_embeddings": 32_768},
    "olmo2": {"rms_norm_eps": 1e-5},
    "olmo3": {"rms_norm_eps": 1e-5, "rope_theta": 500_000.0, "sliding_window": 4096},
    **{arch: {"partial_rotary_factor": 0.5, "attention_bias": True, "head_dim": 128,
              "rms_norm_eps": 1.5625e-07, "max_position_embeddings": 131_072,
              "eos_token_id": [151329, 151336, 151338]} for arch in ("glm", "glm4")},
    **{arch: {"logit_scale": 0.0625, "layer_norm_eps": 1e-5, "max_position_embeddings": 8192,
              "tie_word_embeddings": True, "bos_token_id": 5, "eos_token_id": 255001}
       for arch in ("cohere", "cohere2")},
    "smollm3": {"no_rope_layer_interval": 4, "max_position_embeddings": 32_768,
                "tie_word_embeddings": True},
    "granitemoe": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "olmoe": {"num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False,
              "rms_norm_eps": 1e-5, "max_position_embeddings": 4096},
    "gpt_oss": {  # GptOssConfig's (and its yarn rotary, `_GPT_OSS_ROPE`)
        "vocab_size": 201_088, "hidden_size": 2880, "intermediate_size": 2880,
        "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4,
        "sliding_window": 128, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5,
        "rope_theta": 150_000.0, "attention_bias": True, "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
    },
    **deepseek.DEFAULTS,
    **glm4_moe.DEFAULTS,
    **llama4.DEFAULTS,
    **hybrid.DEFAULTS,
    **moe_families.DEFAULTS,
}  # fmt: skip
_DEFAULTS["vaultgemma"] = _DEFAULTS["gemma2"]  # (VaultGemmaConfig is Gemma2Config's)
# GptOssConfig's rotary where config.json names none (neither rope_scaling nor rope_parameters)
_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip
# a null that means "none" rather than "the default" (Mistral's window: v0.2 on say null)
_NULLABLE = {
    "mistral": ("sliding_window",),
    "exaone4": ("sliding_window",),
    "ministral": ("sliding_window",),
    "cwm": ("sliding_window",),
    "ministral3": ("sliding_window",),
    "cohere2": ("sliding_window",),
    "olmo3": ("sliding_window",),
    **dict.fromkeys(
        ("gemma2", "vaultgemma"),
        ("sliding_window", "final_logit_softcapping", "attn_logit_softcapping"),
    ),
    **{arch: deepseek.NULLABLE for arch in deepseek.DEFAULTS},
    "llama4": llama4.NULLABLE,
    "minicpm3": ("q_lora_rank", "v_head_dim", "scale_depth", "dim_model_base"),  # null: derived
    **moe_families.NULLABLE,
}
_EPS = {"cohere": "layer_norm_eps", "cohere2": "layer_norm_eps"}  # the norms' eps, by family
_EPS.update(starcoder2="norm_epsilon", nemotron="norm_eps", phi="layer_norm_eps")
_EPS.update(falcon="layer_norm_epsilon", gpt_neox="layer_norm_eps", stablelm="layer_norm_eps")
_EPS.update(jais2="layer_norm_eps", gptj="layer_norm_epsilon")
# the rotary transformers' config class fills in when config.json has neither rope_parameters
# nor rope_scaling
_DEFAULT_ROPE = {
    "ministral3": {
        "rope_type": "yarn",
        "rope_theta": 1_000_000.0,
        "factor": 16.0,
        "original_max_position_embeddings": 16384,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1,
    },
    "cwm": {
        "rope_type": "llama3",
        "rope_theta": 1_000_000.0,
        "factor": 16.0,
        "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    },
    "apertus": {
        "rope_type": "llama3",
        "rope_theta": 12_000_000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    },
}
# the families whose transformers models read partial_rotary_factor
_PARTIAL_ROTARY = ("phi3", "glm", "glm4", "glm4_moe", "bamba", "nemotron", "phi", "gpt_neox",
                   "stablelm", "gptj", *moe_families.PARTIAL_ROTARY)  # fmt: skip
_FUSED = ("phi3", "glm", "glm4")  # fused qkv_proj / gate_up_proj, listed as Llama's (phi3.py)
# generation_config.json keys that become a request's defaults (vLLM's set, less max_tokens)
SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
_ACTIVATIONS.update({"gelu_tanh": "gelu_tanh", "gelu_python_tanh": "gelu_tanh"})
_ACTIVATIONS["gelu_new"] = "gelu_tanh"  # (Phi's: the tanh approximation)
_ACTIVATIONS["gelu_fast"] = "gelu_tanh"  # (GPT-NeoX-20B's: the same formula)
_ACTIVATIONS["gelu"] = "gelu"  # exact (Falcon's ungated MLP; a gated one refuses it)
_ACTIVATIONS.update({"relu2": "relu2", "xielu": "xielu"})  # ungated MLPs' (Arcee's, Apertus')


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def architecture(cfg: Mapping[str, Any]) -> str:
    """`ModelConfig.architecture` of a config.json, or ValueError naming what is supported."""
    archs = cfg.get("architectures") or []
    arch = next((HF_ARCHITECTURES[a] for a in archs if a in HF_ARCHITECTURES), None)
    if arch is None:
        found = ", ".join(archs) if archs else "none named in config.json"
        raise ValueError(
            f"unsupported architecture ({found}); supported: {', '.join(HF_ARCHITECTURES)}"
        )
    wrapper = next((a for a in archs if a in HF_ARCHITECTURES), "")
    if wrapper in _TEXT_MODEL_TYPES:  # its text model's family
        text = cfg.get("text_config") or {}
        kinds = _TEXT_MODEL_TYPES[wrapper]
        kind = text.get("model_type", next(iter(kinds))) if isinstance(text, Mapping) else None
        if kind not in kinds:
            raise ValueError(f"{wrapper} with a text_config of model_type {kind!r} is not "
                             f"supported (supported: {', '.join(kinds)})")  # fmt: skip
        return kinds[kind]
    return arch


def _window_layers(cfg: Mapping[str, Any], arch: str, n: int, window: int | None):
    if window is None:
        return ()
    types = cfg.get("layer_types")
    if types:
        if len(types) != n:
            raise ValueError(f"layer_types names {len(types)} layers, the model has {n}")
        return tuple(t == "sliding_attention" for t in types)
    if arch in ("gemma2", "vaultgemma", "gpt_oss"):  # transformers': even layers slide
        return tuple(bool((i + 1) % 2) for i in range(n))
    if arch == "cohere2":  # the older configs: every `sliding_window_pattern`-th layer global
        pattern = int(cfg.get("sliding_window_pattern") or 4)
        return tuple(bool((i + 1) % pattern) for i in range(n))
    if arch == "exaone4":  # every `sliding_window_pattern`-th layer global
        pattern = cfg.get("sliding_window_pattern")
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise ValueError(f"EXAONE 4's sliding_window_pattern {pattern!r} without layer_types "
                             "is not supported (transformers reads an integer)")  # fmt: skip
        return tuple(bool((i + 1) % pattern) for i in range(n))
    if arch == "cwm":  # CwmConfig's default: every fourth layer global, from the first
        return tuple(i % 4 != 0 for i in range(n))
    if arch == "olmo3":  # transformers' default: every fourth layer is global
        return tuple(bool((i + 1) % 4) for i in range(n))
    if arch == "gemma3":  # the older configs: every `sliding_window_pattern`-th layer is global
        # (transformers reads no other key: the `_sliding_window_pattern` it writes goes with
        # `layer_types`)
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return tuple(bool((i + 1) % pattern) for i in range(n))
    if arch in ("qwen2", "qwen3"):  # layers from max_window_layers on slide
        first = int(cfg.get("max_window_layers", 0))
        return tuple(i >= first for i in range(n))
    if arch == "qwen2moe":  # transformers 5: every other layer below max_window_layers
        last = int(cfg.get("max_window_layers", 28))
        return tuple(bool((i + 1) % 2) and i < last for i in range(n))
    return ()  # Mistral, Mixtral, Qwen3-MoE (whatever max_window_layers says): every layer


def _sliding_window(cfg: Mapping[str, Any], arch: str) -> int | None:
    window = cfg.get("sliding_window")
    if arch == "smollm3":
        return _smollm3_window(cfg)
    if arch == "qwen2moe":  # as the other Qwens: a window only with use_sliding_window
        return int(window) if window and cfg.get("use_sliding_window", False) else None
    if arch in ("qwen2", "qwen3", "qwen3moe") and not cfg.get("use_sliding_window", False):
        return None  # Qwen configs carry a window they do not use unless told to
    if arch in ("phi3", "gemma2", "vaultgemma", "gpt_oss"):  # every layer (Phi-3), or some
        return int(window) if window else None
    if arch == "cohere2" and not window:  # its global layers are told apart by having none
        raise ValueError("Cohere 2 without a sliding_window is not supported")
    if arch not in ("mistral", "mixtral", "gemma3", "qwen2", "qwen3", "qwen3moe", "olmo3",
                    "cohere2", "ministral", "ministral3", "exaone4", "starcoder2", "cwm"):  # fmt: skip
        return None
    return int(window) if window else None


def _smollm3_window(cfg: Mapping[str, Any]) -> int | None:
    """SmolLM3's window: on the `layer_types` layers that say sliding_attention (by default the
    NoPE layers, with use_sliding_window and a sliding_window); transformers' masks slide by
    layer_types, its flash path only with use_sliding_window too, so a config where the two
    disagree is refused."""
    types, window = cfg.get("layer_types"), cfg.get("sliding_window")
    if not cfg.get("use_sliding_window", False):
        if types and "sliding_attention" in types:
            raise ValueError("SmolLM3 layer_types names sliding_attention layers but "
                             "use_sliding_window is false (transformers' attention paths "
                             "disagree on such a config)")  # fmt: skip
        return None
    if not window:
        if types and "sliding_attention" in types:
            raise ValueError("SmolLM3 layer_types names sliding_attention layers without a "
                             "sliding_window")  # fmt: skip
        return None
    return int(window)


def _family(
    cfg: Mapping[str, Any], arch: str, n: int, scaling: Mapping[str, Any] | None = None
) -> FamilyConfig:
    window = _sliding_window(cfg, arch)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if act not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden activation {act!r}")
    layers = _window_layers(cfg, arch, n, window)
    fields: dict[str, Any] = {
        "sliding_window": window,
        "window_layers": layers,
        "hidden_act": _ACTIVATIONS[act],
    }
    if arch in family_fields.FIELDS:  # what the family sets (model/family_fields.py)
        fields.update(family_fields.FIELDS[arch](cfg, arch, n, window, layers, scaling))
    if fields.get("num_experts") and fields["hidden_act"] != "silu":  # the fused-MoE kernel's
        raise ValueError(f"hidden activation {act!r} in a mixture of experts is not supported "
                         "(experts run SwiGLU: silu)")  # fmt: skip
    return FamilyConfig(**fields)


def _tied(top: Mapping[str, Any], cfg: Mapping[str, Any]) -> bool:
    """Whether the LM head is the embedding: a multimodal checkpoint's top-level flag decides
    (transformers ties by it, whatever its text_config says; by default true, EXAONE 4.5's
    false: `_WRAPPER_TIES`); else the text model's (its family's default when left out)."""
    if "text_config" in top:
        return bool(top.get("tie_word_embeddings", _WRAPPER_TIES.get(top.get("model_type"), True)))
    return bool(cfg.get("tie_word_embeddings", False))


def read_config(model_dir: Path) -> ModelConfig:
    top = _read_json(model_dir / "config.json")
    if not top:
        raise ValueError(f"{model_dir} has no config.json")
    arch = architecture(top)
    try:
        return _model_config(model_dir, top, arch)
    except KeyError as e:  # a field every checkpoint of the family has, left out
        where = "config.json's text_config" if "text_config" in top else "config.json"
        raise ValueError(f"{where} lacks {e.args[0]!r}, which a {arch} model needs") from None


def _model_config(model_dir: Path, top: dict[str, Any], arch: str) -> ModelConfig:
    read_quantization(model_dir)  # a quantization it cannot load fails with the metadata
    cfg = config_keys.renamed(top.get("text_config") or top, arch)  # a wrapper's: its text model
    cfg = {**_DEFAULTS.get(arch, {}),
           **{k: v for k, v in cfg.items() if v is not None or k in _NULLABLE.get(arch, ())}}  # fmt: skip
    cfg = config_keys.derived(cfg, arch)
    if arch == "gpt_oss" and not cfg.get("rope_scaling") and not cfg.get("rope_parameters"):
        cfg["rope_scaling"] = dict(_GPT_OSS_ROPE)
    if arch in _DEFAULT_ROPE and not {"rope_parameters", "rope_scaling"} & set(cfg):
        # (a top-level rope_theta alone does not count: transformers takes the default's)
        cfg["rope_parameters"] = _DEFAULT_ROPE[arch]
    if arch in hybrid.DEFAULTS:  # Granite 4.0's shared MLP width, Bamba's half rotary,
        cfg = {**cfg, **hybrid.overrides(cfg, arch)}  # Nemotron-H's layers from their types
    gen = _read_json(model_dir / "generation_config.json")
    heads = int(cfg["num_attention_heads"])
    layers = int(cfg["num_hidden_layers"])
    by_kind = "full_attention" if arch in ("gemma3", "olmo3") else None  # per layer kind
    rope_theta, scaling = family_fields.read_rope(cfg, by_kind, arch == "phi3")
    if arch == "llama4":  # the dense MLP's width
        cfg = {**cfg, **llama4.overrides(cfg)}
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    rope_dim = head_dim
    if arch in (*deepseek.ARCHITECTURES.values(), "minicpm3"):  # latent attention: one row
        head_dim, kv_heads = deepseek.head_dim(cfg, arch), 1  # per token
        rope_dim = int(cfg["qk_rope_head_dim"])  # (the dims that rotate)
    if arch in moe_families.ROPE:  # the family's own reading (Hunyuan's NTK alpha)
        rope_theta, scaling = moe_families.ROPE[arch](cfg, rope_theta, scaling, head_dim)
    rope_inv_freq(rope_dim, rope_theta, scaling)  # an unsupported rope_scaling fails here
    rope_inv_freq(rope_dim, rope_theta, scaling, long=True)  # longrope: its long factors too
    if arch not in _PARTIAL_ROTARY and rotary_dim(rope_dim, scaling) != rope_dim:
        raise ValueError(f"a partial rotary embedding (partial_rotary_factor "
                         f"{scaling['partial_rotary_factor']}) is not supported for {arch}")  # fmt: skip
    # every id that ends generation (`special_tokens`): generation_config.json's, a multimodal
    # config's own (Gemma 3's [1, 106]: <end_of_turn> too), its text_config's or the family
    # default; the tokenizer's `eos_token` joins them in `read_tokenizer`
    ids = (gen.get("eos_token_id"), top.get("eos_token_id"), cfg.get("eos_token_id"))
    eos = tuple(dict.fromkeys(i for v in ids for i in _as_ids(v)))
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get(_EPS.get(arch, "rms_norm_eps"), 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=_tied(top, cfg),
        attention_bias=arch == "qwen2"
        or bool(cfg.get("attention_bias", cfg.get("qkv_bias", cfg.get("use_bias")))),
        bos_token_id=cfg.get("bos_token_id", top.get("bos_token_id")),
        eos_token_ids=eos,
        architecture=arch,
        family=_family(cfg, arch, layers, scaling),
    )


def read_quantization(model_dir: Path) -> Fp8Scheme | None:
    """The FP8 format config.json's `quantization_config` declares (None: a 16/32-bit
    checkpoint); ValueError, one line, for a quantization this runtime does not load."""
    from pagoda.runtime.quantization.fp8 import scheme_from_hf_config

    return scheme_from_hf_config(_read_json(model_dir / "config.json"))


def read_sampling_defaults(model_dir: Path) -> dict[str, float | int]:
    """generation_config.json's sampling fields (`SAMPLING_DEFAULTS`) that are set, for the
    requests that leave them out (as vLLM's `generation_config="auto"`)."""
    gen = _read_json(model_dir / "generation_config.json")
    out: dict[str, float | int] = {}
    for key in SAMPLING_DEFAULTS:
        value = gen.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = int(value) if key == "top_k" else float(value)
    if out.get("top_k") == 0:  # transformers' "off"
        out["top_k"] = -1
    return out


def read_weights(model_dir: Path) -> SafetensorsWeights:
    return SafetensorsWeights.open(model_dir)


def read_tokenizer(model_dir: Path, config: ModelConfig) -> Tokenizer:
    """tokenizer.json, else a tiktoken BPE file with known tokenizer code (`tiktoken_files`:
    Kimi K2, Moonlight); ValueError, one line, for a directory with neither."""
    path = model_dir / "tokenizer.json"
    tcfg = _read_json(model_dir / "tokenizer_config.json")
    sort_tool_keys = False
    if path.exists():
        hf_tok = HFTokenizer.from_file(str(path))
    elif (model_dir / tiktoken_files.TIKTOKEN_FILE).exists():
        hf_tok = tiktoken_files.read_tiktoken_dir(model_dir, tcfg)
        sort_tool_keys = tiktoken_files.sorts_tool_keys(model_dir, tcfg)
    else:
        raise ValueError(f"{model_dir} has no tokenizer.json (nor {tiktoken_files.TIKTOKEN_FILE})")
    template = read_chat_template(model_dir, tcfg)  # a processor's file first, as vLLM
    return Tokenizer(
        hf_tok,
        chat_template=template,
        tool_chat_template=read_tool_template(model_dir, tcfg),
        bos_token_id=config.bos_token_id,
        eos_token_ids=special_tokens.stop_ids(config.eos_token_ids, tokenizer=hf_tok, tcfg=tcfg),
        add_bos_token=_adds_bos(hf_tok, config.bos_token_id, tcfg),
        sort_tool_keys=sort_tool_keys,
        template_tokens=special_tokens.template_tokens(tcfg),
    )


def _adds_bos(tok: HFTokenizer, bos: int | None, tcfg: Mapping[str, Any]) -> bool:
    """Whether a prompt's text gets BOS first: what tokenizer.json's post-processor does (Llama
    3, Gemma), as transformers 5 decides with a tokenizer.json; else tokenizer_config.json's
    add_bos_token."""
    if bos is not None and tok.post_processor is not None:
        with_special = tok.encode("a", add_special_tokens=True).ids
        if len(with_special) > len(tok.encode("a", add_special_tokens=False).ids):
            return with_special[0] == bos
    return bool(tcfg.get("add_bos_token", False))


def check_weights(
    model_dir: Path, config: ModelConfig, weights: SafetensorsWeights | None = None
) -> SafetensorsWeights | None:
    """`checkpoint_check.check_checkpoint` on the directory's safetensors headers: ValueError,
    one line, where the weights do not match config.json. Returns the opened weights; None for
    a directory without safetensors files (a config alone: what is checked before loading)."""
    if weights is None:
        if not (model_dir / INDEX).exists() and not any(model_dir.glob("*.safetensors")):
            return None
        weights = read_weights(model_dir)
    if config.architecture in _FUSED:  # fused qkv_proj / gate_up_proj, listed as Llama's
        from pagoda.runtime.model.phi3 import split_fused

        split_fused(weights, config)
    if config.architecture in ("falcon", "gpt_neox"):  # the fused query_key_value, by layout
        from pagoda.runtime.model.falcon import split_qkv

        split_qkv(weights, config)
    scheme = read_quantization(model_dir)
    weights.fp8_block = None if scheme is None else scheme.block  # block-wise FP8 scales' tile
    headers = {name: weights.dtype_and_shape(name) for name in weights}
    check_checkpoint(config, headers, weights.fp8_block)
    return weights


def untie_a_distinct_head(config: ModelConfig, weights: SafetensorsWeights | None) -> ModelConfig:
    """`config` untied where it ties the LM head to the embedding but the checkpoint holds a
    head of its own that differs (as transformers 5 loads it, and `LlamaModel` builds it):
    Mistral-Small-3.1/3.2's config.json leaves tie_word_embeddings out (Mistral3Config's
    default: true) beside a distinct `lm_head.weight`. The first rows are compared (a few KiB
    read): the model compares the whole tensors at load, where rows alike further on tie it."""
    if weights is None or not config.tie_word_embeddings:
        return config
    embed, head = "model.embed_tokens.weight", "lm_head.weight"
    if head not in weights or embed not in weights:
        return config
    if weights.dtype_and_shape(head) != weights.dtype_and_shape(embed):
        return config  # (check_checkpoint refuses a head of another shape)
    import torch

    rows = min(16, weights.dtype_and_shape(head)[1][0])
    if torch.equal(weights.rows(head, rows), weights.rows(embed, rows)):
        return config
    return dataclasses.replace(config, tie_word_embeddings=False)


def load_hf_dir(
    model_dir: str | Path,
) -> tuple[ModelConfig, SafetensorsWeights, Tokenizer, dict[str, float | int]]:
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    weights = check_weights(model_dir, config, read_weights(model_dir))
    config = untie_a_distinct_head(config, weights)
    tokenizer = read_tokenizer(model_dir, config)
    config = dataclasses.replace(config, eos_token_ids=tokenizer.eos_token_ids)  # + its eos_token
    return config, weights, tokenizer, read_sampling_defaults(model_dir)

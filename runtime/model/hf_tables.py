"""The per-family tables `hf_loader` reads a config.json through: the architectures it loads,
the defaults transformers' config classes assume, the nulls that mean "none", each family's
eps key, default rotary and partial rotary, and the multimodal wrappers' text models.
"""

from __future__ import annotations

from typing import Any

from pagoda.runtime.model import bert_config as bert
from pagoda.runtime.model import deepseek_config as deepseek
from pagoda.runtime.model import dory_config as dory
from pagoda.runtime.model import gemma3n_config as gemma3n
from pagoda.runtime.model import gemma4_config as gemma4
from pagoda.runtime.model import glm4_moe_config as glm4_moe
from pagoda.runtime.model import glm5_next_config as glm5_next
from pagoda.runtime.model import inkling2_config as inkling2
from pagoda.runtime.model import inkling_config as inkling
from pagoda.runtime.model import laguna_config as laguna
from pagoda.runtime.model import lfm2_config as lfm2
from pagoda.runtime.model import llama4_config as llama4
from pagoda.runtime.model import mamba_config as hybrid
from pagoda.runtime.model import mellum_config as mellum
from pagoda.runtime.model import modernbert_config as modernbert
from pagoda.runtime.model import moe_families
from pagoda.runtime.model import qwen3_next_config as qwen3_next
from pagoda.runtime.model import zaya_config as zaya
from pagoda.runtime.pooler_config import BARE_DECODERS, DECODER_CLASSIFIERS, ENCODERS

# `architectures` in config.json -> `ModelConfig.architecture`
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Phi3ForCausalLM": "phi3",  # Phi-3, Phi-3.5-mini, phi-4, Phi-4-mini (model/phi3.py)
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its SigLIP tower too (model/gemma3_mm.py)
    # Gemma 4: per-layer inputs, KV-shared layers, head sizes by layer (model/gemma4.py); the
    # multimodal checkpoints' text model (its vision and audio towers are not read)
    **gemma4.ARCHITECTURES,
    # Gemma 3n: AltUp, Laurel, per-layer inputs, KV-shared layers (model/gemma3n.py); the
    # multimodal checkpoints' text model (its vision and audio towers are not read)
    **gemma3n.ARCHITECTURES,
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Olmo2ForCausalLM": "olmo2",
    "Olmo3ForCausalLM": "olmo3",  # OLMo 2's layer, sliding-window layers (model/olmo2.py)
    "GraniteForCausalLM": "granite",
    "GraniteMoeForCausalLM": "granitemoe",
    "GraniteMoeSharedForCausalLM": "granitemoe",  # GraniteMoe's, with a shared MLP
    "OlmoeForCausalLM": "olmoe",
    "GlmForCausalLM": "glm",  # GLM-4-9B-chat-hf (model/glm4.py)
    "Glm4ForCausalLM": "glm4",  # GLM-4-0414, GLM-Z1 (model/glm4.py)
    "SmolLM3ForCausalLM": "smollm3",  # Llama with NoPE layers (`FamilyConfig.rope_layers`)
    "CohereForCausalLM": "cohere",  # Command R / R+, Aya (model/cohere.py)
    "Cohere2ForCausalLM": "cohere2",  # Command R7B, Command A (model/cohere.py)
    **deepseek.ARCHITECTURES,  # DeepSeek-V2/V3, Kimi K2, Moonlight (model/deepseek.py)
    "DeepseekV4ForCausalLM": "deepseek_v4",  # mHC, CSA/HCA compressed attention (dsv4_engine.py)
    "GptOssForCausalLM": "gpt_oss",  # gpt-oss-20b/120b: sinks, biased experts (model/gpt_oss.py)
    # Mistral-Small-3.1/3.2, Devstral-Small, Magistral-Small: the text model (`text_config`,
    # its `model_type` naming the family: `TEXT_MODEL_TYPES`); the vision tower is not read
    "Mistral3ForConditionalGeneration": "mistral",
    "MinistralForCausalLM": "ministral",  # Ministral-8B-2410: window layers by layer_types
    "Exaone4ForCausalLM": "exaone4",  # EXAONE 4.0 (model/exaone4.py)
    "SeedOssForCausalLM": "seed_oss",  # Seed-OSS-36B: Llama's with q/k/v biases
    "Ernie4_5ForCausalLM": "ernie4_5",  # ERNIE-4.5-0.3B: interleaved rotary (ernie4_5.py)
    "BitNetForCausalLM": "bitnet",  # BitNet b1.58: ternary BitLinear, sub-norms (bitnet.py)
    "NanoChatForCausalLM": "nanochat",  # weightless norms, ReLU² MLP, soft cap (nanochat.py)
    "ArceeForCausalLM": "arcee",  # AFM-4.5B: ReLU² MLP, no gate (ungated_mlp.py)
    "Starcoder2ForCausalLM": "starcoder2",  # LayerNorm with biases, GELU MLP (starcoder2.py)
    "ApertusForCausalLM": "apertus",  # xIELU MLP, q/k norms (apertus.py)
    "Apertus1p5TextForCausalLM": "apertus1p5",  # Apertus', its LM head pruned (apertus.py)
    "Apertus1p5ForConditionalGeneration": "apertus1p5",  # its text model (tokenizers not read)
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
    "GPTNeoXJapaneseForCausalLM": "gpt_neox_japanese",  # GPT-NeoX's, sequential, no biases
    "StableLmForCausalLM": "stablelm",  # StableLM (2): LayerNorms, partial rotary (stablelm.py)
    "PersimmonForCausalLM": "persimmon",  # Persimmon: q/k LayerNorms, ReLU² MLP (model/phi.py)
    "Jais2ForCausalLM": "jais2",  # Nemotron's model without 1 + w or a partial rotary
    "VaultGemmaForCausalLM": "vaultgemma",  # Gemma 2's, two norms a layer (gemma2.py)
    "HyperCLOVAXForCausalLM": "hyperclovax",  # Granite's, peri-norms (model/granite.py)
    "DiffLlamaForCausalLM": "diffllama",  # Llama's, differential attention (diffllama.py)
    "HeliumForCausalLM": "helium",  # Helium-1: interleaved rotary (model/helium.py)
    # Emu3's text model (Llama's, its defaults); Emu3-Chat/Gen's text model (the VQ-VAE not read)
    "Emu3ForCausalLM": "emu3",
    "Emu3ForConditionalGeneration": "emu3",
    # LLaVA 1.5: a CLIP vision tower, its projector and a Llama text model (model/llava.py)
    "LlavaForConditionalGeneration": "llava",
    # Qwen2-VL, Qwen2.5-VL: their vision towers beside Qwen2's text model, M-RoPE (qwen2_vl.py)
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    # Qwen3-VL (-MoE): its tower with DeepStack beside Qwen3's (-MoE's) text model (qwen3_vl.py)
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe",
    # Idefics3, SmolVLM: a SigLIP tower over tiles, a pixel-shuffle connector, a Llama text
    # model (model/idefics3.py)
    "Idefics3ForConditionalGeneration": "idefics3",
    "SmolVLMForConditionalGeneration": "idefics3",
    # LLaVA-NeXT, LLaVA-OneVision: anyres crops through LLaVA's tower, projector and image
    # newline, beside a Llama, Mistral or Qwen2 text model (model/llava_next.py)
    "LlavaNextForConditionalGeneration": "llava_next",
    "LlavaOnevisionForConditionalGeneration": "llava_onevision",
    # InternVL 3 / 3.5 (transformers' format): InternViT tiles, a pixel shuffle, an MLP
    # projector, a Qwen2 or Qwen3 text model (model/internvl.py)
    "InternVLForConditionalGeneration": "internvl",
    "CwmForCausalLM": "cwm",  # Code World Model: Llama's, window layers (layer_types)
    "PhiForCausalLM": "phi",
    "CodeGenForCausalLM": "codegen",  # CodeGen: GPT-J's, q/v/k fused in 4 groups (phi.py)
    "GPTJForCausalLM": "gptj",  # GPT-J: Phi's model with the interleaved rotary (model/phi.py)  # phi-2: parallel layer, LayerNorm with biases, GELU MLP (phi.py)
    # learned absolute positions (model/positions.py)
    "GPT2LMHeadModel": "gpt2",  # GPT-2: Conv1D matrices, fused c_attn, tied head
    "GPTBigCodeForCausalLM": "gpt_bigcode",  # StarCoder 1, SantaCoder: multi-query
    "GPTNeoForCausalLM": "gpt_neo",  # GPT-Neo: local (windowed) and global layers, unscaled
    "OPTForCausalLM": "opt",  # OPT: positions offset by 2, pre- or post-norm, project_in/out
    "XGLMForCausalLM": "xglm",  # XGLM: sinusoidal positions (offset 2), scaled embeddings
    "OpenAIGPTLMHeadModel": "openai_gpt",  # GPT-1: GPT-2's Conv1D matrices, post-norm layers
    "BioGptForCausalLM": "biogpt",  # BioGPT: OPT's table (offset 2), scaled embeddings
    "CTRLLMHeadModel": "ctrl",  # CTRL: its sinusoidal positions, scaled embeddings, head bias
    # ALiBi (model/bloom.py)
    "BloomForCausalLM": "bloom",
    "MPTForCausalLM": "mpt",  # (mosaicml's own code's name)
    "MptForCausalLM": "mpt",  # (transformers')
    **llama4.ARCHITECTURES,  # Llama 4 Scout, Maverick: the text model (model/llama4.py)
    **hybrid.ARCHITECTURES,  # Granite 4.0, Bamba: Mamba2 and attention layers (granite_hybrid.py)
    **moe_families.ARCHITECTURES,  # ERNIE 4.5 MoE, ... (model/moe_families.py)
}
# bare decoders (no LM head): embedding checkpoints, served by the pooling runner only
# (e5-mistral's MistralModel; `pooler_config.py`)
HF_ARCHITECTURES.update({a: HF_ARCHITECTURES[c] for a, c in BARE_DECODERS.items()})
# decoders served as sequence classifiers (pooling runner only: `model/classifier_config.py`)
HF_ARCHITECTURES.update({a: HF_ARCHITECTURES[c] for a, c in DECODER_CLASSIFIERS.items()})
# encoders (bidirectional attention: BERT, RoBERTa, XLM-RoBERTa), served by the pooling runner
# only (model/bert.py)
HF_ARCHITECTURES.update(ENCODERS)
# a multimodal wrapper's text model, by its text_config's model_type (transformers' default
# first); another model_type is refused
TEXT_MODEL_TYPES = {
    "Mistral3ForConditionalGeneration": {"mistral": "mistral", "ministral": "ministral",
                                         "ministral3": "ministral3"},
    "Exaone4_5_ForConditionalGeneration": {"exaone4": "exaone4", "exaone4_5_text": "exaone4"},
    "MllamaForConditionalGeneration": {"mllama_text_model": "mllama"},  # (mllama_config.py)
    **gemma4.TEXT_MODEL_TYPES,
    **gemma3n.TEXT_MODEL_TYPES,
    **qwen3_next.TEXT_MODEL_TYPES,  # Qwen3.5's (model/qwen3_next.py)
    **glm5_next.TEXT_MODEL_TYPES,  # GLM-5-Next's (model/glm5_next.py)
    **inkling.TEXT_MODEL_TYPES,  # Inkling's text model (model/inkling.py)
    **inkling2.TEXT_MODEL_TYPES,  # Inkling 2's (model/inkling2.py)
    "Apertus1p5ForConditionalGeneration": {"apertus1p5_text": "apertus1p5"},
    # LLaVA 1.5's; LLaVA-Pixtral's Mistral (its pixtral vision_config: multimodal/pixtral_config)
    "LlavaForConditionalGeneration": {"llama": "llava", "mistral": "llava"},
    "Idefics3ForConditionalGeneration": {"llama": "idefics3"},
    "SmolVLMForConditionalGeneration": {"llama": "idefics3"},
    "Qwen2VLForConditionalGeneration": {"qwen2_vl_text": "qwen2_vl", "qwen2_vl": "qwen2_vl"},
    "LlavaNextForConditionalGeneration": {"llama": "llava_next", "mistral": "llava_next_mistral"},
    "LlavaOnevisionForConditionalGeneration": {"qwen2": "llava_onevision"},
    "InternVLForConditionalGeneration": {"qwen2": "internvl", "qwen3": "internvl_qwen3",
                                         "qwen3_moe": "internvl_qwen3_moe"},
    "Qwen2_5_VLForConditionalGeneration": {"qwen2_5_vl_text": "qwen2_5_vl",
                                           "qwen2_5_vl": "qwen2_5_vl"},
    "Qwen3VLForConditionalGeneration": {"qwen3_vl_text": "qwen3_vl", "qwen3_vl": "qwen3_vl"},
    "Qwen3VLMoeForConditionalGeneration": {"qwen3_vl_moe_text": "qwen3_vl_moe",
                                           "qwen3_vl_moe": "qwen3_vl_moe"},
    **moe_families.TEXT_MODEL_TYPES,  # Aria's, Cohere Compass'
}  # fmt: skip
# InternVL's architectures, by its text model (Qwen2's, Qwen3's, Qwen3-MoE's)
INTERNVL_ARCHS = ("internvl", "internvl_qwen3", "internvl_qwen3_moe")
# the anyres architectures -> their image inputs' kind (`multimodal/anyres_config.py`)
ANYRES_ARCHS = {"llava_next": "llava_next", "llava_next_mistral": "llava_next",
                "llava_onevision": "llava_onevision"}  # fmt: skip
# a model_type of a remote-code format published under a class name transformers' own format
# uses: other keys and tensor names, refused (not read as the family with its defaults)
REMOTE_CODE_TYPES = {
    "phi-msft": "phi-2's and phi-1.5's older remote-code format: n_embd / n_layer keys, "
                "transformer.h.N.mixer.Wqkv tensors",
}  # fmt: skip
# a wrapper's own default for tie_word_embeddings (else true, as Gemma 3's and Mistral 3's)
WRAPPER_TIES = {
    "exaone4_5": False,
    "mllama": False,
    **qwen3_next.WRAPPER_TIES,
    **glm5_next.WRAPPER_TIES,
    **inkling.WRAPPER_TIES,
    **inkling2.WRAPPER_TIES,
    "apertus1p5": False,
    **moe_families.WRAPPER_TIES,
}
WRAPPER_TIES["emu3"] = False  # (Emu3Config's)
WRAPPER_TIES["llava"] = False  # (LlavaConfig's)
WRAPPER_TIES["idefics3"] = WRAPPER_TIES["smolvlm"] = False  # (Idefics3Config's, SmolVLMConfig's)
WRAPPER_TIES["llava_next"] = False  # (LlavaNextConfig's)
WRAPPER_TIES["llava_onevision"] = False  # (LlavaOnevisionConfig's)
# What transformers assumes when config.json leaves a field out (Gemma 3's text_config is
# sparse in the published multimodal checkpoints); elsewhere 10,000 for rope_theta, 1e-6 for
# rms_norm_eps, 2048 for max_position_embeddings, no window and num_key_value_heads = heads.
DEFAULTS: dict[str, dict[str, Any]] = {
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
    "bitnet": {  # BitNetConfig's
        "vocab_size": 128_256, "hidden_size": 2560, "intermediate_size": 6912,
        "num_hidden_layers": 30, "num_attention_heads": 20, "num_key_value_heads": 5,
        "hidden_act": "relu2", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 500_000.0, "bos_token_id": 128_000, "eos_token_id": 128_001,
    },
    "ministral": {"num_key_value_heads": 8, "max_position_embeddings": 131_072,
                  "sliding_window": 4096, "rms_norm_eps": 1e-6, "bos_token_id": 1,
                  "eos_token_id": 2},
    "ministral3": {"num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 262_144, "bos_token_id": 1, "eos_token_id": 2},
    # LlamaConfig's: llava-hf's LLaVA 1.5 configs give a sparse text_config (vocab, context)
    "llava": {"vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 11_008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2},
    # LlamaConfig's, rms_norm_eps 1e-5 (Idefics3Config's and SmolVLMConfig's text_config)
    "idefics3": {"vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 11_008,
                 "num_hidden_layers": 32, "num_attention_heads": 32, "rms_norm_eps": 1e-5,
                 "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2},
    "seed_oss": {"attention_bias": True, "head_dim": 128, "rms_norm_eps": 1e-6,
                 "num_key_value_heads": 8, "max_position_embeddings": 524_288,
                 "bos_token_id": 0, "eos_token_id": 2},
    "ernie4_5": {"num_key_value_heads": 2, "head_dim": 128, "rms_norm_eps": 1e-5,
                 "rope_theta": 500_000.0,  # transformers' default_theta
                 "max_position_embeddings": 131_072, "tie_word_embeddings": True,
                 "bos_token_id": 1, "eos_token_id": 2},
    "nanochat": {"vocab_size": 50_304, "hidden_size": 768, "intermediate_size": 8192,
                 "num_hidden_layers": 12, "num_attention_heads": 6, "hidden_act": "relu2",
                 "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                 "final_logit_softcapping": 15.0, "bos_token_id": 0, "eos_token_id": 1},
    "arcee": {"hidden_act": "relu2", "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
              "bos_token_id": 128_000, "eos_token_id": 128_001},
    "starcoder2": {"hidden_act": "gelu_pytorch_tanh", "norm_epsilon": 1e-5, "use_bias": True,
                   "num_key_value_heads": 2, "max_position_embeddings": 4096,
                   "tie_word_embeddings": True, "bos_token_id": 50256, "eos_token_id": 50256},
    "apertus": {"hidden_act": "xielu", "rms_norm_eps": 1e-5, "max_position_embeddings": 65_536,
                "rope_theta": 12_000_000.0,  # transformers' default_theta
                "bos_token_id": 1, "eos_token_id": 2},
    "apertus1p5": {"hidden_act": "xielu", "rms_norm_eps": 1e-5, "max_position_embeddings": 65_536,
                   "rope_theta": 12_000_000.0, "bos_token_id": 1, "eos_token_id": 2,
                   "vocab_size": 266_752},  # (Apertus1p5TextConfig: Apertus' and its vocabulary)
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
    "gpt_neox_japanese": {"vocab_size": 32_000, "hidden_size": 2560, "num_hidden_layers": 32,
                          "num_attention_heads": 32, "hidden_act": "gelu", "layer_norm_eps": 1e-5,
                          "partial_rotary_factor": 1.0, "max_position_embeddings": 2048,
                          "tie_word_embeddings": True, "bos_token_id": 31_996,
                          "eos_token_id": 31_999},
    "stablelm": {"vocab_size": 50_304, "intermediate_size": 6912, "hidden_size": 2560,
                 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                 "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25,
                 "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 0},
    "persimmon": {"vocab_size": 262_144, "hidden_size": 4096, "intermediate_size": 16_384,
                  "num_hidden_layers": 36, "num_attention_heads": 64, "hidden_act": "relu2",
                  "max_position_embeddings": 16_384, "layer_norm_eps": 1e-5,
                  "partial_rotary_factor": 0.5, "qk_layernorm": True, "attention_bias": True,
                  "bos_token_id": 1, "eos_token_id": 2},
    "jais2": {"vocab_size": 150_272, "hidden_size": 3328, "intermediate_size": 26_624,
              "num_attention_heads": 26, "hidden_act": "relu2", "max_position_embeddings": 8192,
              "layer_norm_eps": 1e-5, "attention_bias": True, "mlp_bias": True,
              "bos_token_id": 0, "eos_token_id": 150_024},
    "hyperclovax": {"bos_token_id": 1, "eos_token_id": 2},
    "codegen": {"vocab_size": 50_400, "max_position_embeddings": 2048, "hidden_size": 4096,
                "num_hidden_layers": 28, "num_attention_heads": 16, "rotary_dim": 64,
                "hidden_act": "gelu_new", "layer_norm_epsilon": 1e-5, "bos_token_id": 50_256,
                "eos_token_id": 50_256},
    "gptj": {"vocab_size": 50_400, "max_position_embeddings": 2048, "hidden_size": 4096,
             "num_hidden_layers": 28, "num_attention_heads": 16, "rotary_dim": 64,
             "hidden_act": "gelu_new", "layer_norm_epsilon": 1e-5, "bos_token_id": 50_256,
             "eos_token_id": 50_256},
    "emu3": {"vocab_size": 184_622, "hidden_size": 4096, "intermediate_size": 14_336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 9216, "rms_norm_eps": 1e-5,
             "rope_theta": 1_000_000.0,  # transformers' default_theta
             "pad_token_id": 151_643, "bos_token_id": 151_849, "eos_token_id": 151_850},
    "cwm": {"vocab_size": 128_256, "hidden_size": 6144, "intermediate_size": 21_504,
            "num_hidden_layers": 64, "num_attention_heads": 48, "num_key_value_heads": 8,
            "head_dim": 128, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5,
            "sliding_window": 8192, "bos_token_id": 128_000,
            "eos_token_id": [128_001, 128_008, 128_009]},
    "diffllama": {"vocab_size": 32_000, "hidden_size": 2048, "intermediate_size": 8192,
                  "num_hidden_layers": 16, "num_attention_heads": 32, "rms_norm_eps": 1e-5,
                  "bos_token_id": 1, "eos_token_id": 2},
    "helium": {"vocab_size": 48_000, "hidden_size": 2560, "intermediate_size": 7040,
               "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 20,
               "head_dim": 128, "rms_norm_eps": 1e-8, "max_position_embeddings": 4096,
               "rope_theta": 100_000.0,  # transformers' default_theta
               "bos_token_id": 1, "eos_token_id": 2},
    "phi": {"vocab_size": 51_200, "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 24, "num_attention_heads": 32, "hidden_act": "gelu_new",
            "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.5, "attention_bias": True,
            "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2},
    "gpt2": {"vocab_size": 50_257, "max_position_embeddings": 1024, "hidden_size": 768,
             "num_hidden_layers": 12, "num_attention_heads": 12, "hidden_act": "gelu_new",
             "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "bos_token_id": 50_256,
             "eos_token_id": 50_256},
    "gpt_neo": {"vocab_size": 50_257, "max_position_embeddings": 2048, "hidden_size": 2048,
                "num_hidden_layers": 24, "num_attention_heads": 16, "sliding_window": 256,
                "hidden_act": "gelu_new", "layer_norm_epsilon": 1e-5,
                "attention_types": [[["global", "local"], 12]], "tie_word_embeddings": True,
                "bos_token_id": 50_256, "eos_token_id": 50_256},
    "gpt_bigcode": {"vocab_size": 50_257, "max_position_embeddings": 1024, "hidden_size": 768,
                    "num_hidden_layers": 12, "num_attention_heads": 12,
                    "hidden_act": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-5,
                    "multi_query": True, "tie_word_embeddings": True, "bos_token_id": 50_256,
                    "eos_token_id": 50_256},
    "opt": {"vocab_size": 50_272, "hidden_size": 768, "num_hidden_layers": 12,
            "intermediate_size": 3072, "max_position_embeddings": 2048,
            "num_attention_heads": 12, "hidden_act": "relu", "tie_word_embeddings": True,
            "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2,
            "_layer_norm_eps": 1e-5},  # (nn.LayerNorm's: OPTConfig has no eps)
    "xglm": {"vocab_size": 256_008, "max_position_embeddings": 2048, "hidden_size": 1024,
             "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
             "hidden_act": "gelu", "scale_embedding": True, "tie_word_embeddings": True,
             "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
             "_layer_norm_eps": 1e-5},  # (nn.LayerNorm's: XGLMConfig has no eps)
    "openai_gpt": {"vocab_size": 40_478, "max_position_embeddings": 512, "hidden_size": 768,
                   "num_hidden_layers": 12, "num_attention_heads": 12, "afn": "gelu",
                   "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True},
    "biogpt": {"vocab_size": 42_384, "max_position_embeddings": 1024, "hidden_size": 1024,
               "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
               "hidden_act": "gelu", "scale_embedding": True, "tie_word_embeddings": True,
               "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
               "_layer_norm_eps": 1e-5},  # (nn.LayerNorm's: its layer_norm_eps is not read)
    "ctrl": {"vocab_size": 246_534, "max_position_embeddings": 256, "hidden_size": 1280,
             "intermediate_size": 8192, "num_hidden_layers": 48, "num_attention_heads": 16,
             "hidden_act": "relu", "layer_norm_epsilon": 1e-6, "tie_word_embeddings": True},
    "bloom": {"vocab_size": 250_880, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 8, "layer_norm_epsilon": 1e-5,
              "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 2048,
              "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2},
    "mpt": {"vocab_size": 50_368, "hidden_size": 2048, "num_hidden_layers": 24,
            "num_attention_heads": 16, "expansion_ratio": 4, "max_position_embeddings": 2048,
            "layer_norm_epsilon": 1e-5, "hidden_act": "gelu", "tie_word_embeddings": True},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2, "num_key_value_heads": 8,
                "max_position_embeddings": 131_072, "rope_theta": 1_000_000.0,
                "rms_norm_eps": 1e-5},
    "qwen2": {"max_position_embeddings": 32_768},
    "qwen3": {"max_position_embeddings": 32_768, "head_dim": 128},
    "internvl": {"max_position_embeddings": 32_768},  # (InternVL's text models: Qwen2's and
    "internvl_qwen3": {"max_position_embeddings": 32_768, "head_dim": 128},  # Qwen3's)
    "qwen3_vl": {"max_position_embeddings": 128_000, "head_dim": 128,  # (Qwen3VLTextConfig's)
                 "rope_theta": 500_000.0},
    "qwen3_vl_moe": {"max_position_embeddings": 128_000, "num_local_experts": 60,  # (its text
                     "rope_theta": 500_000.0,  # config's; the hub's configs say num_experts)
                     "num_experts_per_tok": 4, "moe_intermediate_size": 1408},
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
    "gpt_oss": {  # GptOssConfig's (and its yarn rotary, `GPT_OSS_ROPE`)
        "vocab_size": 201_088, "hidden_size": 2880, "intermediate_size": 2880,
        "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4,
        "sliding_window": 128, "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5,
        "rope_theta": 150_000.0, "attention_bias": True, "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
    },
    **deepseek.DEFAULTS,
    # DeepSeek-V4's sizes (DeepseekV4Config's; the rest: dsv4_config.read)
    "deepseek_v4": {"vocab_size": 129_280, "hidden_size": 4096, "num_hidden_layers": 43,
                    "num_attention_heads": 64},
    **glm4_moe.DEFAULTS,
    **llama4.DEFAULTS,
    **hybrid.DEFAULTS,
    **moe_families.DEFAULTS,
    **bert.DEFAULTS,  # BertConfig's, RobertaConfig's
    **modernbert.DEFAULTS,  # ModernBertConfig's
    **gemma4.DEFAULTS,
    **gemma3n.DEFAULTS,
}  # fmt: skip
DEFAULTS["vaultgemma"] = DEFAULTS["gemma2"]  # (VaultGemmaConfig is Gemma2Config's)
DEFAULTS["internvl_qwen3_moe"] = DEFAULTS["qwen3moe"]  # (InternVL3.5-MoE's text model)
# LLaVA-NeXT's text models: LlamaConfig's (as LLaVA 1.5's), MistralConfig's; OneVision's Qwen2's
DEFAULTS["llava_next"] = DEFAULTS["llava"]
DEFAULTS["llava_next_mistral"] = {
    "vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 14_336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "sliding_window": 4096,
    "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
DEFAULTS["llava_onevision"] = {
    "vocab_size": 151_936, "hidden_size": 4096, "intermediate_size": 22_016,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "max_position_embeddings": 32_768, "rms_norm_eps": 1e-6,
}  # fmt: skip
# GptOssConfig's rotary where config.json names none (neither rope_scaling nor rope_parameters)
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip
# a null that means "none" rather than "the default" (Mistral's window: v0.2 on say null)
NULLABLE = {
    "mistral": ("sliding_window",),
    "llava_next_mistral": ("sliding_window",),
    "exaone4": ("sliding_window",),
    "ministral": ("sliding_window",),
    "cwm": ("sliding_window",),
    "ministral3": ("sliding_window",),
    "cohere2": ("sliding_window",),
    "olmo3": ("sliding_window",),
    "nanochat": ("final_logit_softcapping",),  # null: no cap
    **dict.fromkeys(
        ("gemma2", "vaultgemma"),
        ("sliding_window", "final_logit_softcapping", "attn_logit_softcapping"),
    ),
    **{arch: deepseek.NULLABLE for arch in deepseek.DEFAULTS},
    "llama4": llama4.NULLABLE,
    "minicpm3": ("q_lora_rank", "v_head_dim", "scale_depth", "dim_model_base"),  # null: derived
    **moe_families.NULLABLE,
    "gemma4": ("hidden_size_per_layer_input",),  # null: no per-layer inputs
    "gemma3n": ("final_logit_softcapping",),  # null: no cap
    **zaya.NULLABLE,
    "glm5_next": glm5_next.NULLABLE,
    **inkling.NULLABLE,
}
EPS = {"cohere": "layer_norm_eps", "cohere2": "layer_norm_eps"}  # the norms' eps, by family
EPS.update(starcoder2="norm_epsilon", nemotron="norm_eps", phi="layer_norm_eps")
EPS.update(falcon="layer_norm_epsilon", gpt_neox="layer_norm_eps", stablelm="layer_norm_eps")
EPS.update(codegen="layer_norm_epsilon", persimmon="layer_norm_eps")
EPS.update(jais2="layer_norm_eps", gptj="layer_norm_epsilon", gpt2="layer_norm_epsilon")
EPS.update(gpt_bigcode="layer_norm_epsilon", opt="_layer_norm_eps", bloom="layer_norm_epsilon")
EPS.update(mpt="layer_norm_epsilon", gpt_neo="layer_norm_epsilon", **moe_families.EPS)
EPS.update(xglm="_layer_norm_eps", openai_gpt="layer_norm_epsilon", biogpt="_layer_norm_eps")
EPS.update(ctrl="layer_norm_epsilon", gpt_neox_japanese="layer_norm_eps")
EPS.update(bert="layer_norm_eps", roberta="layer_norm_eps", modernbert="norm_eps")
# the rotary transformers' config class fills in when config.json has neither rope_parameters
# nor rope_scaling
DEFAULT_ROPE = {
    "gemma4": gemma4.DEFAULT_ROPE,  # by layer kind
    "gemma4_unified": gemma4.DEFAULT_ROPE,
    "laguna": laguna.DEFAULT_ROPE,  # by layer kind
    "zaya": zaya.DEFAULT_ROPE,  # by layer kind
    "lfm3": lfm2.DEFAULT_ROPE,  # by layer kind
    "mellum": mellum.DEFAULT_ROPE,  # by layer kind
    "dory": dory.DEFAULT_ROPE,  # by layer kind
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
DEFAULT_ROPE["apertus1p5"] = DEFAULT_ROPE["apertus"]  # (Apertus1p5TextConfig is ApertusConfig's)
# the families whose transformers models read partial_rotary_factor
PARTIAL_ROTARY = ("phi3", "glm", "glm4", "glm4_moe", "bamba", "nemotron", "phi", "gpt_neox",
                   "stablelm", "gptj", "codegen", "persimmon", *moe_families.PARTIAL_ROTARY,
                   *(a for a in qwen3_next.DEFAULTS if a != "lara_mini"), "zaya",
                   "recurrent_gemma", "gpt_neox_japanese")  # fmt: skip
# the families whose full-attention layers' "proportional" rotary is read here and tested
# (transformers' other models would run it too; untested: refused, one line)
PROPORTIONAL_ROTARY = ("lfm3",)
# the layer kind whose `rope_parameters` (keyed by kind) the model's rotary is read from: the
# full-attention layers' (Gemma 3's, ...), the sliding layers' (Gemma 4's and 3n's: their full
# layers' in gemma4_config), Zaya's "hybrid" layers' (`zaya_config`)
ROPE_KIND = {**dict.fromkeys(("gemma3", "olmo3", "laguna", "lfm3", "mellum", "dory", "cohere_compass",
                              "modernbert"),
                             "full_attention"),
             **dict.fromkeys(("gemma4", "gemma4_unified", "gemma3n"), "sliding_attention"),
             "zaya": "hybrid"}  # fmt: skip
FUSED = ("phi3", "glm", "glm4")  # fused qkv_proj / gate_up_proj, listed as Llama's (phi3.py)

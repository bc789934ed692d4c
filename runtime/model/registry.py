"""The architectures the engine runs, by `ModelConfig.architecture`, and the model class of each.

The loaders name the architecture from the checkpoint (`hf_tables.HF_ARCHITECTURES`,
`gguf_loader.SUPPORTED_ARCHS`); `build_model` picks the class that computes it. The options a
family is not tested with (tensor parallelism, FP8, float16) are its row in
`family_options.UNTESTED`, checked against this registry when it is imported.
"""

from __future__ import annotations

import importlib

from pagoda.runtime import family_options
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model import moe_families
from pagoda.runtime.model.llama import LlamaModel

# architecture -> (module in pagoda.runtime.model, class)
MODEL_CLASSES = {
    "llama": ("llama", "LlamaModel"),
    "mistral": ("llama", "LlamaModel"),
    "phi3": ("llama", "LlamaModel"),  # Llama's decoder over split fused weights (phi3.py)
    "qwen2": ("llama", "LlamaModel"),
    "qwen3": ("qwen3", "Qwen3Model"),
    "gemma2": ("gemma2", "Gemma2Model"),
    "gemma3": ("gemma3", "Gemma3Model"),
    "gemma4": ("gemma4", "Gemma4Model"),  # per-layer inputs, KV-shared layers, MoE block
    "gemma4_unified": ("gemma4", "Gemma4Model"),  # Gemma 4's without PLE or MoE (gemma4_config)
    "gemma3n": ("gemma3n", "Gemma3nModel"),  # Gemma 4's layers with AltUp, Laurel, sparsity
    "mixtral": ("moe", "MixtralModel"),
    "qwen3moe": ("moe", "Qwen3MoeModel"),
    "qwen2moe": ("moe", "Qwen2MoeModel"),
    "olmo2": ("olmo2", "Olmo2Model"),
    "olmo3": ("olmo2", "Olmo2Model"),  # OLMo 2's, with window layers (their own rotary table)
    "granite": ("granite", "GraniteModel"),
    "granitemoe": ("granite", "GraniteMoeModel"),
    "hyperclovax": ("granite", "HyperClovaxModel"),  # Granite's, GLM-4's post-sublayer norms
    "olmoe": ("olmo2", "OlmoeModel"),
    "smollm3": ("llama", "LlamaModel"),
    "glm": ("llama", "LlamaModel"),  # Llama's over a split gate_up_proj, interleaved rotary
    "glm4": ("glm4", "Glm4Model"),
    "cohere": ("cohere", "CohereModel"),
    "cohere2": ("cohere", "CohereModel"),  # Llama's, some layers without rotary (rope_layers)
    "deepseek_v2": ("deepseek", "DeepseekModel"),
    "deepseek_v3": ("deepseek", "DeepseekModel"),
    "youtu": ("deepseek", "DeepseekModel"),  # V3's latent attention, a dense MLP
    "glm4_moe_lite": ("deepseek", "DeepseekModel"),  # GLM-4.7-Flash: DeepSeek-V3's layers
    "axk1": ("axk1", "AXK1Model"),  # A.X-K1: V3's, a norm on the experts' output
    "deepseek_v32": ("dsa", "DsaModel"),  # DeepSeek Sparse Attention's lightning indexer
    "glm_moe_dsa": ("dsa", "DsaModel"),  # GLM-5: V3.2's, the indexer's choice shared
    "axk2": ("axk2", "Axk2Model"),  # A.X-K2: V3.2's, gated norms, attention's output gate
    "hy_v4": ("hy_v4", "HyV4Model"),  # GLM-5's with hyper-connections, gated sink attention
    "dots3_note_text": ("dsa", "DsaModel"),  # V3.2's, GLM-5's indexer, Dots3's attention
    "deepseek_v4": ("dsv4_engine", "Dsv4EngineModel"),  # mHC, CSA/HCA compressed attention
    "gpt_oss": ("gpt_oss", "GptOssModel"),
    "ministral": ("llama", "LlamaModel"),  # Mistral's, window layers by layer_types
    "ministral3": ("ministral3", "Ministral3Model"),  # q scaled by position
    "exaone4": ("exaone4", "Exaone4Model"),  # OLMo 2's norms after, per-head q/k norms
    "seed_oss": ("llama", "LlamaModel"),  # Llama's, q/k/v (and o) biases
    "ernie4_5": ("ernie4_5", "Ernie4_5Model"),  # interleaved rotary in float32
    "arcee": ("ungated_mlp", "ArceeModel"),  # ReLU² MLP, no gate
    "bitnet": ("bitnet", "BitNetModel"),  # ternary BitLinear projections, sub-norms
    "nanochat": ("nanochat", "NanoChatModel"),  # weightless norms, ReLU² MLP, soft cap
    "starcoder2": ("starcoder2", "Starcoder2Model"),  # LayerNorm with biases, GELU MLP
    "apertus": ("apertus", "ApertusModel"),  # xIELU MLP, q/k norms
    "apertus1p5": ("apertus", "Apertus1p5Model"),  # Apertus', its LM head pruned
    "glm4_moe": ("glm4_moe", "Glm4MoeModel"),  # GLM-4.5 / 4.6
    "llama4": ("llama4", "Llama4Model"),  # the text model of Scout / Maverick
    "llama4_vision": ("llama4_vision", "Llama4VisionModel"),  # Llama 4 reading images
    "exaone": ("llama", "LlamaModel"),  # EXAONE 3 / 3.5: Llama's under GPT-style names
    "nemotron": ("nemotron", "NemotronModel"),  # LayerNorm1P, ReLU² MLP
    "jais2": ("nemotron", "Jais2Model"),  # LayerNorm with biases, ReLU² MLP
    "internlm3": ("llama", "LlamaModel"),  # Llama's
    "gemma": ("gemma2", "GemmaModel"),  # Gemma 2's norms, two a layer
    "vaultgemma": ("gemma2", "VaultGemmaModel"),  # Gemma 2's, two norms a layer
    "olmo": ("olmo", "OlmoModel"),  # OLMo v1: parameter-free LayerNorm, clip_qkv
    "minicpm3": ("minicpm3", "MiniCPM3Model"),  # DeepSeek's latent attention, muP scales
    "falcon": ("falcon", "FalconModel"),  # parallel layer, fused q/k/v, GELU MLP
    "gpt_neox": ("falcon", "FalconModel"),  # Falcon's, q/k/v per head, a partial rotary
    "gpt_neox_japanese": ("falcon", "FalconModel"),  # GPT-NeoX's, Llama's layer, no biases
    "stablelm": ("stablelm", "StableLmModel"),  # LayerNorm with biases, partial rotary
    "persimmon": ("phi", "PersimmonModel"),  # GPT-NeoX's q/k/v, Phi's q/k norms, ReLU² MLP
    "diffllama": ("diffllama", "DiffLlamaModel"),  # Llama's, differential attention
    "helium": ("helium", "HeliumModel"),  # interleaved rotary, float32-scaled RMSNorm
    "emu3": ("llama", "LlamaModel"),  # Emu3's text model: Llama's
    "qwen2_vl": ("qwen2_vl", "Qwen2VLModel"),  # Qwen2-VL: its tower, Qwen2's text model, M-RoPE
    "qwen2_5_vl": ("qwen2_vl", "Qwen2VLModel"),  # Qwen2.5-VL: its windowed tower, the same
    "qwen3_vl": ("qwen3_vl", "Qwen3VLModel"),  # Qwen3-VL: its tower, DeepStack, Qwen3's text
    "qwen3_vl_moe": ("qwen3_vl", "Qwen3VLMoeModel"),  # Qwen3-VL-MoE: Qwen3-MoE's experts
    "llava": ("llava", "LlavaModel"),  # LLaVA 1.5: CLIP tower + projector, Llama's text model
    "idefics3": ("idefics3", "Idefics3Model"),  # Idefics3, SmolVLM: SigLIP tiles, Llama's text
    # LLaVA-NeXT (a Llama or Mistral text model), OneVision (SigLIP, Qwen2): anyres crops
    "llava_next": ("llava_next", "LlavaNextModel"),
    "llava_next_mistral": ("llava_next", "LlavaNextModel"),
    "llava_onevision": ("llava_next", "LlavaNextModel"),
    "mistral3": ("pixtral", "PixtralModel"),  # Mistral 3 with its images: Pixtral's tower, merger
    # InternVL 3 / 3.5: InternViT tiles, pixel shuffle, MLP projector; Qwen2's or Qwen3's text
    "internvl": ("internvl", "InternVLModel"),
    "internvl_qwen3": ("internvl", "InternVLQwen3Model"),
    "internvl_qwen3_moe": ("internvl", "InternVLQwen3MoeModel"),  # (Qwen3-MoE's experts)
    "cwm": ("llama", "LlamaModel"),  # Llama's, window layers by layer_types
    "phi": ("phi", "PhiModel"),  # phi-2: parallel layer, LayerNorm with biases, GELU MLP
    "gptj": ("phi", "PhiModel"),  # Phi's, the rotary interleaved
    "codegen": ("phi", "PhiModel"),  # GPT-J's, its fused q/v/k split at load (phi.py)
    "granitemoehybrid": ("granite_hybrid", "HybridModel"),  # Granite 4.0: Mamba2 + attention
    "bamba": ("granite_hybrid", "HybridModel"),  # Mamba2 + attention, a dense MLP
    "nemotron_h": ("nemotron_h", "NemotronHModel"),  # Mamba2, attention or MLP blocks
    "falcon_h1": ("falcon_h1", "FalconH1Model"),  # attention and Mamba2 side by side
    "mamba2": ("nemotron_h", "Mamba2Model"),  # Mamba2 blocks alone (no attention, no MLP)
    "mamba": ("mamba1", "MambaModel"),  # Mamba-1 blocks alone (selective scan)
    "falcon_mamba": ("mamba1", "MambaModel"),  # Mamba-1's, norms on B, C and dt
    "jamba": ("jamba", "JambaModel"),  # Mamba-1 and attention layers, experts every other
    "zamba2": ("zamba2", "Zamba2Model"),  # Mamba2 layers, shared blocks with LoRA adapters
    "zamba": ("zamba", "ZambaModel"),  # Mamba-1 layers in heads, one shared block
    "recurrent_gemma": ("recurrent_gemma", "RecurrentGemmaModel"),  # RG-LRU + local attention
    "rwkv": ("rwkv", "RwkvModel"),  # RWKV-4: time-mix (wkv) and channel-mix, no attention
    "xlstm": ("xlstm", "XlstmModel"),  # mLSTM layers (matrix memory), SwiGLU, no attention
    "lfm2": ("lfm2", "Lfm2Model"),  # gated short convs among Qwen3-style attention layers
    "lfm2_moe": ("lfm2", "Lfm2MoeModel"),  # LFM2's, sigmoid-routed experts after dense layers
    "zaya": ("zaya", "ZayaModel"),  # q/k/v from a conv state, a router MLP over top-1 experts
    "inkling": ("inkling", "InklingModel"),  # short convs, relative logits, shared experts
    "inkling2": ("inkling2", "Inkling2Model"),  # Inkling's, block attention residuals, sinks
    "lfm3": ("lfm2", "Lfm3Model"),  # LFM2's, sliding layers, head gates, sandwich norms
    "qwen3_next": ("qwen3_next", "Qwen3NextModel"),  # Gated DeltaNet + gated attention, experts
    "qwen3_5": ("qwen3_next", "Qwen3NextModel"),  # Qwen3-Next's layers, a dense MLP
    "qwen3_5_moe": ("qwen3_next", "Qwen3NextModel"),  # Qwen3-Next's, experts in every layer
    "lara_mini": ("lara_mini", "LaraMiniModel"),  # Qwen3.5's DeltaNet, Qwen3 attention, experts
    "qwen4_exp": ("qwen4_exp", "Qwen4ExpModel"),  # Qwen3.5-MoE's, hyper-connections, n-grams
    "olmo_hybrid": ("olmo_hybrid", "OlmoHybridModel"),  # Gated DeltaNet + OLMo 3's attention
    "kimi_linear": ("kimi_linear", "KimiLinearModel"),  # KDA + NoPE latent attention, V3 experts
    "bailing_hybrid": ("bailing_hybrid", "BailingHybridModel"),  # KDA + gated MLA, V3 experts
    "glm5_next": ("glm5_next", "Glm5NextModel"),  # KDA + NoPE DSA latent attention, mHC, V3 experts
    "minimax": ("minimax", "MiniMaxModel"),  # lightning + softmax attention, Mixtral's experts
    "gpt2": ("positions", "LearnedPositionsModel"),  # learned positions, Conv1D matrices
    "gpt_bigcode": ("positions", "LearnedPositionsModel"),  # GPT-2's, multi-query
    "gpt_neo": ("positions", "LearnedPositionsModel"),  # local (windowed) layers, unscaled
    "opt": ("positions", "LearnedPositionsModel"),  # offset 2, pre/post-norm, projections
    "xglm": ("positions", "XglmModel"),  # sinusoidal positions, scaled embeddings (OPT's)
    "openai_gpt": ("positions", "LearnedPositionsModel"),  # GPT-2's matrices, post-norm (OPT's)
    "biogpt": ("positions", "ScaledPositionsModel"),  # OPT's table, scaled embeddings
    "ctrl": ("positions", "CtrlModel"),  # its sinusoidal table, scaled embeddings, head bias
    "bloom": ("bloom", "BloomModel"),  # ALiBi, the embeddings' LayerNorm
    "mpt": ("bloom", "MptModel"),  # ALiBi, LayerNorms without biases, clip_qkv
    "bert": ("bert", "BertModel"),  # an encoder: bidirectional attention, post-norm layers
    "roberta": ("bert", "BertModel"),  # BERT's, its position table offset (XLM-RoBERTa's too)
    "modernbert": ("modernbert", "ModernBertModel"),  # an encoder: local and global layers
    **moe_families.MODEL_CLASSES,  # ERNIE 4.5 MoE, ...
}
# what each family is not tested with (tensor parallelism, FP8, ...): one row per family there
family_options.check_registered(MODEL_CLASSES)


def model_class(config: ModelConfig) -> type[LlamaModel]:
    if config.architecture not in MODEL_CLASSES:
        raise ValueError(
            f"no model for architecture {config.architecture!r}; "
            f"supported: {', '.join(MODEL_CLASSES)}"
        )
    module, name = MODEL_CLASSES[config.architecture]
    if config.architecture == "gemma3" and config.vision is not None:  # its images read too
        module, name = "gemma3_mm", "Gemma3VisionModel"
    if getattr(config.vision, "kind", None) == "pixtral":  # LLaVA-Pixtral's (and Mistral 3's)
        module, name = "pixtral", "PixtralModel"
    return getattr(importlib.import_module(f"pagoda.runtime.model.{module}"), name)


def build_model(config: ModelConfig, weights, **kwargs) -> LlamaModel:
    """The model of `config.architecture` over `weights` (`LlamaModel`'s keyword arguments)."""
    return model_class(config)(config, weights, **kwargs)

"""GGUF → (ModelConfig, HF-named float tensors, Tokenizer) through the `gguf` package.

Architectures as llama.cpp names them: llama (Mixtral too, with experts), mistral, qwen2, qwen3,
qwen3moe, gemma3, gemma2, qwen2moe (its shared expert `ffn_*_shexp`, gated by
`ffn_gate_inp_shexp`), granite (`embedding_scale`, `residual_scale`, `attention.scale`,
`logit_scale`), granitemoe (its `input_linear` split as gate and up), olmo2 (norms after the sublayers, q/k norms over every head; with
`attention.sliding_window`, OLMo 3's window layers), olmoe, smollm3 (llama with every fourth
layer NoPE, as llama.cpp hard-codes it), deepseek2 (`gguf_deepseek.py`), glm4, command-r and cohere2
(`gguf_glm_cohere.py`), gpt-oss, phi3, exaone4, seed_oss, ernie4_5, starcoder2, arcee, apertus,
mistral3, glm4moe, llama4 (`gguf_archs.py`: their names, fused rows and fields), granitehybrid,
nemotron_h, nemotron_h_moe and falcon-h1 (`gguf_mamba.py`: the hybrids' Mamba2 mixers); gemma,
phi2, stablelm, gpt2, starcoder, gptneox, falcon, bloom, mpt, jamba and minimax-m2 (`gguf_classic.py`,
`gguf_jamba.py`, `gguf_minimax_m2.py`: read as their checkpoints' config.json, fused q/k/v as
row parts), gemma4 (`gguf_gemma4.py`, read
the same way; its `gemma4` BPE vocabulary with the file's merges). Quantized tensors (Q4_0,
Q4_1, Q8_0, the K kinds, MXFP4, ...) are dequantized in torch (`gguf_dequant`) when the model
builder reads them (`GGUFWeights`), one at a time from the memory-mapped file. llama.cpp stores the Q and K projections of Llama models permuted for its
interleaved rotary; we undo that (in torch) so one rotate-half rotary (Hugging Face layout)
serves every loader. Mixture-of-experts tensors (`ffn_*_exps`, [E, N, K]) keep their stacked
shape under `...experts.{gate,up,down}.weight` names (`moe.py` slices them, blocks included). Gemma's norms are stored as 1 + w
(`FamilyConfig.norms_hold_one_plus_w`). The metadata is parsed by `gguf_reader`, once per file
in a process (the start-up checks' reader is the load's); the config is read from it by
`gguf_config` (`read_config`, re-exported here).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.cpu.quantized import QuantizedWeight, from_gguf, readable
from pagoda.runtime.model import (
    gguf_archs,
    gguf_classic,
    gguf_deepseek,
    gguf_gemma4,
    gguf_glm_cohere,
    gguf_kimi,
    gguf_mamba,
    gguf_qwen3next,
)
from pagoda.runtime.model.gguf_config import SUPPORTED_ARCHS, read_config  # noqa: F401 - its API
from pagoda.runtime.model.gguf_dequant import dequantize
from pagoda.runtime.model.gguf_reader import field as _field
from pagoda.runtime.model.gguf_reader import parse as _reader  # noqa: F401 - one of its own
from pagoda.runtime.model.gguf_reader import take_reader
from pagoda.runtime.model.gguf_reader import tensor_shape as _shape
from pagoda.runtime.model.tokenizer import (
    Tokenizer,
    build_bpe_tokenizer,
    build_gemma_tokenizer,
    build_spm_tokenizer,
)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA3_NAMES = {  # Gemma 2's and 3's four norms a layer; the rest as above
    **_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_OLMO2_NAMES = {  # OLMo 2's norms after attention and the MLP (none before); q/k norms whole
    **_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_MOE_NAMES = {  # llama.cpp's expert tensors -> (router | stacked experts) under the MoE block
    "ffn_gate_inp": "gate",
    "ffn_gate_exps": "experts.{gate}",
    "ffn_up_exps": "experts.{up}",
    "ffn_down_exps": "experts.{down}",
    # Qwen2-MoE's shared expert and its sigmoid gate ([1, hidden] as the converter writes it)
    "ffn_gate_inp_shexp": "shared_expert_gate",
    "ffn_gate_shexp": "shared_expert.gate_proj",
    "ffn_up_shexp": "shared_expert.up_proj",
    "ffn_down_shexp": "shared_expert.down_proj",
}
_MOE_BLOCKS = {  # architecture -> (block prefix, expert weight names) as the models read them
    "mixtral": ("block_sparse_moe.", {"gate": "w1", "up": "w3", "down": "w2"}),
    "qwen3moe": ("mlp.", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}),
    "qwen2moe": ("mlp.", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}),
    "olmoe": ("mlp.", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}),
    "qwen3_next": ("mlp.", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}),
    "qwen3_5_moe": ("mlp.", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}),
    # the converter splits GraniteMoe's input_linear into gate and up: Mixtral's three stacks
    "granitemoe": ("block_sparse_moe.", {"gate": "w1", "up": "w3", "down": "w2"}),
}
_MOE_ROUTERS = {"granitemoe": "router.layer"}  # ffn_gate_inp where the model's is not `gate`
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output_norm.bias": "model.norm.bias",  # StarCoder2's LayerNorm
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's convert-time permute (rows interleaved per head for rotary), on
    whatever device and dtype `w` is (rows of values or of raw blocks)."""
    rows = w.shape[0]
    split = w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
    return split.transpose(1, 2).reshape(w.shape)


def _hf_name(name: str, architecture: str = "llama") -> str | None:
    if architecture in gguf_gemma4.ARCHS:  # (its names whole: `gguf_gemma4`)
        return gguf_gemma4.hf_name(name)
    if architecture in gguf_classic.ARCHS and gguf_classic.global_name(name, architecture):
        return gguf_classic.global_name(name, architecture)
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _BLOCK.match(name)
    if not m:  # (a Mamba2 mixer's A and D: `blk.N.ssm_a`)
        return (gguf_qwen3next.bare_name(name, architecture)
                or gguf_kimi.bare_name(name, architecture)
                or gguf_mamba.suffixless_name(name, architecture))  # fmt: skip
    layer, part, kind = m.groups()
    if architecture in gguf_deepseek.ARCHITECTURES:  # deepseek2 (gguf_deepseek.py)
        return gguf_deepseek.hf_name(layer, part, kind)
    names = _GEMMA3_NAMES if architecture in ("gemma2", "gemma3") else _LAYER_NAMES
    names = _OLMO2_NAMES if architecture == "olmo2" else names
    names = {**names, **gguf_glm_cohere.GLM4_NAMES} if architecture == "glm4" else names
    if architecture in gguf_classic.ARCHS:  # GPT-2, Falcon, ... (gguf_classic.py)
        own = gguf_classic.hf_name(layer, part, kind, architecture)
        if own is not None:
            return own
    if architecture in gguf_archs.NAMES:  # gpt-oss, Seed-OSS, EXAONE 4, ... (gguf_archs.py)
        own = gguf_archs.hf_name(layer, part, kind, architecture)
        if own is not None:
            return own
    if part in names:
        return f"model.layers.{layer}.{names[part]}.{kind}"
    if part in _MOE_NAMES and architecture in _MOE_BLOCKS:
        block, experts = _MOE_BLOCKS[architecture]
        if part == "ffn_gate_inp" and architecture in _MOE_ROUTERS:
            return f"model.layers.{layer}.{block}{_MOE_ROUTERS[architecture]}.{kind}"
        return f"model.layers.{layer}.{block}{_MOE_NAMES[part].format(**experts)}.{kind}"
    return None


def read_tokenizer(reader, config: ModelConfig) -> Tokenizer:
    model = _field(reader, "tokenizer.ggml.model")
    tokens, types = (
        _field(reader, "tokenizer.ggml.tokens"),
        _field(reader, "tokenizer.ggml.token_type"),
    )
    if model == "llama" and config.architecture in ("gemma", "gemma2", "gemma3"):  # Gemma's SPM
        hf_tok = build_gemma_tokenizer(tokens, types)
    elif model == "llama":  # SentencePiece: Llama's (Phi-3's prefix before every text)
        scores = _field(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
        hf_tok = build_spm_tokenizer(
            tokens, scores, types, bool(_field(reader, "tokenizer.ggml.add_space_prefix", True)),
            prefix_every_text=config.architecture == "phi3",
        )  # fmt: skip
    elif model == "gemma4":  # Gemma 4's BPE over raw UTF-8 (llama.cpp's pre "gemma4")
        merges = _field(reader, "tokenizer.ggml.merges", [])
        hf_tok = build_gemma_tokenizer(tokens, types, merges=merges)
    elif model == "gpt2":
        merges = _field(reader, "tokenizer.ggml.merges", [])
        hf_tok = build_bpe_tokenizer(tokens, merges, types, _field(reader, "tokenizer.ggml.pre"))
    else:
        raise ValueError(
            f"unsupported GGUF tokenizer {model!r}: byte-level BPE ('gpt2'), SentencePiece "
            "('llama') and Gemma 4's BPE ('gemma4') are read"
        )
    return Tokenizer(
        hf_tok,
        chat_template=_field(reader, "tokenizer.chat_template"),
        # a named template, as llama.cpp's converter writes them: tools render with it
        tool_chat_template=_field(reader, "tokenizer.chat_template.tool_use"),
        bos_token_id=config.bos_token_id,
        eos_token_ids=config.eos_token_ids,
        # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", model == "llama")),
    )


class _ByName(Mapping):
    """A mapping over `self._tensors` (HF name -> GGUF tensor) whose values are built on read."""

    _tensors: dict

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


class GGUFWeights(_ByName):
    """The file's tensors by HF name, dequantized to float32 (Q/K rows un-permuted) on each
    read, straight from the memory map: the model is built one tensor at a time, so loading
    never holds a float32 copy of the whole model (an 8B GGUF: 32 GB) beside what the model
    keeps (bf16 copies, `qgemm`'s blocks, or device tensors)."""

    def __init__(self, reader, config: ModelConfig) -> None:
        self._config = config  # the tensors' arrays view the reader's memory map, keeping it
        gguf_arch = _field(reader, "general.architecture")
        self._permuted = (config.architecture in _PERMUTED or gguf_arch in gguf_archs.PERMUTED
                          or gguf_arch in gguf_classic.PERMUTED)  # fmt: skip
        named = ((_hf_name(t.name, config.architecture), t) for t in reader.tensors)
        self._tensors = {name: t for name, t in named if name is not None}  # not e.g. rope_freqs
        self._tensors = gguf_classic.falcon_norms(self._tensors, config.architecture)
        self._rows: dict[str, tuple[int, int]] = {}  # a fused tensor's parts (GLM-4's ffn_up,
        # read as its Llama name up_proj above): each part's rows, under the part's own name
        for t in reader.tensors:
            parts = gguf_glm_cohere.fused_names(t.name, config.architecture)
            rows = _shape(t)[0] // max(len(parts), 1)
            spans = [(name, i * rows, (i + 1) * rows) for i, name in enumerate(parts)]
            spans = (spans or gguf_archs.fused_parts(t.name, _shape(t)[0], config)
                     or gguf_classic.fused_parts(t.name, _shape(t), config))  # fmt: skip
            for name, start, stop in spans:
                self._tensors[name], self._rows[name] = t, (start, stop)
        # values the converter wrote as metadata (Apertus' xIELU parameters)
        self._tensors.update(gguf_archs.extra_tensors(reader, gguf_arch, config.num_layers))
        # tensors stored as gate and up apart, read as one (Granite 4.0-H's input_linear)
        self._joined = gguf_mamba.joined(set(self._tensors), config.architecture)
        self._tensors.update(dict.fromkeys(self._joined))

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.read(name)

    def read(
        self,
        name: str,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Tensor `name` as `dtype` on `device` (default: the CPU), dequantized there
        (`gguf_dequant`: the stored blocks are what crosses to a GPU)."""
        t = self._tensors[name]
        if name in self._joined:  # gate rows, then up rows
            parts = [self.read(n, device, dtype) for n in self._joined[name]]
            return torch.cat(parts, dim=-2 if parts[0].dim() > 1 else 0)
        if isinstance(t, torch.Tensor):  # from the metadata
            return t.to(device=device, dtype=dtype)
        w = dequantize(t.data, t.tensor_type.name, _shape(t), dtype, device)
        if name in self._rows:  # a part of a fused tensor (a row of a stacked norm: a vector)
            w = w[slice(*self._rows[name])].contiguous()
            w = w[0] if ".norms." in name else w
        if w.dim() == 1 and name.endswith("shared_expert_gate.weight"):  # squeezed: [hidden]
            return w[None]
        if ".mamba." in name:  # llama.cpp's forms of the mixer's tensors
            return gguf_mamba.mamba_value(name, w)
        if self._config.architecture in gguf_qwen3next.ARCHS:  # its DeltaNet's, its norms
            return gguf_qwen3next.value(name, w, self._config)
        w = gguf_classic.value(name, w, self._config.architecture)
        heads = _permuted_heads(self._config, name, self._permuted)
        return _unpermute(w, heads) if heads else w

    def blocks(self) -> GGUFBlocks:
        return GGUFBlocks(self._tensors, self._config, self._rows, self._permuted)


class GGUFBlocks(_ByName):
    """The raw blocks of the matrices stored in a format `qgemm` reads (`quantized.readable`),
    rows in the same HF order, copied out of the file when read: only float32 CPU models read
    them, so a GPU or bf16 load copies none."""

    def __init__(self, tensors: dict, config: ModelConfig, rows: dict | None = None,
                 permuted: bool = False) -> None:  # fmt: skip
        self._config, self._rows, self._permuted = config, rows or {}, permuted
        self._tensors = {
            name: t
            for name, t in tensors.items()
            if name.endswith(".weight")
            and t is not None  # (a joined tensor: read from its parts)
            and not isinstance(t, torch.Tensor)
            and len(_shape(t)) in (2, 3)  # 3: stacked experts, their rows one after another
            and readable(t.tensor_type.name, _shape(t)[-1])
            and not gguf_qwen3next.reordered(name, config)  # (read dequantized, put back)
        }

    def __getitem__(self, name: str) -> QuantizedWeight:
        t = self._tensors[name]
        blocks = from_gguf(t.tensor_type.name, t.data, _shape(t)[-1])  # experts: E * N rows
        if name in self._rows:  # a part of a fused tensor
            part = blocks.blocks[slice(*self._rows[name])].contiguous()
            blocks = QuantizedWeight(blocks.kind, part, blocks.cols)
        heads = _permuted_heads(self._config, name, self._permuted)
        if heads:
            blocks = QuantizedWeight(
                blocks.kind, _unpermute_rows(blocks.blocks, heads), blocks.cols
            )
        return blocks


def held_shape(name: str, t) -> tuple[int, ...]:
    """The shape of `t` (engine name `name`) as the loader gives it (a Mamba2 mixer's A, D,
    conv and norm reshaped: `gguf_mamba.mamba_value`), for the weights estimate."""
    return gguf_mamba.mamba_shape(name, _shape(t))


def load_gguf(
    path: str | Path,
) -> tuple[ModelConfig, GGUFWeights, Tokenizer, GGUFBlocks]:
    """Read config, the weights (HF names, float32 when read), tokenizer, and the raw blocks of
    the weights stored in a format `qgemm` reads (`quantized.BLOCKS`), rows in the same HF order.
    The file's last read in a process: the reader its checks shared, if any (`gguf_reader`)."""
    reader = take_reader(path)
    config = read_config(reader)
    weights = GGUFWeights(reader, config)
    return config, weights, read_tokenizer(reader, config), weights.blocks()


_PERMUTED = ("llama", "mixtral", "granite", "granitemoe", "smollm3")  # llama.cpp's LlamaModel's


def _permuted_heads(config: ModelConfig, name: str, permuted: bool) -> int:
    """Heads whose rows llama.cpp interleaved in this tensor (0: not permuted): q and k of a
    file whose converter permutes them (`permuted`)."""
    if not permuted:
        return 0
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return config.num_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return config.num_kv_heads
    return 0


def _unpermute_rows(rows: torch.Tensor, n_heads: int) -> torch.Tensor:
    return _unpermute(rows, n_heads).contiguous()

"""GGUF → (ModelConfig, HF-named float tensors, Tokenizer) through the `gguf` package.

Quantized tensors (Q4_0, Q4_1, Q8_0, ...) are dequantized to float32 when the model builder reads
them (`GGUFWeights`), one at a time from the memory-mapped file. llama.cpp stores the
Q and K projections of Llama models permuted for its interleaved rotary; we undo that so one
rotate-half rotary (Hugging Face layout) serves every loader.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.cpu.quantized import QuantizedWeight, from_gguf, readable
from pagoda.runtime.model.tokenizer import Tokenizer, build_bpe_tokenizer

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's convert-time permute (rows interleaved per head for rotary)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _BLOCK.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def read_config(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
        )
    p = f"{arch}."
    hidden = int(_field(reader, p + "embedding_length"))
    heads = int(_field(reader, p + "attention.head_count"))
    kv_heads = int(_field(reader, p + "attention.head_count_kv", heads))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocab = int(_field(reader, p + "vocab_size", len(tokens)))
    head_dim = int(_field(reader, p + "attention.key_length", hidden // heads))
    rope_scaling = None
    scale_type = _field(reader, p + "rope.scaling.type")
    if scale_type in ("linear", "yarn"):
        rope_scaling = {
            "rope_type": scale_type,
            "factor": float(_field(reader, p + "rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(
                _field(reader, p + "rope.scaling.original_context_length", 0) or 0
            ),
        }
    eos = [int(_field(reader, "tokenizer.ggml.eos_token_id", -1))]
    eot = _field(reader, "tokenizer.ggml.eot_token_id")
    if eot is not None and int(eot) not in eos:
        eos.append(int(eot))
    names = {t.name for t in reader.tensors}
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(_field(reader, p + "feed_forward_length")),
        num_layers=int(_field(reader, p + "block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_field(reader, p + "rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        max_position_embeddings=int(_field(reader, p + "context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=tuple(e for e in eos if e >= 0),
        architecture=arch,
    )


def read_tokenizer(reader, config: ModelConfig) -> Tokenizer:
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"unsupported GGUF tokenizer {model!r}: only byte-level BPE ('gpt2') is supported"
        )
    hf_tok = build_bpe_tokenizer(
        _field(reader, "tokenizer.ggml.tokens"),
        _field(reader, "tokenizer.ggml.merges", []),
        _field(reader, "tokenizer.ggml.token_type"),
        _field(reader, "tokenizer.ggml.pre"),
    )
    return Tokenizer(
        hf_tok,
        chat_template=_field(reader, "tokenizer.chat_template"),
        bos_token_id=config.bos_token_id,
        eos_token_ids=config.eos_token_ids,
        add_bos_token=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    )


def _reader(path: str | Path):
    """`gguf.GGUFReader` parsing through a plain ndarray view of its memory map.

    The reader slices its ``np.memmap`` once per value, and every slice of the memmap subclass
    runs ``memmap.__array_finalize__``: a GGUF's tokenizer arrays (SmolLM2: 49k tokens, 49k
    merges) are ~10^6 slices, ~2 s of a ~3.5 s load. Slices of the plain view read the same
    mapped bytes without it (same values; the view keeps the map alive)."""
    import gguf

    class Reader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            plain = getattr(self, "_plain", None)
            if plain is None:  # `data` is set first thing in __init__, before any _get
                plain = self._plain = self.data.view(np.ndarray)
            count = int(count)
            end = offset + int(np.dtype(dtype).itemsize) * count
            arr = plain[offset:end].view(dtype=dtype)[:count]
            order = self.byte_order if override_order is None else override_order
            return arr.view(arr.dtype.newbyteorder(order))

    return Reader(str(path))


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
        named = ((_hf_name(t.name), t) for t in reader.tensors)
        self._tensors = {name: t for name, t in named if name is not None}  # not e.g. rope_freqs

    def __getitem__(self, name: str) -> torch.Tensor:
        import gguf

        t = self._tensors[name]
        arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        arr = arr.reshape(_shape(t))
        heads = _permuted_heads(self._config, name)
        if heads:
            arr = _unpermute(arr, heads)
        return torch.from_numpy(np.array(arr, dtype=np.float32, order="C"))  # own the memory

    def blocks(self) -> GGUFBlocks:
        return GGUFBlocks(self._tensors, self._config)


class GGUFBlocks(_ByName):
    """The raw blocks of the matrices stored in a format `qgemm` reads (`quantized.readable`),
    rows in the same HF order, copied out of the file when read: only float32 CPU models read
    them, so a GPU or bf16 load copies none."""

    def __init__(self, tensors: dict, config: ModelConfig) -> None:
        self._config = config
        self._tensors = {
            name: t
            for name, t in tensors.items()
            if name.endswith(".weight")
            and len(_shape(t)) == 2
            and readable(t.tensor_type.name, _shape(t)[1])
        }

    def __getitem__(self, name: str) -> QuantizedWeight:
        t = self._tensors[name]
        blocks = from_gguf(t.tensor_type.name, t.data, _shape(t)[1])
        heads = _permuted_heads(self._config, name)
        if heads:
            blocks = QuantizedWeight(
                blocks.kind, _unpermute_rows(blocks.blocks, heads), blocks.cols
            )
        return blocks


def _shape(t) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims fastest-first


def load_gguf(
    path: str | Path,
) -> tuple[ModelConfig, GGUFWeights, Tokenizer, GGUFBlocks]:
    """Read config, the weights (HF names, float32 when read), tokenizer, and the raw blocks of
    the weights stored in a format `qgemm` reads (`quantized.BLOCKS`), rows in the same HF order."""
    reader = _reader(path)
    config = read_config(reader)
    weights = GGUFWeights(reader, config)
    return config, weights, read_tokenizer(reader, config), weights.blocks()


def _permuted_heads(config: ModelConfig, name: str) -> int:
    """Heads whose rows llama.cpp interleaved in this tensor (0: not permuted)."""
    if config.architecture != "llama":
        return 0
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return config.num_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return config.num_kv_heads
    return 0


def _unpermute_rows(rows: torch.Tensor, n_heads: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(_unpermute(rows.numpy(), n_heads)))

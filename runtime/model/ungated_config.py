"""The `FamilyConfig` fields of the families whose MLP is ungated, down(act(up(x)))
(`model/ungated_mlp.py`; `family_fields.FIELDS` takes `FIELDS`, `family_fields.Fields`'
signature): Arcee, Apertus (and Apertus 1.5's pruned head), StarCoder2, Nemotron, Jais 2, Phi,
GPT-J, CodeGen, Persimmon, Falcon, GPT-NeoX (and its Japanese model), nanochat; each family's
refusals in one line. No layer code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _ungated(**fields: Any) -> dict[str, Any]:
    return {"gated_mlp": False, **fields}


def _biased(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """StarCoder2, Nemotron (1 + w), Jais 2: LayerNorms with biases."""
    return _ungated(layer_norm_bias=True)


def _arcee(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    return _ungated()


def _phi(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """Phi: LayerNorms with biases; `qk_layernorm`: a LayerNorm over each head, with a bias."""
    return _ungated(layer_norm_bias=True, **({"qk_norm": True} if cfg.get("qk_layernorm") else {}))


def _gptj(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """GPT-J and CodeGen: Phi's model, the rotary interleaved (GLM's layout)."""
    return _ungated(layer_norm_bias=True, rope_interleaved=True)


def _persimmon(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """Persimmon: GPT-NeoX's q/k/v per head in Llama's layer; Phi's q/k norms."""
    return _ungated(layer_norm_bias=True, falcon_qkv="per_head", falcon_norms="sequential",
                    qk_norm=bool(cfg.get("qk_layernorm")))  # fmt: skip


def _falcon(cfg: Mapping[str, Any], arch, n, window, layers, scaling) -> dict[str, Any]:
    """Falcon's q/k/v layout and layer (model/falcon.py), as transformers' FalconDecoderLayer
    picks them; ALiBi refused."""
    if cfg.get("alibi"):
        raise ValueError("Falcon with alibi (ALiBi position biases: falcon-rw) is not supported")
    new, parallel = bool(cfg.get("new_decoder_architecture")), bool(cfg.get("parallel_attn"))
    if new:
        norm_layers = cfg.get("num_ln_in_parallel_attn") or 2
        if norm_layers == 1 and not parallel:  # (transformers' layer has no MLP input then)
            raise ValueError("Falcon's new_decoder_architecture with num_ln_in_parallel_attn 1 "
                             "and parallel_attn false is not supported")  # fmt: skip
        norms = "two" if norm_layers == 2 else "one"
    else:
        norms = "one" if parallel else "sequential"
    qkv = "grouped" if new else "multi_query" if cfg.get("multi_query") else "per_head"
    return _ungated(layer_norm_bias=True, falcon_qkv=qkv, falcon_norms=norms)


def _gpt_neox(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """GPT-NeoX: Falcon's per-head q/k/v; two norms in parallel, or Llama's layer."""
    norms = "two" if cfg.get("use_parallel_residual", True) else "sequential"
    return _ungated(layer_norm_bias=True, falcon_qkv="per_head", falcon_norms=norms)


def _gpt_neox_japanese(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """GPT-NeoX Japanese: GPT-NeoX's q/k/v per head in Llama's layer, no biases (but the last
    o_proj's)."""
    return _ungated(layer_norm_bias=True, falcon_qkv="per_head", falcon_norms="sequential")


def _apertus(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    return _ungated(qk_norm=True)


def _apertus1p5(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """Apertus', its LM head pruned to `output_vocab_size` rows (`FamilyConfig.head_rows`), as
    Apertus1p5TextConfig checks them; tied, none (transformers' head is then the embedding,
    every id scored)."""
    rows, vocab = cfg.get("output_vocab_size"), int(cfg["vocab_size"])
    if rows is None or int(rows) == vocab:
        head = 0
    elif not 1 <= int(rows) <= vocab:
        raise ValueError(f"output_vocab_size ({rows}) must be in [1, vocab_size] "
                         f"(vocab_size is {vocab})")  # fmt: skip
    else:
        head = 0 if cfg.get("tie_word_embeddings") else int(rows)
    return _ungated(qk_norm=True, head_rows=head)


def _nanochat(cfg, arch, n, window, layers, scaling) -> dict[str, Any]:
    """nanochat (its q/k norms have no weights: model/nanochat.py): a soft cap on the logits."""
    cap = cfg.get("final_logit_softcapping")
    return _ungated(final_logit_softcapping=float(cap) if cap else None)


# architecture -> its fields (`family_fields.Fields`)
FIELDS = {
    "arcee": _arcee,
    "apertus": _apertus,
    "apertus1p5": _apertus1p5,
    **dict.fromkeys(("starcoder2", "nemotron", "jais2"), _biased),
    "phi": _phi,
    **dict.fromkeys(("gptj", "codegen"), _gptj),
    "persimmon": _persimmon,
    "falcon": _falcon,
    "gpt_neox": _gpt_neox,
    "gpt_neox_japanese": _gpt_neox_japanese,
    "nanochat": _nanochat,
}

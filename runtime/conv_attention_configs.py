"""The frozen configs of the attention layers that keep a short-conv state per sequence beside
their KV cache (`MambaConfig.zaya`, `.inkling`, `.inkling2`, runtime/recurrent_configs.py, whose
conv state they size): Zaya's convolutional q/k and delayed values, Inkling's and Inkling 2's
window layers, relative logits and short convs, with what they add to the weights on a rank.
Validated in ``__post_init__`` like the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagoda.runtime import option_rules

if TYPE_CHECKING:
    from pagoda.runtime.model_config import ModelConfig


@dataclass(frozen=True)
class ZayaCCA:
    """Zaya's attention inputs (`model/zaya.py`, read by `model/zaya_config.py`): q and k from
    a causal conv over the tokens (a depthwise conv of `time0` taps, then one of `time1` taps
    grouped by head), half of each value from the token before; the conv state holds the last
    ``time0 + time1 - 2`` q/k projections and the delayed value projection of the token before
    (`MambaConfig.d_conv`, a short conv's state). Its router (`router_hidden` wide) reads the
    previous layer's router state."""

    time0: int
    time1: int
    router_hidden: int
    delayed: int  # the delayed values' channels (KV heads x head_dim / 2): whole on every rank

    def __post_init__(self) -> None:
        for name in ("time0", "time1", "router_hidden", "delayed"):
            option_rules.check_int(name, getattr(self, name))

    def params(self, c: ModelConfig, tp: int = 1) -> int:
        """One layer's weights on one of `tp` ranks beyond Llama's attention (the values' two
        halves are v's rows, whole on every rank: the rest of them added) and the experts'
        (`FamilyConfig.num_experts`): the convs and the key scale (a rank's heads'), the two
        residual scalings, the router (its state's scale too: the first layer has none) less
        the one matrix `from_shapes` counts for it."""
        h, d, e, r = c.hidden_size, c.head_dim, c.family.num_experts, self.router_hidden
        qk = (c.num_heads + c.num_kv_heads) * d // tp
        conv = qk * (self.time0 + 1) + qk * (d * self.time1 + 1)
        router = r * h + 3 * r + 2 * (r * r + r) + (e + 1) * r + (e + 1) - e * h
        values = c.num_kv_heads * d * h * (tp - 1) // tp
        return conv + c.num_kv_heads // tp + 8 * h + router + values


def _rank_heads(n: int, tp: int) -> int:
    """The KV heads one of `tp` ranks holds of `n`: its share, or one replicated."""
    return n // tp if n >= tp else 1


@dataclass(frozen=True)
class InklingLayers:
    """Inkling's layers (`model/inkling.py`, read by `model/inkling_config.py`): window layers
    (`sliding`) with their own KV heads and head size; relative-position logits (`d_rel`
    profiles over `rel_extent` distances, the window's on window layers); the full layers'
    logit scaling ``1 + log_alpha * log(max((p + 1) / log_floor, 1))`` (None: none); four short
    convs per layer whose inputs are its conv state ([k | v | attention's output | the MLP's],
    `MambaConfig.d_conv` taps); `shared_experts` beside the routed ones, scored with them,
    weights times `route_scale`; the final hidden states over `logits_divisor`."""

    sliding: tuple[bool, ...]
    swa_kv_heads: int
    swa_head_dim: int
    d_rel: int
    rel_extent: int
    log_floor: int | None
    log_alpha: float
    shared_experts: int
    route_scale: float
    logits_divisor: float

    def __post_init__(self) -> None:
        for name in ("swa_kv_heads", "swa_head_dim", "d_rel", "rel_extent", "shared_experts"):
            option_rules.check_int(name, getattr(self, name))
        if self.log_floor is not None:
            option_rules.check_int("log_scaling_n_floor", self.log_floor)
        if self.logits_divisor <= 0:
            raise ValueError(f"logits_mup_width_multiplier must be positive, got "
                             f"{self.logits_divisor}")  # fmt: skip

    def kv_shape(self, c: ModelConfig, layer: int) -> tuple[int, int]:
        """(KV heads, head size) of `layer`."""
        if self.sliding[layer]:
            return self.swa_kv_heads, self.swa_head_dim
        return c.num_kv_heads, c.head_dim

    def params(self, c: ModelConfig, tp: int = 1) -> int:
        """The layers' weights on one of `tp` ranks beyond Llama's attention and MLPs and the
        experts' (`FamilyConfig.num_experts`, routers counted): each layer's r_proj (a rank's
        heads'), relative-logit profiles, its convs (k and v a rank's KV heads') and the MLP's
        scale (dense) or the shared experts (by width), the router's shared rows, scale and
        correction bias (sparse); the embedding norm; less Llama's attention where a window
        layer's shape differs."""
        h, f, k, nh = c.hidden_size, c.family, c.family.mamba.d_conv, c.num_heads // tp
        out = h  # the embedding norm
        for i in range(c.num_layers):
            hkv, d = self.kv_shape(c, i)
            hkv, kv = _rank_heads(hkv, tp), _rank_heads(c.num_kv_heads, tp)
            extent = f.sliding_window if self.sliding[i] else self.rel_extent
            out += nh * self.d_rel * h + self.d_rel * extent + (2 * hkv * d + 2 * h) * k
            out += h * d * (nh * 2 + hkv * 2) + 2 * d  # attention, q/k norms
            out -= h * c.head_dim * (nh * 2 + kv * 2) + 2 * c.head_dim
            if f.has_experts(i):
                n, s = f.moe_intermediate_size // tp, self.shared_experts
                out += s * 3 * h * n + s * h + 1 + f.num_experts
            else:
                out += 1
        return out


@dataclass(frozen=True)
class Inkling2Layers:
    """Inkling 2's layers (`model/inkling2.py`, read by `model/inkling2_config.py`): Inkling's
    window layers (their own KV heads), relative logits and four short convs per layer (the
    full layers' k/v convs dynamic: per-token taps), L2 clips of q, k (`qk_clip`) and the
    relative states (`rel_clip`), the full layers' log scaling of q and those states,
    per-token sinks, block attention residuals every `block` layers, softcapped SwiGLU experts
    (`gate_cap`, `up_cap`) routed by normalised sigmoid scores times `route_scale`; the
    embedding `padded_vocab` rows (the head: `ModelConfig.vocab_size`)."""

    sliding: tuple[bool, ...]
    swa_kv_heads: int
    d_rel: int
    rel_extent: int
    log_floor: int
    log_alpha: float
    qk_clip: float
    rel_clip: float
    block: int
    gate_cap: float
    up_cap: float
    route_scale: float
    padded_vocab: int
    # Inkling2Loop's looped layers [start, end) run `passes` times, each pass after the first
    # with its own KV caches and conv states (cache indices after the model's layers) and
    # message gates of rank `gate_rank`; (0, 0, 1, 0): none
    loop: tuple[int, int, int, int] = (0, 0, 1, 0)

    def __post_init__(self) -> None:
        for name in ("swa_kv_heads", "d_rel", "rel_extent", "log_floor", "block", "padded_vocab"):
            option_rules.check_int(name, getattr(self, name))

    def cache_layers(self) -> tuple[int, ...]:
        """Each KV cache / conv state's layer: the model's, then the looped layers' again
        for each further pass."""
        start, end, passes, _ = self.loop
        return (*range(len(self.sliding)), *(list(range(start, end)) * (passes - 1)))

    def kv_shape(self, c: ModelConfig, layer: int) -> tuple[int, int]:
        """(KV heads, head size) of `layer` (a cache index: `cache_layers`)."""
        layer = self.cache_layers()[layer]
        return (self.swa_kv_heads if self.sliding[layer] else c.num_kv_heads), c.head_dim

    def params(self, c: ModelConfig, tp: int = 1) -> int:
        """The weights on one of `tp` ranks beyond Llama's attention and the experts (routers
        counted): the gate, sink, relative-logit and clip-scale tensors (a rank's heads'), the
        convs (dynamic on full layers; k and v a rank's KV heads'), the block residuals'
        queries, the full layers' extra norms; the padded embedding rows (a rank's share)."""
        h, f, k, d = c.hidden_size, c.family, c.family.mamba.d_conv, c.head_dim
        nh, kv = c.num_heads // tp, _rank_heads(c.num_kv_heads, tp)
        out = h + (self.padded_vocab - c.vocab_size) * h // tp + h  # embed norm, padding, query
        for i in range(c.num_layers):
            hkv = _rank_heads(self.kv_shape(c, i)[0], tp)
            extent = f.sliding_window if self.sliding[i] else self.rel_extent
            out += nh * d * h + nh * (h - 1) + nh * self.d_rel * (h + 1) + self.d_rel * extent
            out += nh * d + h + f.num_experts  # gate, sinks (gpt-oss's one logit a head counted),
            # relative logits; q scale, query, correction bias
            out += 2 * h * hkv * d - 2 * h * kv * d  # (a window layer's KV heads)
            out += 2 * h * k  # the output convs
            if self.sliding[i]:
                out += 2 * hkv * d * k + (h if i else 0)
            else:
                out += 2 * (k * hkv * d + hkv * k * h) + 2 * h + (3 * h if i else 0)
        start, end, _, rank = self.loop  # four message gates a looped layer, their queries
        return out + (end - start) * 4 * (2 * h * rank + 2 * rank * h + h)

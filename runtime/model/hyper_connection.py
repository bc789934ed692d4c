"""Hyper-connections (`model_configs.HyperConfig`): DeepSeek-V4's manifold-constrained form (mHC,
transformers' ``DeepseekV4HyperConnection`` / ``DeepseekV4HyperHead``) and HY V4's independent
one (``HYV4HyperConnection`` / ``HYV4HyperHead``), batched over a step's ragged tokens: every
tensor is ``[T, ...]``, the step's tokens of every sequence in one batch (no per-sequence loop).

The residual is ``N = hc_mult`` streams ``[T, N, D]`` (the first layer's input: each token's
embedding in every stream). Around each attention or MLP block a `HyperConnection` reads the
streams, flattened ``[T, N * D]`` and RMS-normalised without a weight (float32), through one
float32 projection ``fn`` to per-token logits, and gives

- ``pre = sigmoid(logits_pre * scale_pre + base_pre) + hc_eps`` [T, N]: the block's input is
  the streams' mix ``sum_n pre_n * stream_n`` [T, D] (`HyperConnection.__call__`);
- ``post`` [T, N]: the block's output ``y`` joins stream n as ``post_n * y`` (`merge`):
  ``2 * sigmoid(.)`` in mHC, ``post_magnitude * sigmoid(.) + hc_eps`` in HY V4's form;
- mHC only: ``comb`` [T, N, N], ``softmax(logits_comb * scale_comb + base_comb) + hc_eps``
  projected towards a doubly-stochastic matrix by ``hc_sinkhorn_iters`` Sinkhorn-Knopp steps
  (columns, then rows and columns): the new streams are ``post y + comb^T streams``. HY V4's form
  has no ``comb``: ``post y + streams`` (in float32, rounded once).

`HyperHead` folds the last layer's streams into one ``[T, D]`` before the final norm:
``sum_n (sigmoid(logits * scale + base) + hc_eps)_n * stream_n``.

The two forms normalise at different points (mHC projects the normalised rows; HY V4 projects
the raw rows and scales the logits by the rows' inverse RMS): the same maps, rounded as each
transformers module rounds them. Everything here runs in float32 whatever the model's dtype, as
transformers keeps these modules (`_keep_in_fp32_modules_strict`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model_configs import HyperConfig


def _inverse_rms(flat: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / RMS of each float32 row ``[T, ND]`` → [T, 1]."""
    return torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)


class HyperConnection:
    """The weights around one block (module docstring): ``fn`` [(2 + N) N or 2 N, N D], ``base``
    of that many, ``scale`` [3] (mHC) or [2]; all float32."""

    def __init__(
        self, cfg: HyperConfig, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor
    ) -> None:
        self.cfg = cfg
        self.fn, self.base, self.scale = fn.float(), base.float(), scale.float()

    def __call__(
        self, streams: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(post [T, N] float32, comb [T, N, N] float32 or None, the block's input [T, D] in
        the streams' dtype) of ``streams`` [T, N, D]."""
        cfg, n = self.cfg, self.cfg.mult
        flat = streams.flatten(1).float()
        if cfg.sinkhorn_iters:  # mHC: the normalised rows projected
            mixes = F.linear(flat * _inverse_rms(flat, cfg.norm_eps), self.fn)
            pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
            pre_b, post_b, comb_b = self.base.split([n, n, n * n])
            pre_s, post_s, comb_s = self.scale.unbind(0)
            pre = torch.sigmoid(pre_w * pre_s + pre_b) + cfg.eps
            post = 2 * torch.sigmoid(post_w * post_s + post_b)
            comb = torch.softmax(comb_w.unflatten(-1, (n, n)) * comb_s + comb_b.view(n, n), -1)
            comb = sinkhorn(comb + cfg.eps, cfg.sinkhorn_iters, cfg.eps)
        else:  # HY V4: the raw rows projected, the logits scaled by the inverse RMS
            mixes = F.linear(flat, self.fn) * _inverse_rms(flat, cfg.norm_eps)
            pre_w, post_w = mixes.split(n, dim=-1)
            pre_b, post_b = self.base.split(n)
            pre_s, post_s = self.scale.unbind(0)
            pre = torch.sigmoid(pre_w * pre_s + pre_b) + cfg.eps
            post = cfg.post_magnitude * torch.sigmoid(post_w * post_s + post_b) + cfg.eps
            comb = None
        collapsed = (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
        return post, comb, collapsed

    def merge(
        self, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor | None, y: torch.Tensor
    ) -> torch.Tensor:
        """The next streams [T, N, D] from the block's output ``y`` [T, D] (module docstring)."""
        dtype = streams.dtype
        if comb is None:  # HY V4: in float32, rounded once
            out = post.unsqueeze(-1) * y.float().unsqueeze(-2) + streams.float()
            return out.to(dtype)
        mixed = torch.matmul(comb.to(dtype).transpose(-1, -2), streams)
        return post.to(dtype).unsqueeze(-1) * y.unsqueeze(-2) + mixed


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """``comb`` [..., N, N] (positive) towards doubly stochastic, as transformers' mHC: its
    columns normalised, then ``iters - 1`` times its rows and its columns."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


class HyperHead:
    """The last streams folded into one row per token (module docstring): ``fn`` [N, N D],
    ``base`` [N], ``scale`` [1], float32."""

    def __init__(
        self, cfg: HyperConfig, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor
    ) -> None:
        self.cfg = cfg
        self.fn, self.base, self.scale = fn.float(), base.float(), scale.float()

    def __call__(self, streams: torch.Tensor) -> torch.Tensor:
        """[T, N, D] → [T, D] in the streams' dtype."""
        cfg = self.cfg
        flat = streams.flatten(1).float()
        if cfg.sinkhorn_iters:
            mixes = F.linear(flat * _inverse_rms(flat, cfg.norm_eps), self.fn)
        else:
            mixes = F.linear(flat, self.fn) * _inverse_rms(flat, cfg.norm_eps)
        pre = torch.sigmoid(mixes * self.scale + self.base) + cfg.eps
        return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)


def expand(x: torch.Tensor, n: int) -> torch.Tensor:
    """The first layer's streams: each token's row ``x`` [T, D] in every one of `n` [T, n, D]."""
    return x.unsqueeze(1).expand(-1, n, -1).contiguous()

"""DeepSeek's expert routers (`model_configs.ExpertRouting`): which experts a token goes to, and with
what weights. One place for the rules, as transformers' DeepseekV2TopkRouter and
DeepseekV3TopkRouter compute them; GLM-4.5's router is V3's.

- scores: softmax (V2) or sigmoid (V3) of the router's logits, in float32 (transformers keeps
  the router's weight in float32 and multiplies float32 hidden states; here a float32 `Linear`,
  row-invariant as every other layer, so a token's experts do not depend on its batch);
- choice: greedy (the top-k scores), or limited to the best ``topk_group`` of ``n_group``
  groups of experts: a group scored by its best expert (V2's group_limited_greedy; the other
  groups' scores set to 0) or by the sum of its best two after adding the checkpoint's
  ``e_score_correction_bias`` (V3's noaux_tc; the other groups' set to -inf, or to 0 with
  ``zero_other_groups``: A.X-K2's); Kolibri's router adds the bias to the logits, not the
  scores (`ExpertRouting.bias_on_logits`);
- weights: the picked experts' uncorrected scores (V2: the masked ones it picked from),
  renormalised to sum to 1 with ``norm_topk_prob`` (V3; transformers' V2 never does), times
  ``routed_scaling_factor``.

DeepSeek-V4's (its design: docs/runtime.md): ``sqrtsoftplus`` scores (sqrt(softplus(logits)))
with the correction bias, greedy; its first layers' `HashRouter` takes the experts from a fixed
token -> experts table (``tid2eid[input_ids]``) and weighs them by the same scores.

PhiMoE's router (`sparsemixer`: ``topk_method`` sparsemixer) picks its two experts one after the
other, each weighted by a softmax over the logits near it.

The top-k runs on the device with no host sync (CUDA graphs capture it); `moe.SparseMoE` takes
the (weights, ids) it returns as its own softmax router's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pagoda.runtime.model_configs import ExpertRouting


class GroupedRouter:
    """``(weights float32 [T, k], ids [T, k])`` of the hidden states ``x`` [T, hidden]."""

    __slots__ = ("bias", "linear", "renormalize", "routing", "top_k")

    def __init__(
        self,
        linear: Callable[[torch.Tensor], torch.Tensor],  # float32 [E, hidden] (`Linear`)
        bias: torch.Tensor | None,  # [E] e_score_correction_bias (noaux_tc), float32
        routing: ExpertRouting,
        top_k: int,
        renormalize: bool,
    ) -> None:
        self.linear, self.bias = linear, None if bias is None else bias.float()
        self.routing, self.top_k, self.renormalize = routing, top_k, renormalize

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.routing
        logits = self.linear(x.float())
        if r.topk_method == "sparsemixer":
            weights, ids = sparsemixer(logits, r.jitter_eps)
            return weights * r.routed_scaling_factor, ids
        scores = _scores(logits, r.scoring)
        if self.bias is None:
            choice = scores
        else:  # (Kolibri's: the bias on the logits; sigmoid is monotonic, the sum is not)
            choice = (logits if r.bias_on_logits else scores) + self.bias
        if r.topk_method != "greedy":
            choice = self._best_groups(choice)
        ids = torch.topk(choice, self.top_k, dim=-1, sorted=False).indices
        weights = (scores if self.bias is not None else choice).gather(1, ids)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + r.renorm_eps)
        return weights * r.routed_scaling_factor, ids

    def _best_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """`choice` with the experts outside each token's best `topk_group` groups masked."""
        r, (t, e) = self.routing, choice.shape
        grouped = choice.view(t, r.n_group, e // r.n_group)
        if r.topk_method == "noaux_tc":
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:
            group_scores = grouped.amax(dim=-1)
        best = torch.topk(group_scores, r.topk_group, dim=-1, sorted=False).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        fill = float("-inf") if r.topk_method == "noaux_tc" and not r.zero_other_groups else 0.0
        return grouped.masked_fill(~keep.unsqueeze(-1), fill).view(t, e)


def _scores(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    if scoring == "softmax":
        return logits.softmax(dim=-1)
    if scoring == "sqrtsoftplus":  # DeepSeek-V4's
        return torch.nn.functional.softplus(logits).sqrt()
    return logits.sigmoid()


class HashRouter:
    """DeepSeek-V4's hash-routed layers: ``(weights float32 [T, k], ids [T, k])`` of the hidden
    states ``x`` [T, hidden] of the tokens ``input_ids`` [T]: the experts ``table[input_ids]``
    (``tid2eid``, [vocab, k]), weighted by their scores renormalised, times
    ``routed_scaling_factor``."""

    __slots__ = ("linear", "routing", "table")

    def __init__(
        self, linear: Callable[[torch.Tensor], torch.Tensor], table: torch.Tensor,
        routing: ExpertRouting,
    ) -> None:  # fmt: skip
        self.linear, self.table, self.routing = linear, table.long(), routing

    def __call__(
        self, x: torch.Tensor, input_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.routing
        scores = _scores(self.linear(x.float()), r.scoring)
        ids = self.table.index_select(0, input_ids)
        weights = scores.gather(1, ids)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + r.renorm_eps)
        return weights * r.routed_scaling_factor, ids


def sparsemixer(logits: torch.Tensor, jitter_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PhiMoE's top-2 at inference (transformers' `sparsemixer`, not training): the best
    expert, weighted by its softmax over the logits within ``2 * jitter_eps`` (relative) of it,
    then the best of the rest, weighted by its softmax over the rest's logits within that of
    it. ``(weights float32 [T, 2], ids [T, 2])``."""
    ids, weights = [], []
    rest = logits
    for _ in range(2):
        best, top = rest.max(dim=-1, keepdim=True)
        factor = logits.abs().clamp(min=best)
        out = ((best - logits) / factor) > 2 * jitter_eps
        weights.append(rest.masked_fill(out, float("-inf")).softmax(dim=-1).gather(1, top))
        ids.append(top)
        rest = rest.scatter(1, top, float("-inf"))
    return torch.cat(weights, dim=1), torch.cat(ids, dim=1)

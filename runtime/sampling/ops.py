"""Vectorised row-wise argmax and exact inverse-CDF sampling over [N, vocab] scores.

Two costs dominate sampling on a CPU with a 32k+ vocabulary: `max(-1)`/`argmax(-1)` with indices
are not vectorised there (~20x slower than `amax`), and the exponential race draws one random
number per vocabulary entry per row. Both are avoided by viewing a row as `CHUNK`-wide chunks:

* argmax: `amax` per chunk (a vectorised reduction), argmax over the few hundred chunk maxima,
  then argmax inside the winning chunk. The first maximum wins, as with `torch.argmax`.
* sampling: unnormalised weights `exp(s - max)`, summed per chunk; one uniform per row picks a
  chunk by inverse CDF over the chunk sums and then a token inside it. This draws exactly from
  the distribution (up to float rounding of the sums) with one random number per row, so a
  seeded request's draws come from its own generator alone.

On CPU, `argmax_rows` and `sample_full` run the fused C kernels of `native` when they
are built (one pass over each row instead of five PyTorch ops); the PyTorch code below is the
fallback and the GPU path, and defines the semantics the kernels follow.

Top-k/top-p rows work on the `k` best candidates (`topk`, sorted) instead of a full sort. A top-p
row without top-k starts from `num_candidates` candidates and falls back to the whole sorted
vocabulary when they hold less than top_p of the mass (on CPU the check is a cheap host read;
on CUDA `num_candidates` is the vocabulary, so it never syncs). On CPU with the kernels built,
`sample_candidates` runs `native.sample_filtered_rows` instead: per-row selection and
quickselect, no `topk` (which costs ~110 ms per step at [256, 32000] on 2 cores).
"""

from __future__ import annotations

import torch
from pagoda.runtime.sampling import native

CHUNK = 128  # vocabulary entries per chunk
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e))


def _chunk_cols(chunk: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns of each row's chosen chunk [N, CHUNK] (clamped to the vocabulary) and validity."""
    cols = chunk.unsqueeze(1) * CHUNK + torch.arange(CHUNK, device=chunk.device)
    return cols.clamp(max=vocab - 1), cols < vocab


def _per_chunk(x: torch.Tensor, reduce: str) -> torch.Tensor:
    """`amax` or `sum` over each CHUNK-wide slice of the rows of x: [N, ceil(V / CHUNK)]."""
    v = x.shape[1]
    full = v // CHUNK
    parts = []
    if full:
        parts.append(getattr(x[:, : full * CHUNK].unflatten(1, (full, CHUNK)), reduce)(-1))
    if v % CHUNK:
        parts.append(getattr(x[:, full * CHUNK :], reduce)(-1, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


NO_TOKEN = -1  # a row with no finite maximum: no token, the engine ends its request


def finite_or_none(tokens: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    """`tokens` where the row's maximum `best` [N] is finite, else `NO_TOKEN`: on the device,
    no sync (the flag travels with the token to the step's one readback). PyTorch's maxima
    propagate NaN, so here a NaN anywhere in a row makes it non-finite; the native kernels'
    maxima skip NaN (a row of NaN, -inf or with a +inf has none either way)."""
    return torch.where(torch.isfinite(best), tokens, NO_TOKEN)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(-1)` for 2-D x (first maximum), vectorised on CPU through chunk maxima;
    `NO_TOKEN` for a row without a finite maximum."""
    if x.device.type != "cpu" or x.shape[1] <= 2 * CHUNK:
        tokens = x.argmax(-1)
    elif native.usable(x):
        return native.argmax_rows(x)  # the kernel writes NO_TOKEN itself
    else:
        chunk = _per_chunk(x, "amax").argmax(-1)
        cols, _ = _chunk_cols(chunk, x.shape[1])
        inner = x.gather(1, cols).argmax(-1, keepdim=True)
        tokens = cols.gather(1, inner).squeeze(1)
    return finite_or_none(tokens, x.gather(1, tokens.unsqueeze(1)).squeeze(1))


def pick(weights: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row, the entry of non-negative `weights` [N, K] whose cumulative interval holds
    `target` [N]; float rounding never lands on an entry of weight zero."""
    cum = weights.cumsum(-1)
    idx = torch.searchsorted(cum, target.unsqueeze(1), right=True).squeeze(1)
    pos = weights > 0
    first = pos.byte().argmax(-1)
    last = weights.shape[1] - 1 - pos.flip(-1).byte().argmax(-1)
    return torch.minimum(torch.maximum(idx, first), last)


def flat_draws(w: torch.Tensor) -> bool:
    """Whether `sample_weights` draws over whole rows at once (on CUDA): a launch costs more
    there than reading the row twice, and the chunked draw takes ~60 PyTorch ops."""
    return w.is_cuda


def pick_flat(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`sample_weights` in five ops: one float64 cumulative sum per row (float32 would lose a
    small weight's interval tens of thousands of entries in) and two searches. The first entry
    whose cumulative sum passes the target has a positive weight; the second search (the first
    entry reaching the row's total: its last positive weight) bounds it should u be 1."""
    cum = torch.cumsum(w, -1, dtype=torch.float64)
    total = cum[:, -1:].contiguous()  # searchsorted wants contiguous values
    idx = torch.searchsorted(cum, u.unsqueeze(1) * total, right=True)
    return torch.minimum(idx, torch.searchsorted(cum, total)).squeeze(1)


def sample_weights(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw one column per row of unnormalised weights w [N, V] ≥ 0 (each row has a positive
    entry) with uniforms u [N] in [0, 1): a chunk by its sum, then a column inside it (on
    CUDA: `pick_flat`)."""
    v = w.shape[1]
    if flat_draws(w):
        return pick_flat(w, u)
    if v <= 2 * CHUNK:
        return pick(w, u * w.sum(-1))
    sums = _per_chunk(w, "sum")
    cum = sums.cumsum(-1)
    target = u * cum[:, -1]
    chunk = pick(sums, target)
    before = cum.gather(1, chunk.unsqueeze(1)).squeeze(1) - sums.gather(
        1, chunk.unsqueeze(1)
    ).squeeze(1)
    cols, valid = _chunk_cols(chunk, v)
    inner = w.gather(1, cols) * valid
    local = (target - before).clamp(min=0)
    return cols.gather(1, pick(inner, local).unsqueeze(1)).squeeze(1)


def exp_weights(logits: torch.Tensor, inv_temp: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    """exp((logits - best) / T), the unnormalised probabilities (1 at the row's best token), as
    one fused multiply-add and an in-place exp2 (PyTorch's CPU exp2 is ~4x faster than exp)."""
    it = inv_temp.unsqueeze(1) * LOG2E
    return torch.addcmul(-best * it, logits, it).exp2_()


def sample_full(
    logits: torch.Tensor,
    inv_temp: torch.Tensor,
    min_p: torch.Tensor | None,
    u: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sample from softmax(logits / T) over the whole vocabulary, after an optional min-p filter;
    with `rows` (int64), for those rows of `logits` (the other arguments per chosen row): the
    native kernels read them in place, where PyTorch would copy them."""
    if native.usable(logits):
        return native.sample_rows(logits, inv_temp, min_p, u, rows)
    if rows is not None:
        logits = logits[rows]
    best = logits.amax(-1, keepdim=True)
    w = exp_weights(logits, inv_temp, best)
    if min_p is not None:  # the best token has weight 1, so min-p compares against min_p itself
        w.masked_fill_(w < min_p.unsqueeze(1), 0.0)
    return finite_or_none(sample_weights(w, u), best.squeeze(1))


def sample_candidates(
    logits: torch.Tensor,
    inv_temp: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    u: torch.Tensor,
    k: int,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sample rows that ask for top-k and/or top-p from their `k` best candidates (`rows` as in
    `sample_full`).

    `k` covers every row's top-k; a top-p row without top-k whose candidates hold too little of
    its mass is redone over the whole vocabulary. On CPU the native kernel needs no `k`: it
    selects each row's candidates without `topk` (exact for any top_p).
    """
    if native.usable(logits):
        return native.sample_filtered_rows(logits, inv_temp, top_k, top_p, min_p, u, rows)
    if rows is not None:
        logits = logits[rows]
    v = logits.shape[1]
    k = min(k, v)
    vals, ids = logits.topk(k, dim=-1)  # sorted, best first (temperature keeps the order)
    w = exp_weights(vals, inv_temp, vals[:, :1])
    keep = torch.ones_like(w, dtype=torch.bool)
    if min_p is not None:
        keep &= w >= min_p.unsqueeze(1)
    if top_k is not None:
        keep &= torch.arange(k, device=w.device).unsqueeze(0) < top_k.unsqueeze(1)
    w = w * keep
    short = None
    if top_p is not None:
        total = _filtered_total(logits, inv_temp, vals[:, :1], w, top_k, min_p)
        before = w.cumsum(-1) - w  # filtered mass strictly above each candidate
        drop = before > (top_p * total).unsqueeze(1)
        drop[:, 0] = False
        w = w.masked_fill(drop, 0.0)
        if k < v:  # complete iff the first token past the candidates would be dropped too
            short = w.sum(-1) <= top_p * total
            if top_k is not None:
                short &= top_k >= v
    tokens = finite_or_none(ids.gather(1, pick(w, u * w.sum(-1)).unsqueeze(1)).squeeze(1),
                            vals[:, 0])  # fmt: skip
    if short is not None and bool(short.any()):  # rare: a flat distribution under top-p
        rows = short.nonzero().squeeze(1)
        tokens[rows] = sample_candidates(
            logits[rows],
            inv_temp[rows],
            _sel(top_k, rows),
            top_p[rows],
            _sel(min_p, rows),
            u[rows],
            v,
        )
    return tokens


# rows per float32 log-softmax (and rank comparison) in `score_rows`: bounds the temporaries to
# this many rows of the vocabulary
ROWS_AT_ONCE = 512


def rank_by_index(rows: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """Each row's token `own` [M, 1]: its place in the row ordered by value, ties by index (1 =
    the best), as the top-k lists rank tokens, so a token's rank does not depend on k. vLLM's
    `(x >= t).sum(-1)` puts a tied token after its equals: with bfloat16 logits a sampled token
    among the top k then had another rank than when it was not."""
    t = rows.gather(1, own)
    before = torch.arange(rows.shape[1], device=rows.device) <= own
    return (rows > t).sum(-1) + ((rows == t) & before).sum(-1)


def score_rows(
    logits: torch.Tensor, targets: torch.Tensor, k: int, ranks: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Each row of `logits` [M, V]: its `targets` token's logprob, that token's rank (tokens at
    least as likely, 1 = the best; None unless `ranks`: a second pass over every row) and the
    row's top `k` (ids, logprobs; None for k = 0). On CPU
    the native kernels read the rows as they are (float32 or bfloat16) without writing a
    log-softmax; elsewhere a float32 log-softmax, `ROWS_AT_ONCE` rows at a time. Ranks compare
    the logits themselves (a log-softmax keeps their order), as the native kernel does, ties by
    index (`rank_by_index`)."""
    if native.usable(logits):
        chosen, top_ids, top_lps = native.logprob_rows(logits, targets, k)
        return chosen, native.rank_rows(logits, targets) if ranks else None, top_ids, top_lps
    chosen, rank, ids, lps = [], [], [], []
    for a in range(0, logits.shape[0], ROWS_AT_ONCE):
        rows, own = logits[a : a + ROWS_AT_ONCE], targets[a : a + ROWS_AT_ONCE].unsqueeze(1)
        lp = rows.float().log_softmax(-1)
        chosen.append(lp.gather(1, own).squeeze(1))
        if ranks:
            rank.append(rank_by_index(rows, own))
        if k:
            top = lp.topk(k, dim=-1)
            ids.append(top.indices)
            lps.append(top.values)
    top_ids, top_lps = (torch.cat(ids), torch.cat(lps)) if k else (None, None)
    return torch.cat(chosen), torch.cat(rank) if ranks else None, top_ids, top_lps


def _filtered_total(logits, inv_temp, best, w, top_k, min_p) -> torch.Tensor:
    """Each row's mass after min-p and top-k (relative to its best token's weight 1)."""
    v, k = logits.shape[1], w.shape[1]
    if k >= v:
        return w.sum(-1)
    full = exp_weights(logits, inv_temp, best)
    if min_p is not None:
        full.masked_fill_(full < min_p.unsqueeze(1), 0.0)
    total = full.sum(-1)
    return total if top_k is None else torch.where(top_k < v, w.sum(-1), total)


def _sel(t: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[rows]

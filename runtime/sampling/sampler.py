"""Batched sampling over one step's logits: allowed tokens, logit bias, penalties, temperature, top-k/top-p/min-p, seeds.

Everything is tensor work over the [N, vocab] logits; the only per-request Python is building
the parameter tensors and drawing each seeded request's uniform from its own generator. Sampling
is inverse-CDF with one uniform per row (see `ops`): exact, far cheaper on CPU than a
random number per vocabulary entry, and a seeded request's output does not depend on its
batch-mates. Rows with top-k/top-p sample from their best candidates, the others from the whole
vocabulary. On CPU, whole-vocabulary draws, top-k/top-p draws and greedy argmax run as fused C
kernels (`native`, one or two passes per row, no sort) when a C compiler can build them.
Where the LM head samples from its outputs (`qgemm`: float32 models on AVX2 CPUs), the runner
asks it for the tokens when no row filters or reads the logits (`HeadSampling`), and otherwise
passes its sampler as `whole`, which then draws the greedy and unfiltered rows from the logits.
A row whose logits have no finite maximum (NaN, all -inf, a +inf overflow) gets token -1
(`ops.NO_TOKEN`) on every path, computed on the device (no sync): the engine ends its request
with finish reason "error" (docs/reliability.md, "Non-finite numbers").
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from pagoda.runtime.sampling import native
from pagoda.runtime.sampling.allowed_tokens import AllowedTokens
from pagoda.runtime.sampling.logit_bias import LogitBias
from pagoda.runtime.sampling.ops import (
    LOG2E,
    argmax_rows,
    sample_candidates,
    sample_full,
    score_rows,
)
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.sampling.penalties import Penalties

if TYPE_CHECKING:
    from pagoda.runtime.request import Request

TOP_P_CANDIDATES = 1024  # PyTorch path on CPU: candidates a top-p row without top-k starts from


@dataclass
class SamplingBatch:
    temperature: torch.Tensor  # [N] float32, 1.0 on greedy rows (unused there)
    greedy: torch.Tensor  # [N] bool
    all_greedy: bool
    top_k: torch.Tensor | None  # [N] int64 (vocab size = off)
    top_p: torch.Tensor | None  # [N] float32
    min_p: torch.Tensor | None  # [N] float32
    penalties: Penalties | None  # the entries repetition/frequency/presence penalties touch
    generators: list[tuple[int, torch.Generator]]  # (row, generator) for seeded rows
    max_logprobs: int | None  # largest logprobs k asked in the batch, None if no row asks
    ranks: bool = False  # a row with logprobs wants its token's rank (`logprob_ranks`)
    any_greedy: bool = False
    logit_bias: LogitBias | None = None  # the rows' logit_bias entries, all rows together
    allowed: AllowedTokens | None = None  # the masks of rows with allowed_token_ids
    candidate_rows: torch.Tensor | None = None  # sampled rows with top-k/top-p (None: none)
    full_rows: torch.Tensor | None = None  # the other rows, when both kinds are present
    num_candidates: int = 0  # candidates per candidate row (covers every row's top-k)
    # CPU only (see `_head_fields`):
    scale: torch.Tensor | None = None  # [N] float32 log2(e) / temperature, 0 on greedy rows
    filtered: bool = False  # a sampled row asks for top-k, top-p or min-p
    unfiltered_rows: torch.Tensor | None = None  # greedy or unfiltered rows, when filtered
    min_p_rows: torch.Tensor | None = None  # sampled rows with min-p only, when filtered

    @property
    def plain(self) -> bool:
        """No penalties, no logit bias, no allowed tokens and no logprobs: only the token choice
        reads the logits."""
        return (
            self.penalties is None
            and self.logit_bias is None
            and self.allowed is None
            and self.max_logprobs is None
        )

    @classmethod
    def build(cls, reqs: list[Request], vocab_size: int, device: torch.device) -> SamplingBatch:
        """Parameter tensors for the rows of `reqs`, built on the host and moved without a sync."""
        ps = [r.params for r in reqs]
        greedy_host = [p.greedy for p in ps]
        f32 = torch.float32
        temp = torch.tensor(
            [1.0 if g else p.temperature for p, g in zip(ps, greedy_host)], dtype=f32
        )
        top_k = top_p = min_p = None
        if any(p.top_k > 0 for p in ps):
            top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab_size for p in ps])
        if any(p.top_p < 1.0 for p in ps):
            top_p = torch.tensor([p.top_p for p in ps], dtype=f32)
        if any(p.min_p > 0 for p in ps):
            min_p = torch.tensor([p.min_p for p in ps], dtype=f32)
        penalties = Penalties.build(reqs) if any(p.needs_penalties for p in ps) else None
        cand, full, k = _candidate_rows(ps, greedy_host, vocab_size, device)
        lps = [p.logprobs for p in ps if p.logprobs is not None]
        biased = any(r.params.logit_bias or r.params.min_tokens or r.bad_words for r in reqs)
        bias = LogitBias.build(reqs, vocab_size) if biased else None
        allowed = AllowedTokens.build(reqs, vocab_size)

        dev = functools.partial(_to_device, device=device)
        return cls(
            temperature=dev(temp),
            greedy=dev(torch.tensor(greedy_host)),
            all_greedy=all(greedy_host),
            top_k=dev(top_k),
            top_p=dev(top_p),
            min_p=dev(min_p),
            penalties=penalties.to(dev) if penalties is not None else None,
            generators=[(i, r.generator) for i, r in enumerate(reqs) if r.generator is not None],
            max_logprobs=max(lps) if lps else None,
            ranks=any(p.logprob_ranks for p in ps if p.logprobs is not None),
            any_greedy=any(greedy_host),
            logit_bias=bias.to(dev) if bias is not None else None,
            allowed=allowed.to(dev) if allowed is not None else None,
            candidate_rows=dev(torch.tensor(cand)) if cand else None,
            full_rows=dev(torch.tensor(full)) if cand and full else None,
            num_candidates=k,
            **(_head_fields(ps, greedy_host, cand, temp) if device.type == "cpu" else {}),
        )

    @property
    def changes(self) -> bool:
        """Whether the next step of the same requests needs `refreshed` (penalties, or stop
        tokens masked for min_tokens): the other fields hold while they sample in order."""
        return self.penalties is not None or (self.logit_bias is not None and self.logit_bias.live)

    def refreshed(
        self, reqs: list[Request], vocab_size: int, device: torch.device
    ) -> SamplingBatch:
        """This batch with its penalties brought up to the requests' tokens so far, and its
        min_tokens masks to the tokens they have (the rows' own bias is rebuilt with them)."""
        dev = functools.partial(_to_device, device=device)
        changed = {}
        if self.penalties is not None:
            changed["penalties"] = Penalties.build(reqs).to(dev)
        if self.logit_bias is not None and self.logit_bias.live:
            bias = LogitBias.build(reqs, vocab_size)
            changed["logit_bias"] = bias.to(dev) if bias is not None else None
        return dataclasses.replace(self, **changed)


def _to_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """A host tensor on `device`, copied without a sync (from pinned memory) on CUDA."""
    if t is None or device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _head_fields(ps: list[SamplingParams], greedy: list[bool], cand: list[int], temp) -> dict:
    """What an LM head that samples reads (`head_sampling`, `sample`'s `whole`; CPU only): the
    rows' scales, and which rows it may draw when some row filters."""
    plain = [i for i, (p, g) in enumerate(zip(ps, greedy)) if g or not p.filtered]
    min_p_only = sorted(set(range(len(ps))) - set(plain) - set(cand))
    some = len(plain) < len(ps)
    return {
        "scale": torch.where(torch.tensor(greedy), 0.0, LOG2E / temp),
        "filtered": some,
        "unfiltered_rows": torch.tensor(plain) if plain and some else None,
        "min_p_rows": torch.tensor(min_p_only) if min_p_only else None,
    }


def _candidate_rows(
    ps: list[SamplingParams], greedy: list[bool], vocab_size: int, device: torch.device
) -> tuple[list[int], list[int], int]:
    """Sampled rows with top-k/top-p, the other rows (empty when there are no candidate rows)
    and the number of candidates that covers every candidate row."""
    cand = [i for i, (p, g) in enumerate(zip(ps, greedy)) if not g and (p.top_k > 0 or p.top_p < 1)]
    k = max((ps[i].top_k for i in cand), default=0)
    if any(ps[i].top_k <= 0 for i in cand):  # a top-p row without top-k
        k = max(k, TOP_P_CANDIDATES if device.type == "cpu" else vocab_size)
    chosen = set(cand)
    full = [i for i in range(len(ps)) if i not in chosen] if cand else []
    return cand, full, min(k, vocab_size)


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [N] int64
    logprobs: torch.Tensor | None  # [N] chosen-token logprob
    top_ids: torch.Tensor | None  # [N, K]
    top_logprobs: torch.Tensor | None  # [N, K]
    # [N] int64 with logprobs and `SamplingBatch.ranks`: the chosen token's rank (entries of its
    # row at or above it)
    ranks: torch.Tensor | None = None


def apply_top_k_top_p_min_p(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """Mask filtered-out tokens with -inf (rows keep at least their best token)."""
    if b.min_p is not None:
        probs = logits.softmax(-1)
        thresh = probs.amax(-1, keepdim=True) * b.min_p.unsqueeze(1)
        logits = logits.masked_fill(probs < thresh, float("-inf"))
    if b.top_k is None and b.top_p is None:
        return logits
    sorted_logits, order = logits.sort(-1, descending=True)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if b.top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device).unsqueeze(0)
        drop |= ranks >= b.top_k.unsqueeze(1)
    if b.top_p is not None:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
        before = probs.cumsum(-1) - probs  # mass strictly above this token
        drop |= before > b.top_p.unsqueeze(1)
    drop[:, 0] = False
    return logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))


class WholeSampler(Protocol):
    """`QGemm.sample_logits`: one token per row of `logits` (or of its `rows`), with per-row
    scales log2(e) / temperature (0: greedy) and uniforms, both None when every row is greedy."""

    def __call__(
        self,
        logits: torch.Tensor,
        scale: torch.Tensor | None,
        u: torch.Tensor | None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


@dataclass
class HeadSampling:
    """What an LM head that samples needs (`Linear.sample`): per row log2(e) / temperature
    (0: greedy) and a uniform; both None when every row is greedy."""

    scale: torch.Tensor | None
    u: torch.Tensor | None


def head_sampling(b: SamplingBatch) -> HeadSampling:
    """The rows' scales and uniforms (drawn now: a seeded row's from its own generator)."""
    if b.all_greedy:
        return HeadSampling(None, None)
    return HeadSampling(b.scale, _uniforms(b, b.scale.shape[0], b.scale.device))


def sample(
    logits: torch.Tensor, b: SamplingBatch, whole: WholeSampler | None = None
) -> SamplerOutput:
    """Pick one token per row of `logits` [N, V]: float32, or bfloat16, which the native CPU
    kernels read as is (widening is exact, so the tokens are those of `logits.float()`) and
    everything else converts first. `whole(logits, scale, u)`, where given, picks the tokens
    of the greedy and unfiltered rows: the LM head's own sampler (`QGemm.sample_logits`), so
    that they are the tokens it gives when it samples without writing logits."""
    given = logits
    if logits.dtype != torch.float32 and not _native_as_is(logits, b):
        logits = logits.float()
    # vLLM's order: allowed tokens, then the bias (and min_tokens), then the penalties
    order = (b.allowed, b.logit_bias, b.penalties)
    restores = [x.apply(logits) for x in order if x is not None]
    try:
        tokens = _pick(logits, b, whole)
    finally:  # the caller's logits, and the logprobs' (the model's, before penalties), restored
        if logits is given or b.max_logprobs is not None:
            for restore in reversed(restores):
                restore()
    if b.max_logprobs is None:
        return SamplerOutput(tokens, None, None, None)
    # a row without a token (NO_TOKEN) scores token 0: the engine drops it with the row
    scored = tokens.clamp(min=0)
    chosen, ranks, top_ids, top_lp = score_rows(logits, scored, b.max_logprobs, b.ranks)
    return SamplerOutput(tokens, chosen, top_ids, top_lp, ranks)


def _pick(logits: torch.Tensor, b: SamplingBatch, whole: WholeSampler | None) -> torch.Tensor:
    if whole is not None:
        return _sample_whole(logits, b, whole)
    if b.all_greedy:
        return argmax_rows(logits)
    tokens = _sample_random(logits, b, _uniforms(b, logits.shape[0], logits.device))
    if b.any_greedy:
        tokens = torch.where(b.greedy, argmax_rows(logits), tokens)
    return tokens


def _sample_whole(logits: torch.Tensor, b: SamplingBatch, whole: WholeSampler) -> torch.Tensor:
    """Greedy and unfiltered rows by `whole`; min-p rows and top-k/top-p rows as `sample`
    draws them otherwise (reading their rows of `logits` in place)."""
    head = head_sampling(b)
    if not b.filtered:
        return whole(logits, head.scale, head.u)
    u, inv_t = head.u, b.temperature.reciprocal()
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    if (rows := b.unfiltered_rows) is not None:
        tokens[rows] = whole(logits, b.scale[rows], u[rows], rows)
    if (rows := b.min_p_rows) is not None:
        tokens[rows] = sample_full(logits, inv_t[rows], b.min_p[rows], u[rows], rows)
    if (rows := b.candidate_rows) is not None:
        tokens[rows] = _candidates(logits, b, inv_t, u, rows)
    return tokens


def _native_as_is(logits: torch.Tensor, b: SamplingBatch) -> bool:
    """Whether only the native kernels touch these logits (no penalties, no logit bias, no
    allowed tokens; whole-vocabulary and top-k/top-p rows, and logprobs, alike)."""
    touched = b.penalties is not None or b.logit_bias is not None or b.allowed is not None
    return not touched and native.usable(logits)


def _uniforms(b: SamplingBatch, n: int, device: torch.device) -> torch.Tensor:
    """One uniform in [0, 1) per row; a seeded row draws from its own generator only."""
    u = torch.rand(n, device=device)
    for row, gen in b.generators:
        u[row] = torch.rand(1, generator=gen, device=device)[0]
    return u


def _sample_random(logits: torch.Tensor, b: SamplingBatch, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling with one uniform per row, after temperature and the filters."""
    inv_t = b.temperature.reciprocal()
    if b.candidate_rows is None:  # no row asks for top-k/top-p: the whole vocabulary
        return sample_full(logits, inv_t, b.min_p, u)
    if b.full_rows is None:  # every row does
        return sample_candidates(logits, inv_t, b.top_k, b.top_p, b.min_p, u, b.num_candidates)
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    rows = b.full_rows
    tokens[rows] = sample_full(logits, inv_t[rows], _rows(b.min_p, rows), u[rows], rows)
    rows = b.candidate_rows
    tokens[rows] = _candidates(logits, b, inv_t, u, rows)
    return tokens


def _candidates(logits, b: SamplingBatch, inv_t, u, rows: torch.Tensor) -> torch.Tensor:
    """The top-k/top-p rows' tokens (`rows` of the batch)."""
    return sample_candidates(
        logits,
        inv_t[rows],
        _rows(b.top_k, rows),
        _rows(b.top_p, rows),
        _rows(b.min_p, rows),
        u[rows],
        b.num_candidates,
        rows,
    )


def _rows(t: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """The `rows` of a per-row parameter that may be absent (the logits are never indexed: the
    samplers take `rows` and read them in place)."""
    return None if t is None else t[rows]

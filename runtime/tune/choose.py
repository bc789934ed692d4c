"""Scheduler knobs from measured curves: pure functions, so the policy is testable on its own.

Model of a step (what the engine measures): a decode step of ``b`` sequences at context ``L``
takes ``a + c*b`` seconds (least-squares line through the measured batches at the largest
measured context, the conservative one); a prefill chunk of ``C`` tokens takes ``t_P(C)``. With
chunked prefill a step carries one chunk plus the running decodes, so the decodes' inter-token
latency is about ``t_P(C) + c*b``. The choice:

* ``max_num_seqs`` = the largest ``b`` whose decode step meets the ITL target, capped by the KV
  cache (``capacity / L``) and by 4x the largest measured batch (no far extrapolation);
* the chunk ``C`` = the measured chunk with the highest prefill throughput ``V_P = C / t_P(C)``
  among those whose mixed step still meets the ITL target;
* ``max_num_batched_tokens`` = ``C + max_num_seqs`` (one token per decode slot plus the chunk).

If no chunk fits next to that batch, the batch shrinks until the smallest chunk does. If the
target cannot be met at all (a decode step alone, or the smallest chunk alone, exceeds it), the
knobs maximise throughput instead (the KV-bound batch, the best-V_P chunk) and ``itl_met`` is
false: shrinking the batch to one would not meet the target either, only add queueing.

TTFT: a prompt of ``P`` tokens needs about ``P / V_P`` seconds of prefill, so the profile records
the longest prompt that meets the TTFT target (``V_P * ttft``) and whether the reference prompt
length does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Targets:
    """Latency objectives the knobs must meet (seconds)."""

    ttft_s: float = 2.0
    itl_s: float = 0.1

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.itl_s > 0):
            raise ValueError(f"TTFT/ITL targets must be positive, got {self.ttft_s}, {self.itl_s}")


@dataclass(frozen=True)
class SchedulerChoice:
    max_num_seqs: int
    max_num_batched_tokens: int
    chunk_tokens: int
    prefill_tokens_per_s: float  # V_P at the chosen chunk
    decode_context: int
    decode_step_s: float  # predicted decode step at max_num_seqs
    decode_tokens_per_s: float  # max_num_seqs / decode_step_s: the decode capacity
    max_prompt_tokens_within_ttft: int
    itl_met: bool
    ttft_met: bool
    reason: str


def fit_line(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``t = a + c*b`` over (batch, seconds); slope >= 0, intercept > 0."""
    if not points:
        raise ValueError("no decode measurements")
    if len({b for b, _ in points}) < 2:
        return max(sum(t for _, t in points) / len(points), 1e-9), 0.0
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mt = sum(t for _, t in points) / n
    var = sum((b - mb) ** 2 for b, _ in points)
    slope = max(sum((b - mb) * (t - mt) for b, t in points) / var, 0.0)
    return max(mt - slope * mb, 1e-9), slope


def _round_batch(b: int) -> int:
    return b if b <= 8 else b - b % 8


def choose_scheduler(
    prefill: Sequence[dict],
    decode: Sequence[dict],
    *,
    kv_capacity_tokens: int,
    targets: Targets,
    prompt_tokens: int,
) -> SchedulerChoice:
    """``prefill``: [{chunk_tokens, step_s}], ``decode``: [{batch, context, step_s}]."""
    if not prefill or not decode:
        raise ValueError("need at least one prefill and one decode measurement")
    context = max(int(p["context"]) for p in decode)
    a, c = fit_line(
        [(int(p["batch"]), float(p["step_s"])) for p in decode if p["context"] == context]
    )
    measured_max = max(int(p["batch"]) for p in decode)
    cap = max(1, min(kv_capacity_tokens // max(context, 1), 4 * measured_max, 1024))
    chunks = sorted((int(p["chunk_tokens"]), float(p["step_s"])) for p in prefill)
    best_vp = max(chunks, key=lambda x: (x[0] / x[1], x[0]))
    itl = targets.itl_s
    by_itl = int((itl - a) / c + 1e-9) if c > 0 else cap
    batch = _round_batch(max(1, min(by_itl, cap)))
    fits = [(ch, t) for ch, t in chunks if t + c * batch <= itl]
    if a <= itl and not fits:  # fewer decodes per step make room for the smallest chunk
        smaller = int((itl - chunks[0][1]) / c + 1e-9) if c > 0 else 0
        if smaller >= 1:
            batch = _round_batch(smaller)
            fits = [chunks[0]]
    if a <= itl and fits:
        (chunk, t_chunk), itl_met = max(fits, key=lambda x: (x[0] / x[1], x[0])), True
        reason = "max_num_seqs " + ("by the ITL target" if batch < cap else "by KV/limit")
    else:  # no setting meets the ITL target here: serve for throughput and say so
        (chunk, t_chunk), itl_met, batch = best_vp, False, _round_batch(cap)
        reason = (
            f"ITL target {itl * 1e3:.0f} ms unreachable on this node (decode step "
            f"{a * 1e3:.1f} ms + {c * 1e3:.2f} ms/seq, chunk {chunks[0][1] * 1e3:.1f} ms): "
            "knobs maximise throughput"
        )
    v_p = chunk / t_chunk
    within_ttft = int(v_p * targets.ttft_s)
    step = a + c * batch
    return SchedulerChoice(
        max_num_seqs=batch,
        max_num_batched_tokens=chunk + batch,
        chunk_tokens=chunk,
        prefill_tokens_per_s=round(v_p, 1),
        decode_context=context,
        decode_step_s=round(step, 6),
        decode_tokens_per_s=round(batch / step, 1),
        max_prompt_tokens_within_ttft=within_ttft,
        itl_met=itl_met,
        ttft_met=prompt_tokens <= within_ttft,
        reason=reason,
    )

"""The summary table `pagoda tune` prints at the end (plain text, fixed-width columns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _table(title: str, header: list[str], rows: list[list[Any]]) -> list[str]:
    if not rows:
        return []
    cells = [header, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return ["", title, fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [
        fmt.format(*r) for r in cells[1:]
    ]


def summary_table(profile: dict[str, Any], directory: Path) -> str:
    """What was measured and chosen, in a few small tables."""
    lines = [
        f"tuned profile: {directory}",
        f"device {profile['device']} | model {profile['model']} | dtype {profile['dtype']} | "
        f"max_model_len {profile['max_model_len']} | {profile.get('time_spent_s', 0):.1f} s spent"
        + ("" if profile.get("complete") else " | INCOMPLETE: rerun to resume"),
    ]
    lines += _engine_tables(profile.get("engine") or {})
    lines += _kernel_table(profile.get("kernels") or {})
    lines += _chosen_table(profile)
    return "\n".join(lines)


def _engine_tables(engine: dict[str, Any]) -> list[str]:
    """The prefill and decode step measurements."""
    lines = _table(
        "prefill (one step)",
        ["chunk tokens", "step ms", "V_P tok/s"],
        [
            [p["chunk_tokens"], f"{p['step_s'] * 1e3:.1f}", f"{p['tokens_per_s']:.0f}"]
            for p in engine.get("prefill", [])
        ],
    )
    return lines + _table(
        "decode (one step)",
        ["batch", "context", "step ms", "tok/s"],
        [
            [p["batch"], p["context"], f"{p['step_s'] * 1e3:.1f}", f"{p['tokens_per_s']:.0f}"]
            for p in engine.get("decode", [])
        ],
    )


def _kernel_table(kernels: dict[str, Any]) -> list[str]:
    """Each tuned kernel bucket against its pre-tuning config, or why the stage was skipped."""
    lines = _table(
        "kernels (median ms; baseline = config before tuning)",
        ["kernel", "shape", "best", "baseline", "speedup", "rejected"],
        [
            [
                b["kernel"],
                ",".join(f"{k}={v}" for k, v in b["shape"].items()),
                b["median_ms"],
                b["default_ms"],
                b["speedup"],
                f"{len(b['rejected'])}/{b['candidates']}",
            ]
            for b in kernels.get("buckets", [])
        ],
    )
    if kernels.get("status") == "skipped":
        lines += ["", f"kernels: {kernels.get('note')}"]
    return lines


def _chosen_table(profile: dict[str, Any]) -> list[str]:
    """The scheduler knobs chosen and the capacity they give, once enough points are measured."""
    sched, cap = profile.get("scheduler"), profile.get("capacity")
    if not (sched and cap):
        return ["", "no scheduler knobs chosen yet (not enough points measured): rerun to resume"]
    targets = profile["targets"]
    met = f"ITL {'yes' if sched['itl_met'] else 'no'}, TTFT {'yes' if sched['ttft_met'] else 'no'}"
    return _table(
        f"chosen (TTFT target {targets['ttft_s']} s, ITL target {targets['itl_s']} s)",
        ["max_num_seqs", "max_num_batched_tokens", "V_P tok/s", "decode tok/s", "KV tokens", "met"],
        [
            [
                sched["max_num_seqs"],
                sched["max_num_batched_tokens"],
                cap["prefill_tokens_per_s"],
                cap["decode_tokens_per_s"],
                cap["kv_capacity_tokens"],
                met,
            ]
        ],
    )

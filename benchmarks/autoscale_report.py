"""autoscale_sim.py's output: the table, the verdicts against the targets, the plot, the JSON.

`rows` is what autoscale_sim.evaluate returns: per traffic shape, Pagoda's result, the baselines'
best (`best`) and the cheapest within 5 % of minutes over (`ref`, None if none), the table's
(label, result) rows, and the runs the plot draws (`pagoda`, `plot_ref`).
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
from autoscale_engine import Capacity
from autoscale_run import requests_for
from autoscale_traffic import SHAPES, Shape


def table(rows: dict[str, dict]) -> str:
    out = [
        "| traffic | autoscaler | setting | minutes over SLO | replica-hours | scale events |",
        "|---|---|---|---|---|---|",
    ]
    for shape_name, d in rows.items():
        for label, r in d["rows"]:
            out.append(
                f"| {shape_name} | {label} | {r.setting} | {r.violation_pct:.1f} % "
                f"| {r.replica_hours:.1f} | {r.scale_events} |"
            )
    return "\n".join(out)


def work_bound(shape: Shape, cap: Capacity) -> float:
    """Replica-hours if every replica were busy all the time (no autoscaler can spend less)."""
    reqs = requests_for(shape.name, cap)
    keep = reqs.arrival < shape.duration_s
    step = float(cap.step_table()[cap.slots])
    work = reqs.prompt[keep] / cap.prefill_tokens_per_s + reqs.output[keep] * step / cap.slots
    return float(work.sum()) / 3600


def verdicts(rows: dict[str, dict], cap: Capacity) -> str:
    lines = []
    for shape_name, d in rows.items():
        p, ref, all_best = d["pagoda"], d["ref"], d["best"]
        lines.append(
            f"* {shape_name}: all replicas busy all the time would take "
            f"{work_bound(SHAPES[shape_name], cap):.1f} replica-hours"
        )
        if ref is not None:
            ratio = p.replica_hours / ref.replica_hours
            lines.append(
                f"* {shape_name}: Pagoda {p.violation_pct:.1f} % over, {p.replica_hours:.1f} "
                f"replica-hours = {ratio:.2f}x the cheapest baseline within 5 % ({ref.family}, "
                f"{ref.replica_hours:.1f}); targets ≤ 1 % and ≤ 0.80x: "
                f"{'met' if p.violation_pct <= 1.0 and ratio <= 0.8 else 'NOT met'}"
            )
        else:
            fewest = min(r.violation_pct for r in all_best)
            lines.append(
                f"* {shape_name}: no baseline within 5 %; Pagoda {p.violation_pct:.1f} % over vs "
                f"the best baseline's {fewest:.1f} %: "
                f"{'met' if p.violation_pct < fewest and p.violation_pct <= 1.0 else 'NOT met'}"
            )
    return "\n".join(lines)


def plot(rows: dict[str, dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, axes = plt.subplots(
        2, len(names), figsize=(4.2 * len(names), 6.2), sharex="col", squeeze=False
    )
    for col, name in enumerate(names):
        top, bottom = axes[0][col], axes[1][col]
        shape = SHAPES[name]
        for r, color in ((rows[name]["pagoda"], "C0"), (rows[name]["plot_ref"], "C3")):
            top.step(r.times_h, r.replicas, where="post", lw=1.0, color=color, label=r.family)
            minutes = [(i + 0.5) / 60 for i in range(len(r.minute_p95))]
            bottom.plot(minutes, np.minimum(r.minute_p95, 1e3), lw=0.8, color=color)
        bottom.axhline(shape.target_ttft_s, color="black", ls="--", lw=0.8, label="SLO")
        bottom.set_yscale("log")
        top.set_title(name)
        top.legend(fontsize=6, loc="upper right")
        bottom.set_xlabel("hours")
    axes[0][0].set_ylabel("replicas")
    axes[1][0].set_ylabel("p95 TTFT of each minute's arrivals, s")
    axes[1][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def json_doc(rows: dict[str, dict]) -> dict:
    """The table's numbers (`--json`): per shape, each row's autoscaler label and summary."""
    return {
        name: [{"autoscaler": lab, **{k: v for k, v in dataclasses.asdict(r).items()
                                      if k not in ("times_h", "replicas", "minute_p95")}}
               for lab, r in d["rows"]]
        for name, d in rows.items()
    }  # fmt: skip

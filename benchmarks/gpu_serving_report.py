"""gpu_serving.py's figures: each run's summary of its request records, its table row, and the
streaming/non-streaming throughput ratios (medians of the rounds) beside the offline engine's."""

from __future__ import annotations

import math
import statistics


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def summarize(records: list[dict]) -> dict:
    ok = [r for r in records if r["error"] is None and r["ttft"] is not None]
    wall = max(r["end"] for r in records) - min(r["start"] for r in records)
    tokens = sum(r["tokens"] for r in ok)
    tpot = [(r["end"] - r["start"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    gaps = [g for r in ok for g in r["gaps"]]
    row = {"requests": len(records), "errors": len(records) - len(ok), "seconds": wall,
           "tokens": tokens, "tok_s": tokens / wall if wall > 0 else 0.0,
           "events_per_token": (sum(len(r["gaps"]) + 1 for r in ok) / tokens) if tokens else 0.0,
           "error_kinds": sorted({r["error"] or "no text" for r in records if r not in ok})[:3]}  # fmt: skip
    for q in (50, 90, 99):
        row[f"ttft_p{q}"] = pct([r["ttft"] for r in ok], q)
        row[f"itl_p{q}"] = pct(gaps, q)
        row[f"tpot_p{q}"] = pct(tpot, q)
    return row


def fmt_row(r: dict) -> list[str]:
    ttft = "/".join(f"{r[f'ttft_p{q}']:.2f}" for q in (50, 90, 99))
    itl = "/".join(f"{1e3 * r[f'itl_p{q}']:.1f}" for q in (50, 90, 99)) if r["stream"] else "-"
    tpot = "/".join(f"{1e3 * r[f'tpot_p{q}']:.1f}" for q in (50, 99)) if r["stream"] else "-"
    events = f"{r['events_per_token']:.2f}" if r["stream"] else "-"
    return [r["server"], r["workload"], "yes" if r["stream"] else "no", r["round"],
            r["requests"], r["errors"], f"{r['tok_s']:.1f}", ttft, itl, tpot, events,
            f"{r['cpu_ms_per_token']:.2f}", f"{r['api_cpu_us_per_token']:.0f}",
            f"{r['client_cpu_us_per_token']:.0f}"]  # fmt: skip


HEADERS = ["server", "workload", "stream", "round", "req", "err", "out tok/s",
           "TTFT p50/p90/p99 (s)", "ITL p50/p90/p99 (ms)", "TPOT p50/p99 (ms)",
           "events/token", "server CPU ms/token", "API process CPU µs/token",
           "client CPU µs/token"]  # fmt: skip


def _median(rows: list[dict], key: str, where: tuple) -> float:
    """The median of `key` over the rounds of one (server, workload, stream)."""
    vals = [r[key] for r in rows if (r["server"], r["workload"], r["stream"]) == where]
    return statistics.median(vals) if vals else float("nan")


def ratios(rows: list[dict], offline: float | None) -> list[str]:
    """Streaming over non-streaming throughput per server and workload (medians of the
    rounds), and each against the offline engine."""
    lines = []
    for server in dict.fromkeys(r["server"] for r in rows):
        for wl in dict.fromkeys(r["workload"] for r in rows):
            med, cpu, api, client = (
                {st: _median(rows, key, (server, wl, st)) for st in (False, True)}
                for key in ("tok_s", "cpu_ms_per_token", "api_cpu_us_per_token",
                            "client_cpu_us_per_token")
            )  # fmt: skip
            line = (
                f"{server} {wl}: streaming {med[True]:.1f} / non-streaming {med[False]:.1f} "
                f"tok/s = {med[True] / med[False]:.2f}x (server CPU {cpu[True]:.2f} / "
                f"{cpu[False]:.2f} ms per token, API process {api[True]:.1f} / "
                f"{api[False]:.1f} µs, clients {client[True]:.0f} / {client[False]:.0f} µs)"
            )
            if offline and wl == "nano":
                line += (
                    f"; offline engine {offline:.1f} tok/s (streaming {med[True] / offline:.2f}x, "
                    f"non-streaming {med[False] / offline:.2f}x of it)"
                )
            lines.append(line)
    return lines

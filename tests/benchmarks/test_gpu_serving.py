"""benchmarks/gpu_serving.py: its pieces (gpu_serving_load.py, gpu_serving_report.py), and a
smoke run with --tiny on CPU (a real `pagoda serve` on a tiny random model, both workloads
streaming and not, the offline engine beside)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_serving
import gpu_serving_load as load
import gpu_serving_report as report


def test_nano_requests_are_gpu_throughputs_draw():
    """The HTTP runs and the offline engine get the same requests as gpu_throughput.py."""
    import gpu_throughput

    assert load.nano_requests(8, 8, 32, 512, 3) == gpu_throughput.workload(8, 8, 32, 512, 3)


def test_chat_requests_fit_the_context():
    """System prompt shared, prompt within max_len (before the template), reply within half."""
    for max_len in (24, 128, 1024):
        reqs = load.chat_requests(50, max_len, load.word_text(512), seed=1)
        systems = {msgs[0]["content"] for msgs, _ in reqs}
        assert len(systems) == 1
        system = len(reqs[0][0][0]["content"].split())
        assert system == min(64, max_len // 4)
        for msgs, out in reqs:
            user = len(msgs[1]["content"].split())
            assert system + user <= max(max_len - 32, system + min(16, max_len // 4))
            assert 1 <= out <= max(max_len // 2, 16)


def test_bodies_ask_usage_when_streaming():
    reqs = [([1, 2, 3], 5)]
    plain, streamed = (json.loads(load.bodies("nano", reqs, s, "m")[0]) for s in (0, 1))
    assert plain["prompt"] == [1, 2, 3] and plain["max_tokens"] == 5 and plain["ignore_eos"]
    assert "stream_options" not in plain and not plain["stream"]
    assert streamed["stream"] and streamed["stream_options"] == {"include_usage": True}
    chat = json.loads(load.bodies("chat", [([{"role": "user", "content": "hi"}], 4)], 1, "m")[0])
    assert chat["messages"][0]["content"] == "hi" and "prompt" not in chat


def test_summary_counts_errors_and_percentiles():
    rng = random.Random(0)
    recs = [
        {"start": 0.0, "end": 2.0, "ttft": 0.5, "gaps": [0.1] * 9, "tokens": 10, "error": None}
        for _ in range(4)
    ]
    recs.append(
        {"start": 0.0, "end": 4.0, "ttft": None, "gaps": [], "tokens": 0, "error": "HTTP 503"}
    )
    rng.shuffle(recs)
    row = report.summarize(recs)
    assert row["requests"] == 5 and row["errors"] == 1 and row["tokens"] == 40
    assert row["tok_s"] == pytest.approx(10.0)  # 40 tokens over the 4 s the run lasted
    assert row["ttft_p99"] == 0.5 and row["itl_p50"] == pytest.approx(0.1)
    assert row["tpot_p50"] == pytest.approx(1.5 / 9) and row["events_per_token"] == 1.0
    assert row["error_kinds"] == ["HTTP 503"]


@pytest.mark.timeout(240)
def test_tiny_run_streams_and_not_beside_the_offline_engine(capsys, tmp_path):
    out = tmp_path / "result.json"
    res = gpu_serving.main(["--tiny", "--json", str(out)])
    rows = res["rows"]
    assert {(r["workload"], r["stream"]) for r in rows} == {
        (w, s) for w in ("nano", "chat") for s in (False, True)
    }
    nano = load.nano_requests(6, 8, 24, 512, 0)
    for r in rows:
        assert r["errors"] == 0 and r["requests"] == 6 and r["tok_s"] > 0
        if r["workload"] == "nano":  # ignore_eos: every requested token is generated
            assert r["tokens"] == sum(n for _, n in nano)
        assert r["ttft_p50"] > 0 and r["cpu_ms_per_token"] >= 0
        assert 0 <= r["api_cpu_us_per_token"] <= 1e3 * r["cpu_ms_per_token"] + 1e-9
        assert r["client_cpu_us_per_token"] > 0  # the clients parsed what they got
        if r["stream"]:
            # NaN when coalescing left every stream one event (no gap to measure)
            assert not r["itl_p50"] < 0 and 0 < r["events_per_token"] <= 1
    assert res["offline"]["output_tokens"] == sum(n for _, n in nano)
    assert res["ready_s"]["default"] > 0
    assert json.loads(out.read_text())["rows"][0]["server"] == "default"
    text = capsys.readouterr().out
    assert "machine: " in text and "offline engine, nano" in text
    assert "default nano: streaming" in text and "ready " in text

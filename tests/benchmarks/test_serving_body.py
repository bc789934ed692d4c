"""benchmarks/serving.py's request bodies: every system generates exactly `out_len` tokens,
greedy by default; with a temperature every system draws from the whole vocabulary (llama.cpp's
default top-k / top-p / min-p filters turned off, Pagoda has none by default)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import serving


def test_greedy_bodies_for_each_system():
    for system in ("pagoda", "llama-server"):
        body = serving.request_body(system, "hi", 8, [2])
        assert body["temperature"] == 0.0 and body["ignore_eos"] and body["max_tokens"] == 8
        assert "top_k" not in body
    body = serving.request_body("llama-cpp-python", "hi", 8, [2])
    assert body["logit_bias"] == {"2": -100.0} and "ignore_eos" not in body


def test_sampled_bodies_turn_llama_cpp_filters_off():
    body = serving.request_body("llama-server", "hi", 8, [2], temperature=0.7)
    assert body["temperature"] == 0.7
    assert (body["top_k"], body["top_p"], body["min_p"]) == (0, 1.0, 0.0)
    body = serving.request_body("pagoda", "hi", 8, [2], temperature=0.7)
    assert body["temperature"] == 0.7 and "top_k" not in body and "min_p" not in body


def test_top_p_is_the_same_filter_for_each_system():
    for system in ("pagoda", "llama-server"):
        body = serving.request_body(system, "hi", 8, [2], temperature=0.7, top_p=0.9)
        assert body["top_p"] == 0.9 and body["temperature"] == 0.7
    body = serving.request_body("llama-server", "hi", 8, [2], temperature=0.7, top_p=0.9)
    assert (body["top_k"], body["min_p"]) == (0, 0.0)  # llama.cpp's other filters off
    assert "top_p" not in serving.request_body("pagoda", "hi", 8, [2], top_p=0.9)  # greedy
    with pytest.raises(SystemExit):
        serving.parse_args(["--top-p", "0"])

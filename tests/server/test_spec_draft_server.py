"""`pagoda serve --speculative-config` with a draft model (`spec/draft_model.py`): the flags go
through the CLI's parser and its checks before loading (`launch.preflight`), then the engine
serves behind the real app in this process (`pooling_serve_testlib.serve`, no server process):
a tiny transformers-written Llama drafting for itself answers with transformers' greedy tokens,
every draft accepted (the counters on /metrics), and a seeded sampled request's drafts, drawn
from the same distribution, kept (its text the same twice); a draft of another vocabulary is
refused before anything loads."""

from __future__ import annotations

import asyncio
import json

import pytest
from hf_oracle import hf_greedy_plain, make_tiny_llama
from pagoda.runtime import options
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.server.cli import build_parser, server_config
from pagoda.runtime.server.launch import preflight
from pooling_serve_testlib import NAME, serve
from server_testlib import TINY_SERVE

PROMPT = [1, 17, 93, 250, 41, 8, 77, 120, 5]


def _preflight(target, spec: dict) -> EngineConfig:
    """`pagoda serve`'s engine config for these flags (a ValueError there is one line and exit
    2 at the CLI)."""
    args = build_parser().parse_args(["--model", str(target), *TINY_SERVE,
                                      "--speculative-config", json.dumps(spec)])  # fmt: skip
    return preflight(server_config(args), options.engine_kwargs(vars(args)), None)[0]


def test_serve_with_a_draft_model_answers_the_target_s_greedy_tokens(tmp_path):
    from pagoda.runtime.engine.core import EngineCore

    model = make_tiny_llama(tmp_path)
    want, _ = hf_greedy_plain(model, PROMPT, 12)
    spec = {"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3}
    core = EngineCore(_preflight(tmp_path, spec))

    async def complete(client, http):
        return await client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12,
                                               temperature=0, extra_body={"ignore_eos": True})  # fmt: skip

    async def metrics(client, http):
        return (await http.get("http://t/metrics")).text

    async def sampled(client, http):  # drafts drawn from q = p: all kept, the same run twice
        texts = []
        for _ in range(2):
            r = await client.completions.create(model=NAME, prompt=PROMPT, max_tokens=12,
                                                temperature=0.8, seed=3,
                                                extra_body={"ignore_eos": True})  # fmt: skip
            texts.append(r.choices[0].text)
        return texts

    (got, text, again), _ = asyncio.run(serve(core, [complete, metrics, sampled]))
    assert got.choices[0].text.split() == [f"w{i}" for i in want]
    assert again[0] == again[1] and len(again[0].split()) == 12
    assert core.spec_stats.acceptance_rate > 0.95
    counts = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("pagoda:spec_decode_num_")}  # fmt: skip
    drafted = counts["pagoda:spec_decode_num_draft_tokens_total"]
    assert drafted > 0 and counts["pagoda:spec_decode_num_accepted_tokens_total"] == drafted


def test_a_draft_of_another_vocabulary_is_refused_before_loading(tmp_path):
    """`pagoda serve`'s checks before it loads anything read the draft's config too."""
    target, draft = tmp_path / "t", tmp_path / "d"
    make_tiny_llama(target)
    make_tiny_llama(draft, vocab_size=200)
    with pytest.raises(ValueError, match="vocabulary of 200 tokens, the target 300"):
        _preflight(target, {"model": str(draft), "num_speculative_tokens": 2})

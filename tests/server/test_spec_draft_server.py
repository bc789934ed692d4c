"""`pagoda serve --speculative-config` with a draft model (`spec/draft_model.py`): a tiny
transformers-written Llama drafting for itself answers with transformers' greedy tokens, every
draft accepted (the counters on /metrics); a draft of another vocabulary is refused before
anything loads."""

from __future__ import annotations

import json

import httpx
import pytest
from hf_oracle import hf_greedy_plain, make_tiny_llama
from server_testlib import TINY_SERVE, openai_client

PROMPT = [1, 17, 93, 250, 41, 8, 77, 120, 5]


@pytest.mark.slow
@pytest.mark.e2e
def test_serve_with_a_draft_model_answers_the_target_s_greedy_tokens(tmp_path):
    model = make_tiny_llama(tmp_path)
    want, _ = hf_greedy_plain(model, PROMPT, 12)
    spec = {"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3}
    args = ("--model", str(tmp_path), *TINY_SERVE, "--speculative-config", json.dumps(spec))
    with openai_client(*args) as client:
        got = client.completions.create(model=client.models.list().data[0].id, prompt=PROMPT,
                                        max_tokens=12, temperature=0,
                                        extra_body={"ignore_eos": True})  # fmt: skip
        metrics = httpx.get(str(client.base_url).removesuffix("/v1/") + "/metrics").text
    assert got.choices[0].text.split() == [f"w{i}" for i in want]
    counts = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line.startswith("pagoda:spec_decode_num_")}  # fmt: skip
    drafted = counts["pagoda:spec_decode_num_draft_tokens_total"]
    assert drafted > 0 and counts["pagoda:spec_decode_num_accepted_tokens_total"] == drafted


def test_a_draft_of_another_vocabulary_is_refused_before_loading(tmp_path):
    """`pagoda serve`'s checks before it loads anything (`launch.preflight`; a ValueError there
    is one line and exit 2) read the draft's config too."""
    from pagoda.runtime import options
    from pagoda.runtime.server.cli import build_parser, server_config
    from pagoda.runtime.server.launch import preflight

    target, draft = tmp_path / "t", tmp_path / "d"
    make_tiny_llama(target)
    make_tiny_llama(draft, vocab_size=200)
    spec = json.dumps({"model": str(draft), "num_speculative_tokens": 2})
    args = build_parser().parse_args(["--model", str(target), *TINY_SERVE,
                                      "--speculative-config", spec])  # fmt: skip
    with pytest.raises(ValueError, match="vocabulary of 200 tokens, the target 300"):
        preflight(server_config(args), options.engine_kwargs(vars(args)), None)

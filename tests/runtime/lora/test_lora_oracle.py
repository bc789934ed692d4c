"""Multi-LoRA against peft: a mixed batch (base + two adapters, unequal prompts, chunked
prefill) gives peft's greedy tokens and logits; the prefix cache keys blocks by adapter; the
scheduler keeps --max-loras adapters in a batch; bad adapters are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_oracle import hf_greedy_plain
from lora_testlib import ADAPTERS, make_adapter, make_base
from pagoda.runtime import LLM, LoRARequest, SamplingParams
from pagoda.runtime.lora.adapter import check_adapters
from pagoda.runtime.lora.config import LoRAConfig
from pagoda.runtime.model.loader import read_model_config

STEPS = 6
PROMPTS = [[5, 17, 42, 9, 88, 3, 61, 27, 14, 200, 7, 33, 71, 150, 12, 19, 45, 8],
           [11, 4, 99, 23, 57], [5, 17, 42, 9, 88, 3, 61, 27, 14, 200, 7, 33, 71, 150],
           [120, 6, 31, 250, 77, 2 + 40, 18, 64, 9, 3, 101]]  # fmt: skip


@pytest.fixture(scope="module", params=["Llama", "Qwen3"])
def ckpt(request, tmp_path_factory):
    """(base dir, {name: (LoRARequest, peft model)}, transformers base) for one family."""
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    base = make_base(root / "base", request.param)
    adapters = {}
    for i, (name, r, alpha, targets, rslora) in enumerate(ADAPTERS):
        peft_model = make_adapter(base, root / name, r, alpha, targets, rslora, seed=i)
        adapters[name] = (LoRARequest(name, i + 1, str(root / name)), peft_model)
    return root / "base", adapters, base


def _llm(path, **kw):
    args = dict(dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8,
                kv_cache_memory=4 << 20, max_num_batched_tokens=16, max_num_seqs=4,
                long_prefill_token_threshold=8, block_size=8)  # fmt: skip
    return LLM(str(path), **(args | kw))


def _reference(model, prompt):
    return hf_greedy_plain(model, prompt, STEPS)


def test_mixed_batch_matches_peft(ckpt):
    path, adapters, base = ckpt
    llm = _llm(path)
    logits: dict[str, list[torch.Tensor]] = {}
    llm.engine.runner.logits_hook = lambda reqs, rows: [
        logits.setdefault(r.request_id, []).append(row.float().clone())
        for r, row in zip(reqs, rows)
    ]
    which = [None, "a1", "a2", "a1"]  # prompts 0 and 2 share a prefix: base vs a2
    loras = [None if w is None else adapters[w][0] for w in which]
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True),
                        use_tqdm=False, lora_request=loras)  # fmt: skip
    differs = 0
    for out, prompt, w in zip(outs, PROMPTS, which):
        model = base if w is None else adapters[w][1]
        tokens, ref_logits = _reference(model, prompt)
        assert out.outputs[0].token_ids == tokens, (w, prompt)
        got = torch.stack(logits[out.request_id])
        torch.testing.assert_close(got, torch.stack(ref_logits), atol=1e-3, rtol=1e-3)
        if w is not None:
            differs += tokens != _reference(base, prompt)[0]
    assert differs >= 2  # the adapters change greedy picks: the test can tell them apart


def test_prefix_cache_keyed_by_adapter(ckpt):
    path, adapters, _ = ckpt
    llm = _llm(path, max_num_batched_tokens=64, long_prefill_token_threshold=0)
    p = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    prompt = PROMPTS[0]  # 18 tokens: two full blocks of 8
    a1, a2 = adapters["a1"][0], adapters["a2"][0]
    kv = llm.engine.kv
    runs = [(a1, 0), (a2, 0), (None, 0), (a1, 16), (None, 16), (a2, 16)]  # (adapter, hit)
    outs = {}
    for lora, hit in runs:
        before = kv.prefix_hits
        (out,) = llm.generate([prompt], p, use_tqdm=False, lora_request=lora)
        assert kv.prefix_hits - before == hit, lora
        name = None if lora is None else lora.lora_name
        assert outs.setdefault(name, out.outputs[0].token_ids) == out.outputs[0].token_ids


def test_max_loras_limits_the_batch(ckpt):
    path, adapters, _ = ckpt
    llm = _llm(path, max_loras=1, max_cpu_loras=1)
    core, p = llm.engine, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    order = ["a1", "a2", None, "a1", "a2"]
    for i, w in enumerate(order):
        q = p.clone()
        q.lora_request = None if w is None else adapters[w][0]
        core.add_request(f"r{i}", PROMPTS[i % len(PROMPTS)], q)
    seen, tokens = set(), {}
    while core.has_unfinished_requests():
        for out in core.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        running = {r.params.lora_request.lora_int_id for r in core.scheduler.running
                   if r.params.lora_request is not None}  # fmt: skip
        assert len(running) <= 1
        seen |= running
    assert seen == {1, 2} and len(tokens) == len(order)
    # the same tokens as when the adapters share a batch (the slot and host LRU swapped them)
    ref = _llm(path).generate(
        [PROMPTS[i % len(PROMPTS)] for i in range(len(order))], p, use_tqdm=False,
        lora_request=[None if w is None else adapters[w][0] for w in order],
    )  # fmt: skip
    assert [tokens[f"r{i}"] for i in range(len(order))] == [o.outputs[0].token_ids for o in ref]


def _edit(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "adapter_config.json").read_text())
    (dst / "adapter_config.json").write_text(json.dumps(cfg | changes))
    return dst


def test_bad_adapters_refused(ckpt, tmp_path):
    path, adapters, _ = ckpt
    src = adapters["a1"][0].lora_path

    cases = [
        (LoRARequest("none", 9, str(tmp_path / "missing")), "not a LoRA adapter directory"),
        (LoRARequest("big", 9, str(Path(src))), "more than --max-lora-rank 4"),
        (LoRARequest("head", 9, str(_edit(Path(src), tmp_path / "h", target_modules=["lm_head"]))),
         "lm_head cannot take an adapter"),
        (LoRARequest("save", 9, str(_edit(Path(src), tmp_path / "s", modules_to_save=["lm_head"]))),
         "modules_to_save"),
    ]  # fmt: skip
    llm = _llm(path, max_lora_rank=4)
    p = SamplingParams(temperature=0, max_tokens=2)
    for lora, words in cases:
        with pytest.raises(ValueError, match=words):
            llm.generate([PROMPTS[1]], p, use_tqdm=False, lora_request=lora)
    (ok,) = llm.generate([PROMPTS[1]], p, use_tqdm=False)  # the engine unharmed
    assert len(ok.outputs[0].token_ids) == 2
    with pytest.raises(ValueError, match="more than --max-lora-rank"):  # at start: --lora-modules
        _llm(path, max_lora_rank=4, lora_modules=[f"a1={src}"])
    # `pagoda serve`'s preflight (one line, exit 2): the same check before the engine loads
    config = LoRAConfig(max_lora_rank=4, lora_modules=(f"a1={src}",))
    with pytest.raises(ValueError, match=r"^--lora-modules a1: .* more than --max-lora-rank 4$"):
        check_adapters(config, read_model_config(str(path)))

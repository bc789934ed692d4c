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
from pagoda.runtime.lora_config import LoRAConfig
from pagoda.runtime.model.loader import read_model_config

STEPS = 6
PROMPTS = [[5, 17, 42, 9, 88, 3, 61, 27, 14, 200, 7, 33, 71, 150, 12, 19, 45, 8],
           [11, 4, 99, 23, 57], [5, 17, 42, 9, 88, 3, 61, 27, 14, 200, 7, 33, 71, 150],
           [120, 6, 31, 250, 77, 2 + 40, 18, 64, 9, 3, 101]]  # fmt: skip


_BUILT: dict[str, tuple] = {}


def _build(arch: str, tmp_path_factory) -> tuple:
    """(base dir, {name: (LoRARequest, peft model)}, transformers base) of `arch`, built once."""
    if arch not in _BUILT:
        root = tmp_path_factory.mktemp(f"lora-{arch}")
        base = make_base(root / "base", arch)
        adapters = {}
        for i, (name, r, alpha, targets, rslora) in enumerate(ADAPTERS):
            peft_model = make_adapter(base, root / name, r, alpha, targets, rslora, seed=i)
            adapters[name] = (LoRARequest(name, i + 1, str(root / name)), peft_model)
        _BUILT[arch] = (root / "base", adapters, base)
    return _BUILT[arch]


@pytest.fixture(scope="module", params=["Llama", "Qwen2", "Qwen3"])
def family(request, tmp_path_factory):
    """Each family the engine takes adapters for (mistral runs Llama's classes)."""
    return _build(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Llama's: what does not depend on the family (cache keys, scheduling, refusals)."""
    return _build("Llama", tmp_path_factory)


def _llm(path, **kw):
    args = dict(dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8,
                kv_cache_memory=4 << 20, max_num_batched_tokens=16, max_num_seqs=4,
                long_prefill_token_threshold=8, block_size=8)  # fmt: skip
    return LLM(str(path), **(args | kw))


def _reference(model, prompt):
    return hf_greedy_plain(model, prompt, STEPS)


def test_mixed_batch_matches_peft(family):
    path, adapters, base = family
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


def _reshaped(src, dst):
    """An adapter made for a narrower model: one layer's v_proj A of 32 input features."""
    from safetensors.torch import load_file, save_file

    _edit(src, dst)
    tensors = load_file(dst / "adapter_model.safetensors")
    name = "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"
    tensors[name] = tensors[name][:, :32].contiguous()
    save_file(tensors, dst / "adapter_model.safetensors")
    return dst


def test_bad_adapters_refused(ckpt, tmp_path):
    path, adapters, _ = ckpt
    src = adapters["a1"][0].lora_path

    cases = [
        (LoRARequest("none", 9, str(tmp_path / "missing")), "not a LoRA adapter directory"),
        (LoRARequest("big", 9, str(_edit(Path(src), tmp_path / "b", r=16))),
         "more than --max-lora-rank 8"),
        (LoRARequest("head", 9, str(_edit(Path(src), tmp_path / "h", target_modules=["lm_head"]))),
         "lm_head cannot take an adapter"),
        (LoRARequest("save", 9, str(_edit(Path(src), tmp_path / "s", modules_to_save=["lm_head"]))),
         "modules_to_save"),
        (LoRARequest("other", 9, str(_reshaped(Path(src), tmp_path / "o"))),
         r"v_proj.lora_A.weight is \[8, 32\], the base model needs \[8, 64\]"),
    ]  # fmt: skip
    llm = _llm(path, max_lora_rank=8)
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


@pytest.mark.parametrize("mode", ["bgmv", "sgmv"])
def test_gathered_and_grouped_modes_match_peft(ckpt, mode):
    """The two other ways of computing the adapters' product (`lora/layer.py`) give peft's
    tokens on the same mixed batch."""
    path, adapters, base = ckpt
    llm = _llm(path)
    llm.engine.runner.lora.step.mode = mode
    which = [None, "a1", "a2", "a1"]
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True),
                        use_tqdm=False,
                        lora_request=[None if w is None else adapters[w][0] for w in which])  # fmt: skip
    for out, prompt, w in zip(outs, PROMPTS, which):
        model = base if w is None else adapters[w][1]
        assert out.outputs[0].token_ids == _reference(model, prompt)[0], (mode, w)


def test_adapter_rows_are_batch_invariant(ckpt):
    """An adapter's request alone and inside a mixed batch (other adapters, the base, longer
    prompts chunked beside it) gets the same logits, bit for bit (the default dense mode's
    matmuls are the base layers' M-invariant ones)."""
    path, adapters, _ = ckpt
    llm, seen = _llm(path), {}
    llm.engine.runner.logits_hook = lambda reqs, rows: [
        seen.setdefault(r.request_id, []).append(row.clone()) for r, row in zip(reqs, rows)
    ]
    p = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    a1, a2 = adapters["a1"][0], adapters["a2"][0]
    (alone,) = llm.generate([PROMPTS[1]], p, use_tqdm=False, lora_request=a1)
    mixed = llm.generate(PROMPTS, p, use_tqdm=False, lora_request=[a2, a1, None, a2])
    assert mixed[1].outputs[0].token_ids == alone.outputs[0].token_ids
    assert all(map(torch.equal, seen[alone.request_id], seen[mixed[1].request_id]))


def test_two_tensor_parallel_ranks_match_one_rank_and_peft(ckpt, tmp_path):
    """Two ranks (gloo, rank 1 a spawned process; `lora/slots.shards`): the base, a1, a2 and a
    third adapter in one stream of steps give one rank's tokens and peft's. With --max-loras 2
    the third waits, then takes a slot another left: rank 0's load reaches rank 1 with that step
    (its read ahead, `LoRASlots.start_read`, with the first)."""
    from lora_testlib import ALL

    path, adapters, base = ckpt
    a3 = LoRARequest("a3", 3, str(tmp_path / "a3"))
    models = {n: m for n, (_, m) in adapters.items()}
    models["a3"] = make_adapter(base, tmp_path / "a3", 8, 32, ALL, seed=7)
    which = [None, "a1", "a2", "a3"]
    loras = [None if w is None else a3 if w == "a3" else adapters[w][0] for w in which]
    p = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    want = [o.outputs[0].token_ids
            for o in _llm(path).generate(PROMPTS, p, use_tqdm=False, lora_request=loras)]  # fmt: skip
    logits: dict[str, list[torch.Tensor]] = {}
    with _llm(path, tensor_parallel_size=2) as two:
        two.engine.runner.logits_hook = lambda reqs, rows: [
            logits.setdefault(r.request_id, []).append(row.float().clone())
            for r, row in zip(reqs, rows)
        ]
        two.engine.read_lora(a3)  # read ahead (as the server's loop does): on rank 1 too
        outs = two.generate(PROMPTS, p, use_tqdm=False, lora_request=loras)
        slots = two.engine.runner.lora
        assert slots.sends and 3 in slots.slot_of and not slots.free  # a3 took a used slot
    assert [o.outputs[0].token_ids for o in outs] == want
    for out, prompt, w in zip(outs, PROMPTS, which):
        tokens, ref = _reference(base if w is None else models[w], prompt)
        assert out.outputs[0].token_ids == tokens, w
        torch.testing.assert_close(torch.stack(logits[out.request_id]), torch.stack(ref),
                                   atol=1e-3, rtol=1e-3)  # fmt: skip
    assert tokens != _reference(base, PROMPTS[3])[0]  # a3 changes greedy picks

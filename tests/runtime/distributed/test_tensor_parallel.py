"""Tensor parallelism on the CPU (gloo): two ranks give the greedy tokens one rank gives.

Each case is a tiny random checkpoint written by transformers (tests/runtime/arch_cases.py),
served by one engine of two ranks (rank 0 here, rank 1 a spawned process) and by one of a single
rank, in float32, on a KV pool so small that requests are preempted, with prompts chunked into
16-token steps, three prompts sharing steps and a second pass over a warm prefix cache. Tokens
must be equal; logits (gathered from both ranks' vocabulary halves) within 1e-3 of
transformers'. The cases cover biases on the split layers, KV heads split (2 over 2 ranks) and
replicated (1 KV head, 2 ranks), a vocabulary that does not divide (301), Gemma 3's windows and
norms, Phi-3's window on every layer (Mistral's kind), longrope and partial rotary over its
fused q/k/v and gate/up matrices, cut into each rank's rows of every part, Qwen2's window with
its biases, and mixtures of experts (Qwen3-MoE, Mixtral) split by width.
"""

from __future__ import annotations

import pytest
from arch_cases import CASES, NEW, check, generate
from arch_cases import prompts as prompts_
from hf_oracle import check_prompt_logprobs, hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

transformers = pytest.importorskip("transformers")

TP_CASES = {
    **{name: CASES[name] for name in ("llama-biases", "gemma3-window", "qwen3moe-top2-step2")},
    # Qwen2-MoE's shared expert split by width beside its experts, one all-reduce for both
    "qwen2moe-shared-dense1": CASES["qwen2moe-shared-dense1"],
    # OLMo 2's q/k norms over whole rows a rank holds part of (its one KV head replicated)
    "olmo2-kv1": ("Olmo2", dict(num_key_value_heads=1), {}),  # (OLMoE's: the same layer)
    "qwen3-kv1-vocab301": ("Qwen3", dict(head_dim=64, num_key_value_heads=1, vocab_size=301), {}),
    # the other families: Qwen2's biases and window, Mixtral's experts
    **{name: CASES[name] for name in ("mixtral-top2-window",)},
    "qwen2-window": (
        "Qwen2",
        dict(use_sliding_window=True, sliding_window=12, max_window_layers=1),
        {},
    ),
    # Phi-3's fused qkv_proj / gate_up_proj, each rank's rows of each part; a window on every
    # layer (Mistral's: the same Llama decoder, which this case replaced here); longrope past
    # its original context from every prompt's first chunk (the prompts' lengths reach rank 1)
    # and a partial rotary
    "phi3-fused-window-longrope": (
        "Phi3",
        dict(
            sliding_window=11,
            num_hidden_layers=3,
            max_position_embeddings=128,
            original_max_position_embeddings=16,
            partial_rotary_factor=0.75,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + 0.2 * i for i in range(6)],
                "long_factor": [1.5 + 1.5 * i for i in range(6)],
            },
        ),
        {},
    ),
}
POOL = dict(num_blocks_override=7, block_size=16, max_model_len=96, max_num_batched_tokens=16,
            max_num_seqs=3, dtype="float32")  # fmt: skip


@pytest.mark.parametrize("name", TP_CASES)
def test_two_ranks_give_one_ranks_tokens(tmp_path, name):
    arch, overrides, engine_args = TP_CASES[name]
    hf = make_tiny_model(tmp_path, arch, **overrides)
    prompts = prompts_()
    reference = [hf_greedy_plain(hf, p, NEW) for p in prompts]
    loaded = load_model(str(tmp_path))
    one = LLM(str(tmp_path), loaded=loaded, **POOL, **engine_args)
    want = generate(one, prompts) + generate(one, prompts[::-1])[::-1]
    with LLM(str(tmp_path), loaded=loaded, tensor_parallel_size=2, **POOL, **engine_args) as two:
        got = generate(two, prompts)  # cold: chunked, preempted
        got += generate(two, prompts[::-1])[::-1]  # warm: the shared prefix from the cache
        core = two.engine
        assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
        assert core.runner.backend.num_kv_heads == 1  # this rank's: split 2/2 or replicated
        core.check_integrity()
    assert [t for t, _ in got] == [t for t, _ in want]
    for i, g in enumerate(got):
        check(g, reference[i % len(prompts)], f"{name}: prompt {i}, two ranks")


def test_async_scheduling_broadcasts_tokens_still_on_the_device(tmp_path):
    """With async scheduling (the default on CUDA) a decode row's token comes from the step
    still in flight, gathered on rank 0's device and broadcast from there: same tokens."""
    hf = make_tiny_model(tmp_path, "Llama")
    prompts = prompts_()
    reference = [hf_greedy_plain(hf, p, NEW) for p in prompts]
    args = dict(tensor_parallel_size=2, async_scheduling=True, max_num_batched_tokens=16, max_num_seqs=4,
                dtype="float32", kv_cache_memory=16 << 20)  # fmt: skip
    with LLM(str(tmp_path), **args) as two:
        assert two.engine.async_scheduling
        got = generate(two, prompts)
    for i, g in enumerate(got):
        check(g, reference[i], f"async, prompt {i}")


def test_the_other_ranks_leave_when_rank_0_dies(tmp_path):
    """Rank 0 gone without a word (os._exit, as a kill would): its rank exits within seconds
    instead of waiting for the next step forever."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    make_tiny_model(tmp_path, "Llama")
    script = f"""
import os
from pagoda.runtime import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM({str(tmp_path)!r}, tensor_parallel_size=2, dtype="float32", kv_cache_memory=1 << 24)
    print(next(iter(llm.engine.executor.procs.values())).pid, flush=True)
    os._exit(0)
"""
    (tmp_path / "rank0.py").write_text(script)
    out = subprocess.run([sys.executable, "-P", str(tmp_path / "rank0.py")], capture_output=True,
                         text=True, timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        try:  # a zombie (exited, not reaped by its new parent) has left too
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.1)
    assert time.monotonic() < deadline, "rank 1 outlived rank 0"


def test_prompt_logprobs_over_two_ranks(tmp_path):
    """The rows scored for prompt logprobs cross to the other rank with the step (its half of
    the vocabulary is gathered for them too): transformers' scores, chunked and preempted."""
    hf = make_tiny_model(tmp_path, "Llama", vocab_size=301)
    prompts = prompts_()
    params = SamplingParams(temperature=0, max_tokens=NEW, prompt_logprobs=2)
    with LLM(str(tmp_path), tensor_parallel_size=2, **POOL) as two:
        outs = two.generate(prompts, params)
        assert two.engine.scheduler.num_preemptions > 0
    for p, o in zip(prompts, outs):
        check_prompt_logprobs(hf, p, o.prompt_logprobs, k=2)


@pytest.mark.slow
def test_nan_in_one_ranks_shard_is_refused_by_rank_0(tmp_path):
    """A NaN in rows of q_proj that only rank 1 reads: the ranks agree on the first such tensor
    and rank 0 raises the one-line refusal (before: rank 1 died and rank 0 reported a gloo
    connection closed by its peer, a RuntimeError)."""
    from hf_oracle import make_tiny_llama
    from safetensors.torch import load_file, save_file

    make_tiny_llama(tmp_path)
    path, name = str(tmp_path / "model.safetensors"), "model.layers.1.self_attn.q_proj.weight"
    tensors = load_file(path)
    t = tensors[name].clone()
    t[-1, 3] = float("nan")  # the last row: rank 1's half
    save_file({**tensors, name: t}, path)
    with pytest.raises(ValueError, match=rf"checkpoint tensor {name} holds NaN or Inf"):
        LLM(str(tmp_path), tensor_parallel_size=2, dtype="float32", max_model_len=64,
            kv_cache_memory=4 << 20)  # fmt: skip


def test_pooling_over_two_ranks(tmp_path):
    """The pooling runner (`--runner pooling`): the final-norm hidden states are whole on every
    rank after the last all-reduce, so rank 0 pools them as one rank does: transformers'
    MEAN vectors for prompts chunked into 8-token steps."""
    import numpy as np
    from embed_testlib import hf_embeddings, make_embedding_model

    hf = make_embedding_model(tmp_path, "Qwen3", "MEAN")
    prompts = [p[:20] for p in prompts_()]
    want = hf_embeddings(hf, prompts, "MEAN").numpy()
    args = dict(tensor_parallel_size=2, max_num_batched_tokens=8, max_num_seqs=4,
                long_prefill_token_threshold=0, dtype="float32", kv_cache_memory=4 << 20)  # fmt: skip
    with LLM(str(tmp_path), **args) as two:
        assert two.config.runner == "pooling"
        got = np.stack([o.outputs.embedding for o in two.embed(prompts, use_tqdm=False)])
    np.testing.assert_allclose(got, want, atol=1e-4)

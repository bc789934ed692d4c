"""The start-up memory check (`server/memory.py`): what the engine will allocate against what the
machine has, on CPU and (with the device's free memory given) on CUDA, and the cgroup limit."""

from __future__ import annotations

from pathlib import Path

import pytest
from pagoda.runtime.config import EngineConfig, ModelConfig
from pagoda.runtime.server import memory
from pagoda.runtime.spec.draft_model import sampled_bytes

MODEL = ModelConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_layers=16,
                    num_heads=32, num_kv_heads=8, head_dim=64, max_position_embeddings=8192)  # fmt: skip
GIB = 1 << 30


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    with path.open("wb") as fh:
        fh.truncate(2 * GIB)  # sparse: 2 GiB of weights on disk
    return path


@pytest.fixture
def host(monkeypatch):
    def set_free(n: int) -> None:
        monkeypatch.setattr(memory, "host_available", lambda: (n, "MemAvailable"))

    return set_free


def test_cpu_parts_add_up_and_the_largest_is_named(checkpoint, host):
    host(16 * GIB)
    cfg = EngineConfig.create("m", device="cpu", dtype="bfloat16", kv_cache_memory=4 * GIB)
    fp = memory.check(MODEL, cfg, checkpoint)
    per_token = 16 * 2 * 8 * 64 * 2  # layers × K,V × KV heads × head_dim × bf16
    assert fp.kv_blocks == 4 * GIB // (per_token * 16) and fp.weights == 2 * GIB
    assert fp.block_tables == 2 * 64 * ((512 + 1) * 4 + 60)  # two rows per slot
    host(5 * GIB)
    with pytest.raises(ValueError) as err:
        memory.check(MODEL, cfg, checkpoint)
    msg = str(err.value)
    assert msg.startswith("this configuration needs at least 6.") and "5.0 GiB is on this" in msg
    assert msg.index("KV cache 4.0 GiB") < msg.index("weights 2.0 GiB")
    assert msg.endswith("lower --kv-cache-memory")


def test_the_largest_step_is_bounded_by_the_kv_cache(checkpoint, host):
    host(64 * GIB)
    small = EngineConfig.create("m", device="cpu", dtype="bfloat16", kv_cache_memory=64 << 20,
                                max_num_seqs=16384, max_num_batched_tokens=2_000_000)  # fmt: skip
    fp = memory.check(MODEL, small, checkpoint)
    tokens = fp.kv_blocks * 16  # a step never holds more tokens than the cache
    assert fp.activations <= tokens * 4 * (4 * 2048 + 48 * 64 + 3 * 8192) + fp.kv_blocks * 32000 * 8


def test_cuda_uses_the_devices_free_memory(checkpoint, host, monkeypatch):
    host(64 * GIB)
    monkeypatch.setattr(memory, "device_available", lambda device: (20 * GIB, 24 * GIB))
    cfg = EngineConfig.create("m", device="cuda", kv_cache_memory=100 << 40)
    with pytest.raises(ValueError, match=r"--kv-cache-memory 100\.0 TiB is more than the 20\.0 "
                                         r"GiB free on cuda \(24\.0 GiB in all\)"):  # fmt: skip
        memory.check(MODEL, cfg, checkpoint)
    default = memory.check(MODEL, EngineConfig.create("m", device="cuda"), checkpoint)
    budget = int(24 * GIB * 0.9) - 4 * GIB - 2 * GIB - memory.GPU_HEADROOM
    assert default.kv_cache == budget  # what the runner will take after the weights
    monkeypatch.setattr(memory, "device_available", lambda device: (2 * GIB, 24 * GIB))
    with pytest.raises(ValueError, match=r"weights 2\.0 GiB"):
        memory.check(MODEL, EngineConfig.create("m", device="cuda"), checkpoint)
    monkeypatch.setattr(memory, "device_available", lambda device: (3 * GIB, 3 * GIB))
    with pytest.raises(ValueError, match="left for the KV cache after the weights"):
        memory.check(MODEL, EngineConfig.create("m", device="cuda"), checkpoint)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_container_limit_lower_than_memavailable_wins(tmp_path, version):
    proc = tmp_path / "cgroup"
    if version == "v2":
        proc.write_text("0::/pod/app\n")
        folder = tmp_path / "sys" / "pod" / "app"
        names = ("memory.max", "memory.current", "inactive_file")
    else:
        proc.write_text("4:memory:/pod/app\n1:cpu:/\n")
        folder = tmp_path / "sys" / "memory" / "pod" / "app"
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    folder.mkdir(parents=True)
    (folder / names[0]).write_text(f"{4 * GIB}\n")
    (folder / names[1]).write_text(f"{3 * GIB}\n")
    (folder / "memory.stat").write_text(f"anon 1\n{names[2]} {GIB // 2}\n")
    assert memory._cgroup_headroom(proc, tmp_path / "sys") == GIB + GIB // 2
    (folder / names[0]).write_text("max\n" if version == "v2" else f"{1 << 62}\n")
    assert memory._cgroup_headroom(proc, tmp_path / "sys") is None


def test_tensor_parallel_ranks_share_the_host_and_split_the_weights_over_gpus(checkpoint, host):
    """On the CPU every rank's KV budget is on this host; on CUDA each GPU holds one rank's
    share of the weights (a model larger than one GPU fits on two)."""
    import torch

    one = EngineConfig.create("m", device="cpu", dtype="bfloat16", kv_cache_memory=GIB)
    two = EngineConfig.create("m", device="cpu", dtype="bfloat16", kv_cache_memory=GIB,
                              tensor_parallel_size=2)  # fmt: skip
    cpu = torch.device("cpu")
    assert memory.estimate(MODEL, two, checkpoint, cpu).kv_cache == 2 * GIB
    assert memory.estimate(MODEL, two, checkpoint, cpu).weights == 2 * GIB
    host(3 * GIB + GIB // 2)  # one rank's 1 GiB of KV fits beside the weights, two ranks' do not
    memory.check(MODEL, one, checkpoint)
    with pytest.raises(ValueError, match=r"KV cache 2\.0 GiB"):
        memory.check(MODEL, two, checkpoint)
    cuda = torch.device("cuda")
    assert memory.estimate(MODEL, one, checkpoint, cuda).weights == 2 * GIB
    assert memory.estimate(MODEL, two, checkpoint, cuda).weights == GIB


def test_the_weights_count_as_loaded_not_as_the_file(host):
    """The embedded 94 MB Q4_1 GGUF is ~310 MiB as bf16 on a CPU (dequantized, plus the tied LM
    head's packed copy): memory the file-size rule would have promised and the load would take."""
    from pagoda.runtime.model.loader import builtin_model_path, read_model_config

    path, mc = builtin_model_path("smollm2-135m"), read_model_config("smollm2-135m")
    cfg = EngineConfig.create("smollm2-135m", device="cpu", dtype="bfloat16",
                              kv_cache_memory=16 << 20, max_model_len=2048)  # fmt: skip
    fp = memory.estimate(mc, cfg, path, cfg.torch_device())
    file = path.stat().st_size
    assert fp.weights > 3 * file
    old_need = fp.device_bytes + fp.block_tables - fp.weights + file  # the file-size rule
    host(old_need + (fp.weights - file) // 2)  # enough by the file, not for the loaded weights
    with pytest.raises(ValueError) as err:
        memory.check(mc, cfg, path)
    msg = str(err.value)
    assert "weights 310.6 MiB as bfloat16 (93.8 MiB Q4_1/Q8_0 GGUF dequantized" in msg, msg
    assert msg.endswith("lower the model (a smaller or quantized checkpoint)")
    host(fp.device_bytes + fp.block_tables)
    assert memory.check(mc, cfg, path).weights == fp.weights


def test_a_draft_model_counts_beside_the_target(tmp_path, host, monkeypatch):
    """Speculative decoding's draft model (`spec/draft_model.py`): its weights, read from its
    checkpoint as the target's are, add to the target's; its rows of every block and its
    scratch blocks come out of the KV budget (on CUDA, what is left after both models); a draft
    that leaves the cache no room is refused in one line."""
    import torch
    from hf_oracle import make_tiny_llama
    from pagoda.runtime.model.loader import read_model_config

    target, draft = tmp_path / "t", tmp_path / "d"
    make_tiny_llama(target)
    make_tiny_llama(draft, num_hidden_layers=1)
    mc = read_model_config(str(target))
    spec = {"model": str(draft), "num_speculative_tokens": 3}

    def both(device: str, **kw) -> tuple[memory.Footprint, memory.Footprint]:
        common = dict(device=device, dtype="float32", block_size=8, max_num_seqs=4,
                      max_model_len=128, **kw)  # fmt: skip
        return (memory.check(mc, EngineConfig.create(str(target), **common), target),
                memory.check(mc, EngineConfig.create(str(target), speculative_config=spec,
                                                     **common), target))  # fmt: skip

    host(64 * GIB)
    plain, drafted = both("cpu", kv_cache_memory=1 << 20)
    alone = EngineConfig.create(str(draft), device="cpu", dtype="float32")
    held = memory.estimate(read_model_config(str(draft)), alone, draft, torch.device("cpu"))
    assert drafted.weights == plain.weights and drafted.draft == held.weights > 0
    assert drafted.device_bytes - plain.device_bytes == held.weights
    per = 2 * 2 * 2 * 16 * 4 * 8  # layers × K,V × KV heads × head_dim × float32 × block
    scratch = 4 * 2 * per // 2  # max_num_seqs × (ceil(3 / 8) + 1) blocks of the draft's half
    assert plain.kv_blocks == (1 << 20) // per
    assert drafted.kv_blocks == ((1 << 20) - scratch) // (per + per // 2)
    # CUDA: the budget left after the weights shrinks by the draft's
    monkeypatch.setattr(memory, "device_available", lambda device: (20 * GIB, 24 * GIB))
    plain, drafted = both("cuda")
    assert drafted.kv_cache == plain.kv_cache - drafted.draft
    # (and its sampled drafts' q and verification: `sampled_bytes`)
    scratch += sampled_bytes(3, 4, mc.vocab_size)
    assert drafted.kv_blocks == (drafted.kv_cache - scratch) // (per + per // 2)
    room = plain.weights + memory.GPU_HEADROOM + 32 * per  # the target alone has 32 blocks
    monkeypatch.setattr(memory, "device_available", lambda device: (room, room))
    memory.check(  # the target alone fits
        mc, EngineConfig.create(str(target), device="cuda", dtype="float32",
                                         gpu_memory_utilization=1.0, block_size=8), target)  # fmt: skip
    with pytest.raises(ValueError, match=r"after the weights \(.*; the draft model's "
                                         r"\d+\.\d KiB\) and headroom, fewer than 2 blocks"):  # fmt: skip
        both("cuda", gpu_memory_utilization=1.0)

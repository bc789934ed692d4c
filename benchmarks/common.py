"""Shared pieces of the benchmarks: the ragged workload, GEMM peak measurement, table output."""

from __future__ import annotations

import math
import random
import time
import zlib
from collections.abc import Mapping

import torch

PREAMBLE_TOKENS = 64  # every prompt opens with the same system-prompt-like prefix


def ragged_workload(
    tokenizer, n: int, min_len: int, max_len: int, seed: int = 0
) -> list[list[int]]:
    """`n` prompts, lengths log-uniform in [min_len, max_len], sharing a short common preamble.

    Text is the source of Python's own `argparse` module: natural tokens, long enough that
    slices do not repeat, and fixed for a given Python version (so runs are comparable).
    """
    import argparse
    import inspect

    corpus = tokenizer.encode(inspect.getsource(argparse))
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        length = round(math.exp(rng.uniform(math.log(min_len), math.log(max_len))))
        head = corpus[: min(PREAMBLE_TOKENS, length)]
        start = rng.randrange(PREAMBLE_TOKENS, len(corpus) - max_len)
        prompts.append(head + corpus[start : start + length - len(head)])
    return prompts


def best_seconds(fn, seconds: float = 1.0) -> float:
    """Shortest of repeated calls of `fn` within `seconds` (after one warm-up call): the machine
    is shared and noisy, so the best run is the one least disturbed."""
    fn()
    best, end = math.inf, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def gemm_peak(dtype: torch.dtype, size: int = 2048, seconds: float = 1.0) -> float:
    """Best-of GEMM throughput in FLOP/s on this machine, now (the machine is shared and noisy)."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    return 2 * size**3 / best_seconds(lambda: torch.mm(a, b), seconds)


def read_bandwidth(nbytes: int = 512 << 20, seconds: float = 1.0) -> float:
    """Best-of bytes/s of a float32 `sum` over `nbytes` at torch's thread count: what this
    machine gives a plain streaming read now (a floor for its memory bandwidth)."""
    x = torch.ones(nbytes // 4)
    return nbytes / best_seconds(x.sum, seconds)


def until_decoding(engine) -> None:
    """Step `engine` until nothing waits and every running request decodes one token a step
    (all prefills done, chunked ones included): where decode-step benchmarks start timing."""
    while engine.scheduler.waiting or any(
        r.num_tokens - r.num_computed_tokens > 1 for r in engine.scheduler.running
    ):
        engine.step()


def kv_bytes_per_token(config) -> int:
    """Bytes one token's K and V take over all layers in a cache of the dtype `auto` picks on
    this CPU (bf16, or float32 without native bf16): sizes test budgets."""
    from pagoda.runtime.config import cpu_has_fast_bf16

    elem = 2 if cpu_has_fast_bf16() else 4
    return config.num_layers * config.kv_tensors * config.num_kv_heads * config.head_dim * elem


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def cpu_model() -> str:
    """The CPU's model name, family/model numbers and cores, as /proc/cpuinfo reports them."""
    import os

    name, family, model = "unknown CPU", "?", "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and name == "unknown CPU":
                    name = value
                elif key == "cpu family" and family == "?":
                    family = value
                elif key == "model" and model == "?":
                    model = value
    except OSError:
        pass
    return f"{name} (family {family}, model {model}), {os.cpu_count()} cores"


def cpu_matrix_units() -> str:
    """Which bf16 matrix paths the CPU has: AMX tiles, AVX-512 BF16, or neither."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return "unknown"
    amx = "amx_bf16" in flags
    avx = "avx512_bf16" in flags
    return f"AMX {'yes' if amx else 'no'}, AVX-512 BF16 {'yes' if avx else 'no'}"


def machine() -> str:
    """One line naming this machine: CPU model, cores, matrix units, GPU if any, torch build."""
    gpu = "no GPU"
    if torch.cuda.is_available():
        gpu = f"GPU {torch.cuda.get_device_name(0)}"
    import os

    omp = os.environ.get("OMP_WAIT_POLICY", "default")
    return (
        f"{cpu_model()}; {cpu_matrix_units()}; {gpu}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY {omp}"
    )


def write_random_llama(path, config: dict, dtype: torch.dtype = torch.bfloat16) -> None:
    """A Llama with random weights and a word-level tokenizer (token `w<i>` = id i) saved as a
    Hugging Face directory at `path`: a model of any shape without downloads. Its decoder is
    ByteLevel, as that of byte-level BPE models (Llama 3, SmolLM, Qwen), so detokenizing costs
    what it costs when serving them (the text is "w1w2...")."""
    write_random_model(path, config, dtype, "LlamaForCausalLM")


def _hf_config(config: dict, architecture: str):
    import transformers

    cfg = dict(config)
    cfg.setdefault("eos_token_id", 2)
    cfg.setdefault("bos_token_id", 1)
    model_class = getattr(transformers, architecture)
    return model_class, model_class.config_class(**cfg)


def _write_tokenizer(path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))


def write_random_model(
    path, config: dict, dtype: torch.dtype = torch.bfloat16, architecture: str = "LlamaForCausalLM"
) -> None:
    """`write_random_llama` for any transformers causal-LM class (`Qwen3MoeForCausalLM`, ...)."""
    model_class, hf_config = _hf_config(config, architecture)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = model_class(hf_config).to(dtype)
    model.save_pretrained(path)
    _write_tokenizer(path, hf_config.vocab_size)


def checkpoint_shapes(config: dict, architecture: str) -> dict[str, torch.Size]:
    """Tensor names and shapes of the checkpoint `save_pretrained` would write, from a model on
    the meta device (no memory): transformers 5 stores fused experts but saves them per expert
    (`...experts.<e>.gate_proj.weight`), as hub checkpoints are."""
    model_class, hf_config = _hf_config(config, architecture)
    with torch.device("meta"):
        model = model_class(hf_config)
    state = model.state_dict()
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: modules are stored as saved
        return {k: v.shape for k, v in state.items()}
    return {k: v.shape for k, v in revert_weight_conversion(model, state).items()}


class RandomWeights(Mapping):
    """A checkpoint's tensors by name, drawn when read on `device` (seeded by the name, so a
    second read gives the same values): norms are ones, other vectors zeros, matrices
    N(0, 0.02) as transformers initialises them. Nothing is kept, so the model that reads them
    is the only copy: a 30B model without writing 60 GB to disk or holding it twice."""

    def __init__(self, shapes: dict[str, torch.Size], dtype: torch.dtype, device) -> None:
        self._shapes, self._dtype, self._device = shapes, dtype, torch.device(device)

    def __getitem__(self, name: str) -> torch.Tensor:
        shape = self._shapes[name]
        if len(shape) == 1:
            fill = 1.0 if "norm" in name else 0.0
            return torch.full(shape, fill, dtype=self._dtype, device=self._device)
        gen = torch.Generator(device=self._device).manual_seed(zlib.crc32(name.encode()))
        out = torch.randn(shape, generator=gen, device=self._device, dtype=self._dtype)
        return out.mul_(0.02)

    def __contains__(self, name: object) -> bool:  # Mapping's would draw the tensor
        return name in self._shapes

    def __iter__(self):
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)


def random_weight_model(path, config: dict, architecture: str, dtype: torch.dtype, device):
    """A `LoadedModel` whose config.json and tokenizer are written to `path` and whose weights
    are `RandomWeights` on `device` (for shapes too large to write: `write_random_model` is
    the small-model path, and the one HF's own `generate` can read)."""
    import json

    from pagoda.runtime.model.hf_loader import read_tokenizer
    from pagoda.runtime.model.loader import LoadedModel, read_model_config

    _, hf_config = _hf_config(config, architecture)
    data = hf_config.to_dict()
    data["architectures"] = [architecture]
    if "num_experts" in config:  # hub spelling (Qwen3-MoE), besides transformers 5's own
        data["num_experts"] = config["num_experts"]
    data["dtype"] = str(dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(data, indent=2))
    _write_tokenizer(path, hf_config.vocab_size)
    model_config = read_model_config(str(path))
    weights = RandomWeights(checkpoint_shapes(config, architecture), dtype, device)
    return LoadedModel(
        name=str(path),
        path=str(path),
        config=model_config,
        weights=weights,
        tokenizer=read_tokenizer(path, model_config),
    )

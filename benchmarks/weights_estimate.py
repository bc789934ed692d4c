"""The start-up check's weight count (`runtime/server/weights.py`, from checkpoint metadata)
against what the model `pagoda serve` builds really holds, on this machine's device.

Random checkpoints written with transformers (`common.write_random_model`): a Llama with tied
and one with untied embeddings, stored float32 and served bf16, a bf16 Qwen3-MoE, and the Llama
with ``--quantization fp8`` where the FP8 kernels run. Held bytes on CUDA: the growth of
`torch.cuda.memory_allocated()` while the model is built, less its RoPE tables (the caching
allocator rounds each tensor up to 512 bytes); on a CPU: the bytes of the tensors the model
object holds (`tests/runtime/model_bytes.py`: oneDNN's packed copies by their own size).

    python -P benchmarks/weights_estimate.py --device cuda      # on a GPU node (gpu_check.sh's
    python -P benchmarks/weights_estimate.py --small            # PYTHONPATH); here: a CPU run

Exit status 1 when an estimate is off by more than 2 %.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "runtime"))  # model_bytes
sys.path.insert(0, str(Path(__file__).resolve().parent))  # common

from common import machine, markdown_table, write_random_model  # noqa: E402

TOLERANCE = 0.02


def cases(small: bool) -> list[tuple[str, str, dict, torch.dtype]]:
    """(name, transformers class, config, stored dtype) of each checkpoint."""
    size = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=300)
            if small else
            dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, vocab_size=32000))  # fmt: skip
    llama = dict(size, num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
    moe = dict(llama, head_dim=llama["hidden_size"] // 8, num_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=size["intermediate_size"] // 4)  # fmt: skip
    return [
        ("llama-tied", "LlamaForCausalLM", dict(llama, tie_word_embeddings=True), torch.float32),
        ("llama-untied", "LlamaForCausalLM", llama, torch.float32),
        ("qwen3moe", "Qwen3MoeForCausalLM", moe, torch.bfloat16),
    ]


def held(path: Path, device: str, fp8) -> int:
    from model_bytes import build, held_bytes

    if device == "cpu":
        return held_bytes(build(path, torch.bfloat16, device, fp8=fp8))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model = build(path, torch.bfloat16, device, fp8=fp8)
    torch.cuda.synchronize()
    rope = sum(t.numel() * t.element_size() for t in model.rope_caches.values())
    grown = torch.cuda.memory_allocated() - before - rope
    del model
    torch.cuda.empty_cache()
    return grown


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a quick CPU run)")
    args = parser.parse_args(argv)
    from pagoda.runtime.config import EngineConfig, fp8_runs_on
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME
    from pagoda.runtime.server import weights

    print(f"machine: {machine()}; device {args.device}")
    fp8_here = fp8_runs_on(torch.device(args.device))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, cls, config, stored in cases(args.small):
            path = Path(tmp) / name
            write_random_model(path, config, stored, cls)
            for fp8 in (False, True) if fp8_here and cls.startswith("Llama") else (False,):
                cfg = EngineConfig.create(str(path), device=args.device, dtype="bfloat16",
                                          quantization="fp8" if fp8 else None)  # fmt: skip
                est = weights.estimate(read_model_config(str(path)), cfg, path)
                got = held(path, args.device, ONLINE_SCHEME if fp8 else None)
                rows.append({"case": name + (" fp8" if fp8 else ""), "estimate": est.bytes,
                             "held": got, "ratio": est.bytes / got, "how": est.how})  # fmt: skip
    table = [[r["case"], f"{r['estimate'] / 2**20:.2f}", f"{r['held'] / 2**20:.2f}",
              f"{r['ratio']:.4f}", r["how"]] for r in rows]  # fmt: skip
    print(markdown_table(["case", "estimate MiB", "held MiB", "ratio", "how"], table))
    return rows


if __name__ == "__main__":
    results = main()
    sys.exit(0 if all(abs(r["ratio"] - 1) <= TOLERANCE for r in results) else 1)

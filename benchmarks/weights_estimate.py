"""The start-up check's weight count (`runtime/server/weights.py`, from checkpoint metadata)
against what the model `pagoda serve` builds really holds, on this machine's device.

Random checkpoints written with transformers (`common.write_random_model`): a Llama with tied
and one with untied embeddings, stored float32 and served bf16, a bf16 Qwen3-MoE, and the Llama
with ``--quantization fp8`` where the FP8 kernels run; the untied Llama exported as FP8
checkpoints too (`quantization_config` ``fp8``: one scale per output channel, held as FP8 where
the FP8 kernels run and dequantized elsewhere; and 128x128 blocks, DeepSeek-V3 style, always
dequantized). Held bytes on CUDA: the growth of
`torch.cuda.memory_allocated()` while the model is built, less its RoPE tables (the caching
allocator rounds each tensor up to 512 bytes); on a CPU: the bytes of the tensors the model
object holds (`tests/runtime/model_bytes.py`: oneDNN's packed copies by their own size).

    python -P benchmarks/weights_estimate.py --device cuda      # on a GPU node (gpu_check.sh's
    python -P benchmarks/weights_estimate.py --small            # PYTHONPATH); here: a CPU run

Exit status 1 when an estimate is off by more than 2 %.
"""

from __future__ import annotations

import argparse
import re
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


def write_fp8_export(src: Path, dst: Path, block: tuple[int, int] | None) -> None:
    """`src`'s decoder projections as an FP8 checkpoint at `dst`: E4M3 weights with one scale
    per output channel (``weight_scale``) or per `block` tile (``weight_scale_inv``)."""
    import json
    import shutil

    from pagoda.kernels import fp8
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    for name in [n for n in tensors if re.search(r"\.(self_attn|mlp)\.\w+_proj\.weight$", n)]:
        w = tensors[name].float()
        if block is None:
            codes, scale = fp8.quantize_weight(w)
            tensors[name], tensors[name + "_scale"] = codes, scale[:, None]
            continue
        (n, k), (bn, bk) = w.shape, block
        tiles = torch.nn.functional.pad(w, (0, -k % bk, 0, -n % bn))
        tiles = tiles.view(-(-n // bn), bn, -(-k // bk), bk)
        scale = fp8.scale_from_amax(tiles.abs().amax(dim=(1, 3)))
        codes = fp8.quantize(tiles, scale[:, None, :, None]).view(tiles.shape[0] * bn, -1)
        tensors[name], tensors[name + "_scale_inv"] = codes[:n, :k].contiguous(), scale
    save_file(tensors, str(dst / "model.safetensors"))
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": list(block) if block else None,
                                     "ignored_layers": ["lm_head"]}  # fmt: skip
    if block is None:
        del config["quantization_config"]["weight_block_size"]
    (dst / "config.json").write_text(json.dumps(config))


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
            runs = [(name, path, fp8) for fp8 in
                    ((False, True) if fp8_here and cls.startswith("Llama") else (False,))]  # fmt: skip
            if name == "llama-untied":
                for suffix, block in (("fp8-channel", None), ("fp8-block", (128, 128))):
                    write_fp8_export(path, Path(tmp) / f"{name}-{suffix}", block)
                    runs.append(
                        (f"{name} {suffix} checkpoint", Path(tmp) / f"{name}-{suffix}", False)
                    )
            for case, where, fp8 in runs:
                cfg = EngineConfig.create(str(where), device=args.device, dtype="bfloat16",
                                          quantization="fp8" if fp8 else None)  # fmt: skip
                est = weights.estimate(read_model_config(str(where)), cfg, where)
                got = held(where, args.device, ONLINE_SCHEME if fp8 else None)
                rows.append({"case": case + (" fp8" if fp8 else ""), "estimate": est.bytes,
                             "held": got, "ratio": est.bytes / got, "how": est.how})  # fmt: skip
    table = [[r["case"], f"{r['estimate'] / 2**20:.2f}", f"{r['held'] / 2**20:.2f}",
              f"{r['ratio']:.4f}", r["how"]] for r in rows]  # fmt: skip
    print(markdown_table(["case", "estimate MiB", "held MiB", "ratio", "how"], table))
    return rows


if __name__ == "__main__":
    results = main()
    sys.exit(0 if all(abs(r["ratio"] - 1) <= TOLERANCE for r in results) else 1)

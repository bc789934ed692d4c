"""An FP8 checkpoint of a tiny Llama, written by hand, for the FP8 engine tests."""

from __future__ import annotations

import json

import torch
from hf_oracle import make_tiny_llama
from pagoda.kernels import fp8 as math
from pagoda.runtime import LLM, SamplingParams
from safetensors.torch import load_file, save_file

PROMPTS = [[(7 * i + 3) % 300 for i in range(n)] for n in (4, 9, 21)]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _is_linear(name: str) -> bool:
    return name.endswith(".weight") and any(f".{n}." in name for n in LINEARS)


def write_fp8_pair(root, per_tensor: bool = False):
    """(the 16-bit original, its FP8 export, the export's weights dequantized as a float32
    checkpoint): three directories sharing config and tokenizer."""
    orig, q, deq = root / "bf16", root / "fp8", root / "dequantized"
    make_tiny_llama(orig)
    tensors = load_file(str(orig / "model.safetensors"))
    quant, dense = {}, {}
    for name, t in tensors.items():
        if not _is_linear(name):
            quant[name] = dense[name] = t
            continue
        if per_tensor:
            scale = math.scale_from_amax(t.abs().amax()).reshape(1)
            codes = math.quantize(t, scale)
        else:
            codes, scale = math.quantize_weight(t)
        prefix = name.removesuffix(".weight")
        quant[name], quant[prefix + ".weight_scale"] = codes, scale
        dense[name] = math.dequantize(codes, scale.reshape(-1, 1))
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ["lm_head"]}
    _write_pair(orig, (q, quant, config), (deq, dense))
    return orig, q, deq


def _write_pair(orig, fp8: tuple, dense: tuple) -> None:
    """The FP8 checkpoint (directory, tensors, quantization_config) and its dense twin
    (directory, tensors), each with `orig`'s other files (config, tokenizer)."""
    for d, tensors, qc in (fp8, (*dense, None)):
        d.mkdir()
        for f in orig.iterdir():
            if f.name != "model.safetensors":
                (d / f.name).write_bytes(f.read_bytes())
        save_file(tensors, str(d / "model.safetensors"))
        if qc is not None:
            cfg = json.loads((d / "config.json").read_text())
            cfg["quantization_config"] = qc
            (d / "config.json").write_text(json.dumps(cfg))


def greedy(llm: LLM, n: int = 5, first: list | None = None) -> list[list[int]]:
    """Greedy tokens of `PROMPTS`; `first` gets the float32 logits of each prompt's last token
    (its first sampling step), in prompt order."""
    seen: dict[str, torch.Tensor] = {}

    def observe(reqs, logits):
        for r, row in zip(reqs, logits.float()):
            seen.setdefault(r.request_id, row.clone())

    llm.engine.runner.logits_hook = observe if first is not None else None
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    if first is not None:
        first += [seen[o.request_id] for o in outs]
    return [o.outputs[0].token_ids for o in outs]


# FP8's error on the tiny Llama's first logits (relative L2, per prompt), E4M3 weights and
# per-token activations against the same float32 model unquantized: measured 0.067 to 0.084; a
# weight scale half what it should be (the top half of each row clipped) gives 0.48 to 0.52
QUANTIZATION_ERROR = 0.15


def assert_quantization_error(ours: list, reference: list, bound: float = QUANTIZATION_ERROR):
    """Each prompt's logits (`greedy`'s `first`) within `bound` of the reference's, relative
    (L2), the reference being the same model unquantized in the same dtype, so that what is
    measured is the quantization's error alone; and some of it (the FP8 path did run)."""
    ours, reference = torch.stack(ours), torch.stack(reference)
    rel = (ours - reference).norm(dim=-1) / reference.norm(dim=-1)
    assert (rel > 0).all() and (rel < bound).all(), rel.tolist()


def quantize_blocks(t: torch.Tensor, block: tuple[int, int]):
    """E4M3 codes of `t` [N, K] with one scale per `block` tile (partial tiles at the edges,
    as DeepSeek-V3 / Qwen3-FP8 exports), the scales [ceil(N/bn), ceil(K/bk)], and the codes
    dequantized (float32)."""
    (n, k), (bn, bk) = t.shape, block
    scales = torch.empty(-(-n // bn), -(-k // bk))
    codes = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    dense = torch.empty(n, k)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            rows, cols = slice(i * bn, (i + 1) * bn), slice(j * bk, (j + 1) * bk)
            scales[i, j] = math.scale_from_amax(t[rows, cols].abs().amax())
            codes[rows, cols] = math.quantize(t[rows, cols], scales[i, j])
            dense[rows, cols] = codes[rows, cols].float() * scales[i, j]
    return codes, scales, dense


def write_block_pair(root, quantization_config: dict, block: tuple[int, int], scale_suffix: str):
    """(an FP8 checkpoint of a tiny Llama with block-wise scales named
    `<layer>.<scale_suffix>`, the float32 checkpoint of its weights dequantized): two
    directories sharing config and tokenizer."""
    make_tiny_llama(root / "orig")
    return write_blocks_of(root / "orig", root, quantization_config, block, _is_linear,
                           scale_suffix)  # fmt: skip


def write_blocks_of(orig, root, quantization_config: dict, block: tuple[int, int], quantized,
                    scale_suffix: str = "weight_scale_inv"):  # fmt: skip
    """The checkpoint at `orig` with the tensors `quantized(name)` names in E4M3, one scale per
    `block` tile named `<layer>.<scale_suffix>`, and `quantization_config` (root / "fp8"), and
    the checkpoint of its weights dequantized (root / "dequantized"), both with `orig`'s other
    files (config, tokenizer); returns the two directories."""
    q, deq = root / "fp8", root / "dequantized"
    tensors = load_file(str(orig / "model.safetensors"))
    quant, dense = {}, {}
    for name, t in tensors.items():
        if not quantized(name):
            quant[name] = dense[name] = t
            continue
        codes, scales, dense[name] = quantize_blocks(t.float(), block)
        quant[name], quant[name.removesuffix("weight") + scale_suffix] = codes, scales
    _write_pair(orig, (q, quant, quantization_config), (deq, dense))
    return q, deq

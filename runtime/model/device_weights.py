"""How a checkpoint's tensors become the device's weights: moved one at a time as the layers are
built, cut for tensor parallelism, FP8 tensors dequantized where their layers do not run in FP8,
and which fused layers run in the FP8 GEMM (`runs_fp8`, `fp8_weights`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from pagoda.runtime.cpu.quantized import QuantizedWeight, stack
from pagoda.runtime.model.finite_check import FiniteCheck

if TYPE_CHECKING:
    from pagoda.runtime.quantization.fp8 import Fp8LinearWeights, Fp8Scheme


class DeviceWeights:
    """Checkpoint tensors moved to the device one at a time, as the layers are built, so the
    peak is the model plus one layer's temporaries rather than two copies of every weight."""

    def __init__(
        self,
        weights: Mapping[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        quantized: Mapping[str, QuantizedWeight],
        fp8: Fp8Scheme | None = None,
        check_finite: bool = True,
    ) -> None:
        self._w, self.device, self.dtype = weights, device, dtype
        # every tensor read is checked for NaN/Inf on the device; `check_finite()` reads it
        self.finite = FiniteCheck(check_finite)
        # stored blocks serve only float32 on the CPU: there `qgemm` computes the same weights
        on_cpu_f32 = device.type == "cpu" and dtype == torch.float32
        self._q = quantized if on_cpu_f32 else {}
        self.fp8 = fp8  # the linear layers it names run in the FP8 GEMM (`fp8_weights`)
        self._kept: dict[str, torch.Tensor] = {}  # read by `equal`, taken by the next read

    @property
    def stored(self) -> Mapping[str, torch.Tensor]:
        """The checkpoint's tensors as stored (dtype, device), e.g. its FP8 scales."""
        return self._w

    def __contains__(self, name: str) -> bool:
        return name in self._w

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._w:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        read = getattr(self._w, "read", None)  # a GGUF's: its blocks dequantized on the device
        if read is not None:
            return self.finite.add(name, read(name, self.device, self.dtype))
        t = self._stored(name)
        if t.dtype == torch.float8_e4m3fn:  # an FP8 checkpoint's weight read as dense values
            return self.finite.add(name, self._dequantized(name, t))
        return self.finite.add(name, t.to(device=self.device, dtype=self.dtype))

    def check_finite(self, tp=None) -> None:
        """`NonFiniteWeights` (a ValueError) naming the first tensor read so far that holds NaN
        or Inf, as read onto the device (one sync for all of them; `FiniteCheck.check`)."""
        self._kept.clear()
        self.finite.check(tp)

    def equal(self, a: str, b: str) -> bool:
        """Whether tensors `a` and `b` are stored alike (shape, dtype and bits), read where they
        are stored (an embedding and a head: once, at load, only when a config ties them). The
        next read of `a`, and of `b` where they differ, takes the tensor read here."""
        x, y = self._stored(a), self._stored(b)
        same = x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        if getattr(self._w, "read", None) is None:  # a GGUF's `read` dequantizes anew
            self._kept = {a: x} if same else {a: x, b: y}
        return same

    def _stored(self, name: str) -> torch.Tensor:
        """Tensor `name` as stored: the one `equal` read, else read now."""
        kept = self._kept.pop(name, None)
        return self._w[name] if kept is None else kept

    def source(self, name: str) -> torch.Tensor:
        """Matrix `name` as ``--quantization fp8`` quantizes it: as stored (on the device), or
        in float32 where the checkpoint stores it in FP8 with scales the GEMM cannot take
        (block-wise), so that it is requantized one scale per output channel."""
        if name not in self._w:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        t = self._stored(name)
        if t.dtype == torch.float8_e4m3fn:
            return self.finite.add(name, self._dequantized(name, t, torch.float32))
        return self.finite.add(name, t.to(self.device))

    def _dequantized(self, name: str, t: torch.Tensor, dtype: torch.dtype | None = None):
        """``weight · weight_scale`` (per tensor, per output channel, or per tile of a block-wise
        checkpoint, whose scales may be named ``weight_scale_inv``) in the model's dtype: how an
        FP8 checkpoint runs where its layers do not run in FP8 (a CPU, an older GPU, block-wise
        scales anywhere)."""
        from pagoda.kernels.fp8 import dequantize
        from pagoda.runtime.quantization.fp8 import dequantize_blocks

        base = name.removesuffix("weight")
        scale_name = next((base + s for s in ("weight_scale", "weight_scale_inv")
                           if base + s in self._w), base + "weight_scale")  # fmt: skip
        if not name.endswith(".weight") or scale_name not in self._w or t.dim() != 2:
            raise ValueError(f"checkpoint tensor {name} is float8_e4m3fn without a per-tensor "
                             f"or per-channel {scale_name}")  # fmt: skip
        scale = self._w[scale_name]
        # the scale named if it is not finite; a NaN code is NaN in the values, which the
        # caller checks (so each tensor is checked once)
        self.finite.add(scale_name, scale.to(self.device))
        block = getattr(self._w, "fp8_block", None)  # the checkpoint's tile, if block-wise
        tiles = None if block is None else tuple(-(-a // b) for a, b in zip(t.shape, block))
        if tiles is not None and tuple(scale.shape) == tiles:
            return dequantize_blocks(t.to(self.device), scale, block, dtype or self.dtype)
        scale = scale.float().reshape(-1)
        if scale.numel() not in (1, t.shape[0]):
            raise ValueError(f"{scale_name} has {scale.numel()} elements; expected 1 or "
                             f"{t.shape[0]}, or block-wise scales with the checkpoint's "
                             "weight_block_size")  # fmt: skip
        scale = scale.to(self.device).reshape(-1, 1)
        return dequantize(t.to(self.device), scale, dtype or self.dtype)

    def fp8_weights(self, names: list[str]) -> Fp8LinearWeights | None:
        """The matrices `names` (stacked: q/k/v, gate/up) as one FP8 GEMM operand when the
        engine runs them in FP8: read from an FP8 checkpoint, or quantized now from the stored
        16/32-bit values (one scale per output channel); None when they stay 16-bit."""
        if not self.runs_fp8(names):
            return None
        from pagoda.runtime.quantization import fp8

        assert self.fp8 is not None
        modules = [n.removesuffix(".weight") for n in names]
        if self.fp8.serialized:
            parts = [fp8.load_linear(self._w, m, self.fp8).to(self.device) for m in modules]
            for m, part in zip(modules, parts):  # load_linear refused non-finite scales
                self.finite.add(f"{m}.weight", part.weight)
            return fp8.fuse(parts)
        return fp8.quantize_linear(torch.cat([self.source(n) for n in names]))

    def runs_fp8(self, names: list[str]) -> bool:
        """Whether the matrices `names` (one fused layer) run in the FP8 GEMM: the scheme names
        them and, for an FP8 checkpoint, it stores them in FP8 (a projection it keeps 16-bit
        runs 16-bit, whether its ignore list names it or not). All of them or none: ValueError
        when only some would."""
        if self.fp8 is None:
            return False
        wanted = [
            self.fp8.quantizes(n.removesuffix(".weight"))
            and (not self.fp8.serialized or self._stored_fp8(n))
            for n in names
        ]
        if any(wanted) and not all(wanted):
            modules = ", ".join(n.removesuffix(".weight") for n in names)
            raise ValueError(f"the FP8 checkpoint quantizes some of {modules} but not all; they "
                             "run as one fused layer")  # fmt: skip
        return all(wanted)

    def _stored_fp8(self, name: str) -> bool:
        if name not in self._w:
            return False  # reported by name when it is read
        header = getattr(self._w, "dtype_and_shape", None)  # safetensors: without reading it
        if header is not None:
            return header(name)[0] == "F8_E4M3"
        return self._w[name].dtype == torch.float8_e4m3fn

    def length(self, name: str, dim: int) -> int:
        """The size of tensor `name` along `dim`."""
        if name not in self._w:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        header = getattr(self._w, "dtype_and_shape", None)  # safetensors: without reading it
        return header(name)[1][dim] if header is not None else self._w[name].shape[dim]

    def part(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """Rows (dim 0) or columns (dim 1) [start, stop) of `name`, cut before the move to the
        device, zero-padded past its end (a vocabulary rounded up for tensor parallelism)."""
        if name not in self._w:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        have = max(0, min(stop, self.length(name, dim)) - start)
        read = getattr(self._w, "part", None)  # safetensors: only those elements read
        if read is not None and name not in self._kept and not self._stored_fp8(name):
            piece = read(name, dim, start, start + have)
        else:
            t = self._stored(name)
            if t.dtype == torch.float8_e4m3fn:  # with its scale, as `self[name]` reads it
                t = self._dequantized(name, t)
            piece = t.narrow(dim, start, have)
        piece = piece.to(device=self.device, dtype=self.dtype)
        self.finite.add(name, piece)
        if have < stop - start:
            pad = list(piece.shape)
            pad[dim] = stop - start - have
            piece = torch.cat([piece, piece.new_zeros(pad)], dim)
        piece = piece.contiguous()
        # rows cut from a tensor read whole, already on the device in the dtype, are a view
        # that keeps all of it (a CPU rank's embedding shard held the whole table): copy them
        return piece.clone() if piece.untyped_storage().nbytes() > piece.nbytes else piece

    def cat(self, names: list[str]) -> torch.Tensor:
        return torch.cat([self[n] for n in names])

    def biases(self, weight_names: list[str]) -> torch.Tensor | None:
        """The biases of these matrices, concatenated, where the checkpoint has them (all or
        none: q/k/v of Qwen2, a Llama's with attention_bias or mlp_bias)."""
        names = [n[: -len("weight")] + "bias" for n in weight_names]
        if not any(n in self._w for n in names):
            return None
        return self.cat(names)  # a missing one is reported by name

    def quantized(self, names: list[str]) -> list[QuantizedWeight] | None:
        """The rows of `names` as stored blocks, if all of them have some (see `quantized`)."""
        return stack([self._q.get(n) for n in names])

"""The ungated MLP, ``down(act(up(x)))`` (`FamilyConfig.gated_mlp` false), and Arcee's model.

Two matmuls and one elementwise activation over the whole [T, I] batch (no gate half, so no
`act_and_mul`): StarCoder2's GELU (tanh approximation, `starcoder2.py`), Arcee's and Nemotron's
ReLU² (relu(x)²), Apertus' xIELU (`apertus.py`; its four parameters per layer come from the
checkpoint, `xielu`). With tensor parallelism up is column-parallel (its rows, and its bias's,
on their rank) and down row-parallel, as the gated MLP's gate/up and down.

Arcee (`ArceeForCausalLM`: AFM-4.5B) is Llama's model with this MLP (ReLU²).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import LayerContext, LlamaModel, linear_layer
from pagoda.runtime.model.parallel_linear import column_linear, row_linear


def relu2(x: torch.Tensor) -> torch.Tensor:
    """relu(x)² (transformers' ReLUSquaredActivation), in place on the matmul's output."""
    return F.relu(x, inplace=True).square_()


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def xielu(weights: dict[str, torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """xIELU (arXiv 2411.13010) from its stored parameters (`alpha_p`, `alpha_n`, `beta`,
    `eps`), as transformers' `XIELUActivation` computes it in the model's dtype:
    ``alpha_p x² + beta x`` where x > 0, else ``(expm1(min(x, eps)) - x) alpha_n + beta x``,
    alpha_p = softplus(a_p) and alpha_n = beta + softplus(a_n)."""
    beta, eps = weights["beta"], weights["eps"]
    alpha_p = F.softplus(weights["alpha_p"])
    alpha_n = beta + F.softplus(weights["alpha_n"])

    def act(x: torch.Tensor) -> torch.Tensor:  # transformers' order of operations, in place
        linear = x * beta
        positive = x.mul(alpha_p).mul_(x).add_(linear)
        negative = torch.minimum(x, eps).expm1_().sub_(x).mul_(alpha_n).add_(linear)
        return torch.where(x > 0, positive, negative)

    return act


XIELU_PARAMS = ("alpha_p", "alpha_n", "beta", "eps")  # under `mlp.act_fn.`
_ACTS = {"relu2": relu2, "gelu_tanh": gelu_tanh, "gelu": F.gelu}  # (gelu: exact, Falcon's)
_ACTS["relu"] = F.relu  # (OPT's)


class UngatedMLP:
    """down(act(up(x))); `names` are the checkpoint's (up, down) matrices under `prefix`."""

    __slots__ = ("act", "down", "up")

    def __init__(
        self,
        ctx: LayerContext,
        w: DeviceWeights,
        prefix: str,
        hidden_act: str,
        names: tuple[str, str] = ("up_proj", "down_proj"),
    ) -> None:
        up, down = (f"{prefix}{n}.weight" for n in names)
        if ctx.tp is None:
            self.up, self.down = linear_layer(ctx, w, [up]), linear_layer(ctx, w, [down])
        else:  # up column-parallel, down row-parallel (model/parallel_linear.py)
            self.up, self.down = column_linear(ctx, w, [up]), row_linear(ctx, w, down)
        if hidden_act == "xielu":
            self.act = xielu({p: w[f"{prefix}act_fn.{p}"] for p in XIELU_PARAMS})
        else:
            self.act = _ACTS[hidden_act]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))

    def linears(self) -> list[Linear]:
        return [self.up, self.down]


class ArceeModel(LlamaModel):
    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return UngatedMLP(ctx, w, prefix + "mlp.", self.config.family.hidden_act)

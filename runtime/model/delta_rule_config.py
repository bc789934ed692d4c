"""What the delta-rule hybrids' configs share: Qwen3-Next / Qwen3.5 and OLMo Hybrid (Gated
DeltaNet: `qwen3_next_config.py`, `olmo_hybrid_config.py`) and Kimi Linear (KDA:
`kimi_linear_config.py`). Their mixers as recurrent layers (`delta_rule_mamba`: chunks of
64, a conv over q, k and v without bias, a float32 state [value heads, key dim, value dim])
and the published OLMo Hybrid and Kimi Linear checkpoints' conv in three parts (`conv_names`,
`check_conv`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.recurrent_configs import MambaConfig

CHUNK = 64  # the chunked delta rule's chunk (transformers' and FLA's)
CONV_PARTS = ("q_conv1d", "k_conv1d", "v_conv1d")  # q's, k's, v's rows (concatenated at load)


def delta_rule_mamba(
    layers: Iterable[bool], *, v_heads: int, v_dim: int, k_heads: int, k_dim: int, d_conv: int,
    mixer: str = "gated_deltanet", **fields: Any,
) -> MambaConfig:  # fmt: skip
    """The delta-rule layers (`layers`: True per such layer) as the hybrids' recurrent layers:
    `v_heads` value heads of `v_dim`, each reading one of `k_heads` key heads of `k_dim`, a conv
    of width `d_conv`; `fields`: the family's other `MambaConfig` fields."""
    return MambaConfig(
        layers=tuple(layers),
        n_heads=v_heads,
        head_dim=v_dim,
        d_state=k_dim,
        n_groups=k_heads,
        d_conv=d_conv,
        chunk_size=CHUNK,
        conv_bias=False,
        ssm_float32=True,
        mixer=mixer,
        **fields,
    )


def conv_names(p: str, names) -> list[str]:
    """A delta-rule layer's conv (`p`: its prefix): one tensor (transformers' own form), or the
    published three parts (q's, k's, v's rows, concatenated at load as transformers does)."""
    if p + "conv1d.weight" in names:
        return [p + "conv1d.weight"]
    return [f"{p}{part}.weight" for part in CONV_PARTS]


def check_conv(
    c: ModelConfig, headers: Mapping[str, tuple[str, list[int]]], part: str, kernel_key: str
) -> None:
    """Every delta-rule layer's conv (under ``model.layers.{i}.{part}``): [q k v channels, 1,
    kernel] in all, whole or in parts (`conv_names`); ValueError, one line, naming the first
    missing or misshapen (`kernel_key`: the config.json key of the kernel's width)."""
    m = c.family.mamba
    for i in range(c.num_layers):
        if not m.layers[i]:
            continue
        names = conv_names(f"model.layers.{i}.{part}", headers)
        for name in names:
            if name not in headers:
                raise ValueError(f"checkpoint is missing tensor {name!r}")
        shapes = [tuple(headers[n][1]) for n in names]
        if any(s[1:] != (1, m.d_conv) for s in shapes) or sum(s[0] for s in shapes) != m.conv_dim:
            raise ValueError(f"checkpoint tensors {', '.join(names)} are "
                             f"{' + '.join(str(list(s)) for s in shapes)}; config.json needs "
                             f"{[m.conv_dim, 1, m.d_conv]} in all (q, k and v channels, "
                             f"{kernel_key} {m.d_conv})")  # fmt: skip

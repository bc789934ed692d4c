"""A checkpoint's tensors listed under the names the model reads, by architecture: each
family's renames and splits of its stored tensors (its own function, in its module), run on the
opened checkpoint (`SafetensorsWeights`: headers only, no tensor read) by the HF loader before
the checkpoint check (`hf_loader.check_weights`: `list_as_read`) and, where the entry says so, by
the weights estimate (`server/weights.py`: the tensors as the loader names them).

Falcon's fused q/k/v (`falcon.split_qkv`, by `FamilyConfig.falcon_qkv`, not by architecture) is
split by the loader after these."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from pagoda.runtime.config import ModelConfig
from pagoda.runtime.model import moe_families
from pagoda.runtime.model import qwen3_next_config as qwen3_next
from pagoda.runtime.model.hf_tables import FUSED


@dataclass(frozen=True)
class Listing:
    """A family's function (in ``pagoda.runtime.model.<module>``) that lists a checkpoint's
    tensors under the names its model reads: ``(weights)``, or ``(weights, config)`` with
    `config`; `estimate`: the weights estimate lists the checkpoint so too."""

    module: str
    function: str
    config: bool = False
    estimate: bool = True

    def run(self, weights, config: ModelConfig | None) -> None:
        fn = getattr(importlib.import_module(f"pagoda.runtime.model.{self.module}"), self.function)
        if self.config:
            fn(weights, config)
        else:
            fn(weights)


_FUSED = Listing("phi3", "split_fused", config=True, estimate=False)  # fused q/k/v, gate/up
_STACKED = Listing("qwen3_next_config", "rename_stacked_experts", estimate=False)
_RENAMED = {arch: Listing(fn.__module__.rpartition(".")[2], fn.__name__)
            for arch, fn in moe_families.RENAMES.items()}  # fmt: skip

# architecture -> its listing
LISTINGS: dict[str, Listing] = {
    **dict.fromkeys(FUSED, _FUSED),
    "codegen": Listing("phi", "split_codegen_qkv", config=True, estimate=False),  # q/v/k in 4
    **dict.fromkeys(("gpt2", "openai_gpt"), Listing("positions", "transpose_conv1d")),  # Conv1D
    **dict.fromkeys(qwen3_next.DEFAULTS, _STACKED),  # Qwen3.5-MoE's stacked experts
    "olmo_hybrid": Listing("olmo_hybrid_config", "rename_norms", estimate=False),  # OLMo-core's
    **_RENAMED,  # (GraniteMoeSWA's experts, Kolibri's norms, ...)
    "hy_v4": Listing("hy_v4_config", "rename_weights"),  # transformers' renames
    **dict.fromkeys(("bert", "roberta"), Listing("bert_config", "rename_weights")),
    # its names renamed, Wqkv and Wi split (model/modernbert_config.py)
    "modernbert": Listing(
        "modernbert_config", "read_checkpoint_names", config=True, estimate=False
    ),
    "deepseek_v4": Listing("dsv4_config", "rename_canonical", estimate=False),  # (`canonical`)
    "kimi_linear": Listing("kimi_linear_config", "rename_mlps", estimate=False),
    "inkling2": Listing("inkling2_config", "rename"),  # the published names
    "bailing_hybrid": Listing("bailing_hybrid_config", "rename"),  # the published names
    "glm5_next": Listing("glm5_next_config", "rename_weights"),  # transformers' renames
    "longcat_flash": Listing("longcat_flash_config", "rename_sublayers", estimate=False),
    "dory": Listing("dory_config", "read_checkpoint_names", estimate=False),  # two-block layout
    "ergo": Listing("ergo_config", "read_checkpoint_names", config=True),  # fused q/k/v too
    "gemma3n": Listing("gemma3n_config", "list_embedders", config=True),  # the wrapper's
    "dbrx": Listing("dbrx", "split_experts", config=True),  # each layer's experts stacked
    # its published per-expert w1/w3/w2 stacked, split gate/up fused, block_sparse_moe renamed
    "minimax_m3": Listing("minimax_m3_config", "read_published", config=True),
}


def list_as_read(weights, config: ModelConfig) -> None:
    """`weights` listed as `config`'s model reads them (its architecture's `Listing`, if any);
    ValueError, one line, where the family's tensors are not there to list."""
    listing = LISTINGS.get(config.architecture)
    if listing is not None:
        listing.run(weights, config)

"""A family's own part of tensor parallelism, by architecture (`ModelConfig.architecture`): what
the shared rules (Llama's heads, KV heads, MLP and experts' widths, the vocabulary, the hybrids'
mixers) do not know of a family's shapes. Each entry names the module
(``pagoda.runtime.model.<module>``: the family's config or shard module, imported when asked, as
`registry.MODEL_CLASSES`' are: `distributed/` sits below `model/`) that holds the family's
function:

- `TP_PROBLEMS`: ``tp_problem(config, size) -> str | None``, why `size` ranks cannot split the
  family's own shapes (one line), or None; `layout.check` asks it after the shared checks;
- `RANK_ROWS`: ``rank_rows(layer, part, rows, cols, config, lay) -> (rows, cols) | None``, the
  rows and columns of tensor ``model.layers.<layer>.<part>`` (`rows` x `cols` stored) that rank
  0 of `lay` holds, or None where the shared rules say (`server/rank_share._local`, for the
  weights estimate).

Adding a family is a line in each table its shapes need (a family the shared rules split needs
none) and the function in its module. A function answers None where the config lacks the
family's own sub-config (`FamilyConfig.gemma4`, ...: a config of that architecture built by
hand, as tests/runtime/test_family_options.py builds one for every architecture)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.distributed.layout import TPLayout

# (`gemma4_config.GEMMA4_LAYERS`, not imported: `distributed/` sits below `model/`)
_GEMMA4 = ("gemma4", "gemma4_unified", "gemma3n")  # (Gemma 3n's layers are a `Gemma4Layers`)

# architecture -> the module of its `tp_problem`
TP_PROBLEMS: dict[str, str] = {
    **dict.fromkeys(_GEMMA4, "gemma4_config"),  # each layer's KV heads and MLP width
    "laguna": "laguna_config",  # each layer's query heads
    "mimo_v2_flash": "mimo_v2_flash_config",  # the sliding layers' KV heads
    "deepseek_v4": "dsv4_shard",  # the output projection's groups
    "nemotron_h": "nemotron_h_config",  # its experts' widths
    "diffllama": "diffllama_config",  # each half of the query and KV heads
    "jetmoe": "jetmoe_config",  # the KV heads (not replicated)
    "ergo": "ergo_config",  # its experts, split by expert
    "zaya": "zaya_config",  # the KV heads (not replicated: a key's residual reads its group)
    **dict.fromkeys(("inkling", "inkling2"), "inkling_config"),  # the window layers' KV heads
    "kolibri1_1": "kolibri1_config",  # rank 0 holds every query head its key selection reads
}

# architecture -> the module of its `rank_rows`
RANK_ROWS: dict[str, str] = {
    **dict.fromkeys(_GEMMA4, "gemma4_config"),  # each layer's head size and KV heads
    "laguna": "laguna_config",  # q and its gate by each layer's query heads
    "mimo_v2_flash": "mimo_v2_flash_config",  # k and v by each layer's KV heads
    "minicpm5_moe": "minicpm5_moe_config",  # q with its output gate
    "beam": "beam_config",  # the output gate's bias by heads
    **dict.fromkeys(("lfm2", "lfm2_moe", "lfm3"), "lfm2_config"),  # the short convs, w2
    "zamba2": "zamba2_config",  # its shared blocks' LoRA adapters' B with their projections
    "jetmoe": "jetmoe_config",  # kv_proj's keys and values by KV heads
    "recurrent_gemma": "recurrent_gemma_config",  # the RG-LRU's projections by channels
    "minimax_m3": "minimax_m3_config",  # the indexer's queries by KV heads, stacked experts
    "dory": "dory_config",  # nGPT's per-channel scales with their heads' and MLP rows
    "doge": "doge_config",  # the dynamic mask's dt_proj columns and A by KV heads
    "bitnet": "bitnet_config",  # its sub-norms by channels, its packed matrices' row scales
    "xlstm": "xlstm_config",  # the mLSTM's projections, gates and norm by heads
    "rwkv": "rwkv_config",  # the mixes' matrices by channels, the channel-mix's receptance whole
    "zaya": "zaya_config",  # the key scales by KV heads, the values and the router whole
    "inkling": "inkling_config",  # each layer's heads' q/k/v/r rows, the stacked experts
    "inkling2": "inkling2_config",  # Inkling's, its gate, sinks, dynamic taps and o_proj
}


def stacked_expert_rows(part: str, rows: int, cols: int, size: int, prefix: str = "mlp.experts."):
    """A rank's (rows, columns) per expert of stacked experts ``<prefix>gate_up_proj`` (rows)
    and ``<prefix>down_proj`` (columns) split by width over `size` ranks; None for another
    tensor (MiniMax-M3's, Zaya's, Inkling's `rank_rows`)."""
    if part == prefix + "gate_up_proj":
        return rows // size, cols
    if part == prefix + "down_proj":
        return rows, cols // size
    return None


def _function(table: dict[str, str], arch: str, name: str):
    module = table.get(arch)
    if module is None:
        return None
    return getattr(importlib.import_module(f"pagoda.runtime.model.{module}"), name)


def tp_problem(config: ModelConfig, size: int) -> str | None:
    """The family's own reason `size` ranks cannot split `config` (`TP_PROBLEMS`), or None."""
    fn = _function(TP_PROBLEMS, config.architecture, "tp_problem")
    return None if fn is None else fn(config, size)


def rank_rows(layer: int, part: str, rows: int, cols: int, config: ModelConfig, lay: TPLayout):
    """The family's own (rows, columns) of a layer's tensor on rank 0 of `lay` (`RANK_ROWS`), or
    None: the shared rules'."""
    fn = _function(RANK_ROWS, config.architecture, "rank_rows")
    return None if fn is None else fn(layer, part, rows, cols, config, lay)

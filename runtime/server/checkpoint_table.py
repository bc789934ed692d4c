"""A checkpoint's tensor table as the loader names and reads it, from its metadata alone (no
tensor data is read): a GGUF's tensors through `gguf_reader.open_reader`, the safetensors headers,
or a pickle's tensors memory-mapped (`SafetensorsWeights`), renamed and listed as each family's
loader does (`checkpoint_names.LISTINGS`), cached per file (`read_checkpoint`); and which of them
the model reads as weights of its own (`read_by_model`: not a GGUF's ``rope_freqs``, a
checkpoint's rotary ``inv_freq`` or FP8 scales, nor the LM head of a tied model). `weights.py`
counts the bytes the engine holds of them.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from pagoda.runtime.server.rank_share import _LAYER, EMBED, HEAD, NORM
from pagoda.runtime.server.stored import ITEM_BYTES, Checkpoint, Stored

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig

# the families' tensors outside the layers (`model/positions.py`, `model/bloom.py`): learned
# positions (a table, whole on every rank), OPT's projections (Linears), BLOOM's embedding norm
POSITIONS = "model.embed_positions.weight"
_OUTSIDE_LAYERS = (POSITIONS, "model.project_in.weight", "model.project_out.weight",
                   "model.embed_layernorm.weight", "model.embed_layernorm.bias",
                   # Gemma 4's per-layer inputs (model/gemma4.py)
                   "model.embed_tokens_per_layer.weight", "model.per_layer_model_projection.weight",
                   "model.per_layer_projection_norm.weight",
                   # Zaya's embedding scale (model/zaya.py)
                   "model.input_hidden_states_scale", "model.input_hidden_states_bias",
                   # HY V4's hyper-connections' fold (model/hy_v4.py)
                   "model.hc_head.hc_fn", "model.hc_head.hc_base", "model.hc_head.hc_scale",
                   # Inkling's embedding norm (model/inkling.py)
                   "model.embed_tokens.embed_norm.weight", "model.final_input.query",
                   # Inkling2Loop's message queries (model/inkling2_config.py)
                   "model.middle_cycle_cross_pass_queries",
                   "model.middle_cycle_cross_pass_kv_queries")  # fmt: skip
_NOT_READ = ("weight_scale", "weight_scale_inv", "input_scale", "k_scale", "v_scale", "kv_scale",
             "output_scale", "inv_freq",
             # MiniMax's lightning decays, computed from the config (model/minimax.py)
             *(f"self_attn.{b}" for b in ("slope_rate", "query_decay", "key_decay",
                                          "diagonal_decay")))  # fmt: skip
# Gemma 3n's AltUp projections into and out of its extra streams (Linears outside the layers)
_ALTUP = re.compile(r"model\.altup_(unembed_)?projections\.\d+\.weight$")


def read_checkpoint(path: Path, architecture: str) -> Checkpoint:
    """The checkpoint's tensors as the loader names them (metadata only; cached per file)."""
    try:
        stat = path.stat()
    except OSError:
        return Checkpoint("")
    return _read(str(path), architecture, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _read(path_str: str, architecture: str, _mtime: int, _size: int) -> Checkpoint:
    path = Path(path_str)
    if path.is_file():
        from pagoda.runtime.model import gguf_loader
        from pagoda.runtime.model.gguf_reader import open_reader

        try:
            reader = open_reader(path)  # the one `read_model_config` parsed
        except Exception:  # not a GGUF the reader parses: its size, as a floor
            return Checkpoint("file", {}, path.stat().st_size)
        tensors = {}
        for t in reader.tensors:
            name = gguf_loader._hf_name(t.name, architecture)  # None: not read (rope_freqs)
            if name is not None:
                tensors[name] = Stored(name, t.tensor_type.name, gguf_loader.held_shape(name, t),
                                       int(t.n_bytes))  # fmt: skip
        return Checkpoint("GGUF", tensors, path.stat().st_size)
    from pagoda.runtime.model.checkpoint_names import LISTINGS
    from pagoda.runtime.model.safetensors_weights import SafetensorsWeights, checkpoint_files

    try:
        files = checkpoint_files(path)
    except ValueError:  # no weight files the loader reads
        return Checkpoint("")
    # headers only (a pickle's tensors memory-mapped, none read): tensors are read on access
    weights = SafetensorsWeights(files)
    listing = LISTINGS.get(architecture)
    if listing is not None and listing.estimate:  # the tensors as the loader names them
        if not listing.config:
            listing.run(weights, None)
        else:
            from pagoda.runtime.model.hf_loader import read_config

            with contextlib.suppress(ValueError):  # (refused at load in one line: read as stored)
                listing.run(weights, read_config(path))
    tensors = {}
    for name in weights:
        kind, shape = weights.dtype_and_shape(name)
        numel = math.prod(shape)
        tensors[name] = Stored(name, kind, tuple(shape), numel * ITEM_BYTES.get(kind, 4))
    if architecture == "deepseek_v4":  # its released FP8 / FP4 matrices as held, dequantized
        from pagoda.runtime.model.dsv4_quant import held_tensors

        tensors = held_tensors(tensors)
    form = ".bin" if files[0].suffix == ".bin" else "safetensors"
    return Checkpoint(form, tensors, sum(f.stat().st_size for f in files))


def read_by_model(name: str, mc: ModelConfig) -> bool:
    """Whether the model reads tensor `name` as a weight of its own (FP8 scales go with theirs)."""
    if name.endswith(_NOT_READ) and not name.endswith(".altup.correct_output_scale"):
        return False  # (Gemma 3n's AltUp scale: a weight, not an FP8 scale)
    if name == HEAD:
        return not mc.tie_word_embeddings
    if name in (
        EMBED,
        NORM,
        "model.norm.bias",
        "lm_head.bias",
        "lm_head.logit_scale",  # (Dory's, float32)
        "model.z_L_init",  # (HRM-Text's)
        "model.final_layernorm.weight",
        "model.final_layernorm.bias",
        *_OUTSIDE_LAYERS,
    ):  # (StarCoder2's and Phi's biases; Bamba's and Phi's final norm under its own name;
        # PhiMoE's head a bias)
        return True
    g3n = None if mc.family.gemma4 is None else mc.family.gemma4.gemma3n  # (model/gemma3n.py)
    if g3n is not None and _ALTUP.match(name):
        return int(name.rsplit(".", 2)[1]) < g3n.altup_inputs - 1
    if g3n is not None and name.startswith(("model.embed_vision.", "model.embed_audio.")):
        return name in g3n.model_shapes(mc.hidden_size)  # (its soft-token norms: not read)
    m = _LAYER.match(name)
    if m is not None and mc.architecture == "axk1" and name.endswith(".post_mlp_layernorm.weight"):
        return int(m.group(1)) < mc.num_layers and mc.family.has_experts(int(m.group(1)))
    g = mc.family.gemma4  # its KV-shared layers' K/V projections and norms: not read
    if m is not None and g is not None and int(m.group(1)) < mc.num_layers:
        shared = g.shares_kv(int(m.group(1)))
        return not (shared and re.search(r"self_attn\.[kv]_(proj|norm)\.", name))
    return m is not None and int(m.group(1)) < mc.num_layers

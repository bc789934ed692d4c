"""A Hugging Face checkpoint's safetensors tensors by name, read from the files when asked.

Which files: the shards `model.safetensors.index.json` names (so that a directory holding both
sharded and consolidated copies, as some Mistral repositories do, is read once), else
`model.safetensors`, else every `*.safetensors`. Tensors are read one at a time from the
memory-mapped files as the model is built: loading never holds a second copy of the checkpoint.
Without safetensors files, PyTorch pickles as transformers saved them (`pytorch_model.bin`, else
the shards `pytorch_model.bin.index.json` names: transformers' order) are read the same way
through `pickle_weights` (``torch.load(weights_only=True, mmap=True)``: nothing but tensors is
unpickled); safetensors are preferred where both are there, as transformers and vLLM prefer them.
Gemma 3's multimodal checkpoints keep the text model under `language_model`: those names are
mapped to the text model's (`model.layers...`, `lm_head.weight`); vision weights are not listed.
EXAONE 3 / 3.5's and Falcon's GPT-style names (`transformer.h.N.attn.attention.q_proj`, `ln_1`, `c_fc_0`) are
listed under Llama's, as transformers' conversion mapping renames them (`_RENAMES`); so are
Phi's (`self_attn.dense`, `mlp.fc1` / `fc2`: `_PHI_RENAMES`, with HyperCLOVA
X's `post_norm1` / `post_norm2` as GLM-4's post-sublayer norms, and LFM2's `operator_norm`,
`ffn_norm`, `self_attn.out_proj`, `embedding_norm`) and GPT-NeoX's
(`gpt_neox.layers.N.attention.query_key_value`, `embed_out`: `_NEOX_RENAMES`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from pagoda.runtime.cpu.quantized import QuantizedWeight, from_dense
from pagoda.runtime.model.pickle_weights import BIN_INDEX, BIN_SINGLE, PickleFile

INDEX = "model.safetensors.index.json"
_PREFIXES = (  # stored prefix -> the text model's (Gemma3ForConditionalGeneration)
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    # Emu3's (Emu3ForConditionalGeneration): as its files store them, and as transformers 5 names them
    ("text_model.model.", "model."),
    ("text_model.lm_head.", "lm_head."),
    ("model.text_model.", "model."),
)
_SKIP = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.")
_SKIP += ("model.multi_modal_projector.", "vision_model.")  # (Llama 4's vision tower)
_SKIP += ("model.vision_model.",)  # (Mllama's, transformers 5's names; Idefics3's)
_SKIP += ("model.connector.",)  # (Idefics3's and SmolVLM's pixel-shuffle projection)
_SKIP += ("model.visual.", "visual.")  # (EXAONE 4.5's, Qwen3.5's, Qwen2-VL's)
_SKIP += ("mtp.",)  # (Qwen3-Next's and Qwen3.5's multi-token prediction layers: not run)
_SKIP += ("model.mtp_layers.",)  # (HY V4's, as transformers ignores them: not run)
_SKIP += ("model.embed_vision.", "model.audio_tower.", "model.embed_audio.")  # (Gemma 4's)
_SKIP += ("vqmodel.", "model.vqmodel.")  # (Emu3's VQ-VAE image tokenizer)
_SKIP += ("model.vision_tokenizer.", "model.audio_tokenizer.")  # (Apertus 1.5's)
_SKIP += ("image_newline", "model.image_newline")  # (LLaVA-NeXT's, OneVision's)
_SKIP += ("patch_merge_mlp.",)  # (MiniMax-M3's, beside its vision tower and projector)
# EXAONE 3's names -> Llama's (transformers' conversion_mapping "exaone"), on `transformer.` names
_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"^transformer\.wte\.", "model.embed_tokens."), (r"^transformer\.h\.", "model.layers."),
    (r"^transformer\.ln_f\.", "model.norm."), (r"\.attn\.attention\.", ".self_attn."),
    (r"\.attn\.(?=[qkv]_proj\.|out_proj\.)", ".self_attn."),  # (GPT-J's: model/phi.py)
    (r"\.mlp\.fc_in\.", ".mlp.up_proj."), (r"\.mlp\.fc_out\.", ".mlp.down_proj."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."), (r"\.ln_1\.", ".input_layernorm."),
    (r"\.ln_2\.", ".post_attention_layernorm."), (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
    (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."), (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
    # Falcon's (model/falcon.py)
    (r"^transformer\.word_embeddings\.", "model.embed_tokens."),
    (r"\.self_attention\.query_key_value\.", ".self_attn.qkv_proj."),
    (r"\.self_attention\.dense\.", ".self_attn.o_proj."), (r"\.ln_attn\.", ".input_layernorm."),
    (r"\.ln_mlp\.", ".post_attention_layernorm."),
    (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."), (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj."),
    # GPT-2's and StarCoder 1's (model/positions.py)
    (r"^transformer\.wpe\.", "model.embed_positions."),
    (r"^transformer\.tokens_embed\.", "model.embed_tokens."),  # OpenAI GPT's
    (r"^transformer\.positions_embed\.", "model.embed_positions."),
    # CTRL's (model/positions.py)
    (r"^transformer\.w\.", "model.embed_tokens."), (r"^transformer\.layernorm\.", "model.norm."),
    (r"\.multi_head_attention\.Wq\.", ".self_attn.q_proj."),
    (r"\.multi_head_attention\.Wk\.", ".self_attn.k_proj."),
    (r"\.multi_head_attention\.Wv\.", ".self_attn.v_proj."),
    (r"\.multi_head_attention\.dense\.", ".self_attn.o_proj."),
    (r"\.ffn\.0\.", ".mlp.up_proj."), (r"\.ffn\.2\.", ".mlp.down_proj."),
    (r"\.layernorm1\.", ".input_layernorm."), (r"\.layernorm2\.", ".post_attention_layernorm."),
    (r"\.attn\.c_attn\.", ".self_attn.qkv_proj."), (r"\.attn\.c_proj\.", ".self_attn.o_proj."),
    (r"\.mlp\.c_fc\.", ".mlp.up_proj."),
    # BLOOM's and MPT's (model/bloom.py)
    (r"^transformer\.word_embeddings_layernorm\.", "model.embed_layernorm."),
    (r"^transformer\.blocks\.", "model.layers."), (r"^transformer\.norm_f\.", "model.norm."),
    (r"\.norm_1\.", ".input_layernorm."), (r"\.norm_2\.", ".post_attention_layernorm."),
    (r"\.attn\.Wqkv\.", ".self_attn.qkv_proj."), (r"\.ffn\.(up|down)_proj\.", r".mlp.\1_proj."),
    # DBRX's (model/dbrx.py: its experts' stacks split per expert at load)
    (r"\.norm_attn_norm\.", "."), (r"\.ffn\.router\.layer\.", ".mlp.gate."),
    (r"\.ffn\.experts\.mlp\.(w1|v1|w2)$", r".mlp.experts.\1"),
))  # fmt: skip
# GPT-2's causal-mask buffers, saved by older transformers beside the weights (never read)
_BUFFERS = (".attn.bias", ".attn.masked_bias")
# the top-level names of checkpoints saved from the base model (gpt2's, bloom's: `h.0.`, `wte`)
# and OPT's (`decoder.`), under the causal LM's prefix
_BARE = re.compile(
    r"^(?:h|wte|wpe|ln_f|word_embeddings|word_embeddings_layernorm|tokens_embed|"
    r"positions_embed)\."
)
# and Llama-style ones (`layers.0.`, `embed_tokens`: a LlamaModel's), under `model.`, as
# transformers adds its base_model_prefix to a checkpoint saved without it
_BARE_MODEL = re.compile(r"^(?:embed_tokens|layers|norm|final_layernorm)\.")
# OPT's names -> Llama's (model/positions.py), on `model.decoder.` names
_OPT_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"^model\.decoder\.final_layer_norm\.", "model.norm."),
    (r"^model\.decoder\.(embed_tokens|embed_positions|project_in|project_out)\.", r"model.\1."),
    (r"^model\.decoder\.layers\.", "model.layers."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.self_attn_layer_norm\.", ".input_layernorm."),
    (r"\.final_layer_norm\.", ".post_attention_layernorm."),
    (r"\.fc1\.", ".mlp.up_proj."), (r"\.fc2\.", ".mlp.down_proj."),
))  # fmt: skip
# GPT-NeoX's names -> Llama's (model/falcon.py), on `gpt_neox.` and `embed_out.` names
_NEOX_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"^gpt_neox_japanese\.", "gpt_neox."),  # GPT-NeoX-Japanese's; its last layer's o_proj bias
    (r"\.attention\.dense_bias$", ".self_attn.o_proj.bias"),
    (r"^gpt_neox\.embed_in\.", "model.embed_tokens."), (r"^gpt_neox\.layers\.", "model.layers."),
    (r"^gpt_neox\.final_layer_norm\.", "model.norm."), (r"^embed_out\.", "lm_head."),
    (r"\.attention\.query_key_value\.", ".self_attn.qkv_proj."),
    (r"\.attention\.dense\.", ".self_attn.o_proj."),
    (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."), (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj."),
))  # fmt: skip
# Phi's names -> Llama's (model/phi.py), and HyperCLOVA X's post-sublayer norms -> GLM-4's
_PHI_RENAMES = tuple((re.compile(a), b) for a, b in (
    (r"^biogpt\.", "model."), (r"^output_projection\.", "lm_head."),  # BioGPT's (then XGLM's)
    (r"\.self_attn\.dense\.", ".self_attn.o_proj."),
    (r"\.mlp\.fc1\.", ".mlp.up_proj."), (r"\.mlp\.fc2\.", ".mlp.down_proj."),
    (r"\.self_attn\.([qk])_layernorm\.(weight|bias)$", r".self_attn.\1_norm.\2"),
    # HyperCLOVA X's peri-norms, as GLM-4's (model/granite.py)
    (r"\.post_norm1\.weight$", ".post_self_attn_layernorm.weight"),
    (r"\.post_norm2\.weight$", ".post_mlp_layernorm.weight"),
    # LFM2's (model/lfm2.py): its norms, attention's output, the final norm
    (r"\.operator_norm\.", ".input_layernorm."), (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."), (r"^model\.embedding_norm\.", "model.norm."),
    # LFM3's sandwich norms, as GLM-4's (model/lfm2.py)
    (r"\.post_operator_norm\.weight$", ".post_self_attn_layernorm.weight"),
    (r"\.post_ffn_norm\.weight$", ".post_mlp_layernorm.weight"),
    # Persimmon's fused q/k/v and MLP (model/phi.py: split as GPT-NeoX's)
    (r"\.self_attn\.query_key_value\.", ".self_attn.qkv_proj."),
    (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."), (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj."),
    # XGLM's norms and MLP (model/positions.py: OPT's names under `model.`)
    (r"^model\.layer_norm\.", "model.norm."), (r"\.self_attn_layer_norm\.", ".input_layernorm."),
    (r"\.final_layer_norm\.", ".post_attention_layernorm."),
    (r"^(model\.layers\.\d+)\.fc1\.", r"\1.mlp.up_proj."),
    (r"^(model\.layers\.\d+)\.fc2\.", r"\1.mlp.down_proj."),
    # RecurrentGemma's (model/recurrent_gemma.py): its norms, attention, MLP, the final norm
    (r"\.temporal_pre_norm\.", ".input_layernorm."),
    (r"\.channel_pre_norm\.", ".post_attention_layernorm."), (r"\.mlp_block\.", ".mlp."),
    (r"\.temporal_block\.([qkvo])_proj\.", r".self_attn.\1_proj."),
    (r"^model\.final_norm\.weight$", "model.norm.weight"),
    # Flint's attention sinks, as gpt-oss's (model/flint.py)
    (r"\.self_attn\.softmax_offset$", ".self_attn.sinks"),
))  # fmt: skip


_LAYER = re.compile(r"^(model\.layers\.)(\d+)(\..*)$")
_NAMES = re.compile(r"(?<![\w./])(?:model\.[\w.]*\w|lm_head\.\w+)")


def _text_name(stored: str) -> str | None:
    if stored.startswith(_SKIP) or stored.endswith(_BUFFERS):
        return None
    if stored.startswith("rwkv.") or stored == "head.weight":  # RWKV's (model/rwkv_config.py)
        from pagoda.runtime.model.rwkv_config import rwkv_name

        return rwkv_name(stored)
    if stored.startswith(("backbone.blocks.", "backbone.out_norm.")):  # xLSTM's
        from pagoda.runtime.model.xlstm_config import xlstm_name

        return xlstm_name(stored)
    if stored.startswith("backbone."):  # Nemotron-H's names (model/nemotron_h_config.py)
        from pagoda.runtime.model.nemotron_h_config import nemotron_name

        return nemotron_name(stored)
    for old, new in _PREFIXES:
        if stored.startswith(old):
            return new + stored[len(old) :]
    if _BARE.match(stored):
        stored = "transformer." + stored
    elif stored.startswith("decoder.") or _BARE_MODEL.match(stored):
        stored = "model." + stored
    renames = _RENAMES if stored.startswith("transformer.") else _PHI_RENAMES
    if stored.startswith(("gpt_neox.", "gpt_neox_japanese.", "embed_out.")):
        renames = _NEOX_RENAMES
    if stored.startswith("model.decoder."):
        renames = _OPT_RENAMES
    for pattern, new in renames:
        stored = pattern.sub(new, stored)
    return stored


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The weight files holding the checkpoint (module docstring): safetensors, else PyTorch
    pickles; ValueError if none."""
    index = model_dir / INDEX
    if index.exists():
        return _indexed(index)
    single = model_dir / "model.safetensors"
    files = [single] if single.exists() else sorted(model_dir.glob("*.safetensors"))
    if files:
        return files
    if (model_dir / BIN_SINGLE).is_file():  # transformers' order: the single file first
        return [model_dir / BIN_SINGLE]
    if (model_dir / BIN_INDEX).exists():
        return _indexed(model_dir / BIN_INDEX)
    raise ValueError(f"{model_dir} has no *.safetensors files (nor {BIN_SINGLE})")


def has_weight_files(model_dir: Path) -> bool:
    """Whether the directory holds weight files `checkpoint_files` reads (else a config alone)."""
    return any((model_dir / n).exists() for n in (INDEX, BIN_INDEX, BIN_SINGLE)) or any(
        model_dir.glob("*.safetensors")
    )


def _indexed(index: Path) -> list[Path]:
    """The shards an index's weight_map names; ValueError where it is unreadable or one is
    missing."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{index.name} is unreadable or has no weight_map: {e}") from e
    files = [index.parent / f for f in names]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise ValueError(f"{index.name} names shards that are not there: {', '.join(missing)}")
    return files


def _open(file: Path):
    """A file's tensors by name: safetensors' `safe_open`, or a pickle's (`PickleFile`)."""
    if file.suffix == ".bin":
        return PickleFile(file)
    from safetensors import safe_open

    return safe_open(str(file), framework="pt")


class SafetensorsWeights(Mapping):
    """name -> tensor as stored (its dtype), read on access (module docstring); from
    safetensors files or PyTorch pickles alike."""

    def __init__(self, files: list[Path]) -> None:
        # an FP8 checkpoint's block-wise scale tile [rows, cols] (the loader sets it from
        # config.json's quantization_config): how its weights are dequantized
        self.fp8_block: tuple[int, int] | None = None

        self._handles = [_open(Path(f)) for f in files]
        self._where: dict[str, tuple[int, str]] = {}  # name -> (handle, stored name)
        # a `split_rows` part -> its rows: (start, stop) ranges of the stored tensor, in order
        self._rows: dict[str, tuple[tuple[int, int], ...]] = {}
        # names stored as [in, out] (GPT-2's Conv1D): read transposed; their `split_rows`
        # parts are ranges of the stored columns
        self._transposed: set[str] = set()
        # `split_rows` parts read transposed after their rows are cut (DBRX's w2: [N, K] rows
        # of each expert, read [K, N])
        self._parts_transposed: set[str] = set()
        # a `join`ed tensor -> its stored parts' (handle, stored name), by group, and whether
        # the groups are stacked (MiniMax-M3's published per-expert w1/w3 as gate_up_proj)
        self._joined: dict[str, tuple[tuple[tuple[tuple[int, str], ...], ...], bool]] = {}
        for i, handle in enumerate(self._handles):
            for stored in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                name = _text_name(stored)
                if name is not None:
                    self._where[name] = (i, stored)

    @classmethod
    def open(cls, model_dir: Path) -> SafetensorsWeights:
        return cls(checkpoint_files(Path(model_dir)))

    def tensors_under(self, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The stored tensors whose names start with one of `prefixes`, by stored name, read
        now: those the text model's names leave out (a vision tower's, its projector's)."""
        return {
            stored: handle.get_tensor(stored)
            for handle in self._handles
            for stored in handle.keys()  # noqa: SIM118 - safe_open is not iterable
            if stored.startswith(prefixes)
        }

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._joined:  # its parts copied into one tensor, one part at a time
            groups, stacked = self._joined[name]
            first = self._handles[groups[0][0][0]].get_tensor(groups[0][0][1])
            shape = self.dtype_and_shape(name)[1]
            out = torch.empty(shape, dtype=first.dtype)
            for g, group in enumerate(groups):
                row, dest = 0, out[g] if stacked else out
                for i, stored in group:
                    part = first if (g, row) == (0, 0) else self._handles[i].get_tensor(stored)
                    dest[row : row + part.shape[0]].copy_(part)
                    row += part.shape[0]
            return out
        i, stored = self._where[name]
        if name in self._transposed:
            if name in self._rows:  # these columns of the stored [in, out] matrix
                part = self._handles[i].get_slice(stored)
                pieces = [part[:, start:stop] for start, stop in self._rows[name]]
                whole = torch.cat(pieces, dim=1)
            else:
                whole = self._handles[i].get_tensor(stored)
            return whole.t().contiguous()
        if name in self._rows:  # only these rows are read
            part = self._handles[i].get_slice(stored)
            pieces = [part[start:stop] for start, stop in self._rows[name]]
            rows = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
            return rows.t().contiguous() if name in self._parts_transposed else rows
        return self._handles[i].get_tensor(stored)

    def transpose(self, names) -> None:
        """Read the matrices `names` (those listed) transposed: stored [in, out] as GPT-2's
        Conv1D keeps them, listed [out, in] as every other linear layer's."""
        for name in names:
            if name in self._where and len(self._stored_shape(name)) == 2:
                self._transposed.add(name)

    def _stored_shape(self, name: str) -> list[int]:
        i, stored = self._where[name]
        return list(self._handles[i].get_slice(stored).get_shape())

    def rows(self, name: str, n: int) -> torch.Tensor:
        """The first `n` rows of tensor `name`, read alone."""
        i, stored = self._where[name]
        if name in self._rows or name in self._transposed or name in self._joined:
            return self[name][:n]
        return self._handles[i].get_slice(stored)[:n]

    def part(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """[start, stop) of tensor `name` along `dim`, only those elements read from the file
        (a rank's share of a stacked expert tensor never reads the rest); a tensor listed
        through `split_rows`, `transpose` or `join`: read whole, then cut."""
        if name in self._rows or name in self._transposed or name in self._joined:
            return self[name].narrow(dim, start, stop - start)
        i, stored = self._where[name]
        return self._handles[i].get_slice(stored)[(slice(None),) * dim + (slice(start, stop),)]

    def split_rows(
        self, fused: str, parts: list[tuple[str, int, int]], transposed: bool = False
    ) -> None:
        """List the stored tensor `fused` as the tensors `parts` (name, first row, end row),
        each read alone (Phi-3's fused qkv_proj as q_proj, k_proj, v_proj); `fused` is no
        longer listed. ValueError where the rows do not tile it. A name given more than once
        is its ranges joined in order (Falcon's q/k/v interleaved by head group). With
        `transposed`, each part is read transposed once cut (of a 2-D `fused` stored as read)."""
        i, stored = self._where[fused]
        stored_t = fused in self._transposed  # (GPT-2's Conv1D: parts are stored columns)
        rows = self._handles[i].get_slice(stored).get_shape()[1 if stored_t else 0]
        edges = [0] + [stop for _, _, stop in parts]
        if [start for _, start, _ in parts] != edges[:-1] or edges[-1] != rows:
            names = ", ".join(dict.fromkeys(n for n, _, _ in parts))
            raise ValueError(f"checkpoint tensor {fused} has {rows} rows; {names} need "
                             f"{edges[-1]}")  # fmt: skip
        del self._where[fused]
        self._transposed.discard(fused)
        ranges: dict[str, list[tuple[int, int]]] = {}
        for name, start, stop in parts:
            ranges.setdefault(name, []).append((start, stop))
        for name, spans in ranges.items():
            self._where[name] = (i, stored)
            self._rows[name] = tuple(spans)
            if stored_t:
                self._transposed.add(name)
            elif transposed:
                self._parts_transposed.add(name)

    def join(self, new: str, groups: list[list[str]], stacked: bool) -> None:
        """List the stored tensors `groups` as one tensor `new`: each group's concatenated
        along rows, the groups stacked (`stacked`: [len(groups), ...]) or the one group alone
        (MiniMax-M3's published per-expert `w1` and `w3` as the stacked `experts.gate_up_proj`
        [E, 2N, K], its split `gate_proj` and `up_proj` as the fused `gate_up_proj`); the parts
        are no longer listed, read when `new` is. ValueError, one line, where a part is not
        there or the parts' dtypes or shapes do not join."""
        for name in (n for g in groups for n in g):
            if name not in self._where or name in self._rows or name in self._transposed:
                raise ValueError(f"checkpoint tensor {name} is missing (for {new})")
        kinds = {self.dtype_and_shape(n)[0] for g in groups for n in g}
        shapes = [[self.dtype_and_shape(n)[1] for n in g] for g in groups]
        rows = [sum(s[0] for s in g) for g in shapes]
        rest = {tuple(s[1:]) for g in shapes for s in g}
        if len(kinds) > 1 or len(rest) > 1 or len(set(rows)) > 1:
            raise ValueError(f"checkpoint tensors {groups[0][0]}, ... do not join as {new}: "
                             f"dtypes {sorted(kinds)}, shapes {shapes[0]}, ...")  # fmt: skip
        self._joined[new] = (tuple(tuple(self._where.pop(n) for n in g) for g in groups), stacked)
        self._where[new] = self._joined[new][0][0][0]  # (its first part: `stored_name`)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def list_skipped(self, names: set[str]) -> None:
        """List the stored tensors `names` that the prefixes of the multimodal parts leave out
        (Gemma 3n's embedders of image and audio token ids: `gemma3n_config.list_embedders`)."""
        for i, handle in enumerate(self._handles):
            for stored in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                if stored in names:
                    self._where[stored] = (i, stored)

    def rename(self, name: str, new: str) -> None:
        """List tensor `name` as `new` (Qwen3.5-MoE's stacked experts, stored without a
        `.weight`, under the name `moe.SparseMoE` reads stacked experts by)."""
        self._where[new] = self._where.pop(name)
        if name in self._joined:
            self._joined[new] = self._joined.pop(name)
        if name in self._rows:
            self._rows[new] = self._rows.pop(name)
        if name in self._transposed:
            self._transposed.discard(name)
            self._transposed.add(new)

    def rename_all(self, moves: dict[str, str]) -> None:
        """`rename` each tensor of `moves` (name -> new name), in two passes: one tensor's new
        name may be another's old one (Dory's and Ergo's renames)."""
        for name, new in moves.items():
            self.rename(name, "\0" + new)
        for new in moves.values():
            self.rename("\0" + new, new)

    def rename_by(self, renames) -> None:
        """List each tensor under its name with the regex substitutions `renames` ((pattern,
        replacement) pairs, in turn) applied, where that changes it (HY V4's, GLM-5-Next's and
        BailingHybrid's transformers renames)."""
        for name in list(self):
            new = name
            for pattern, repl in renames:
                new = pattern.sub(repl, new)
            if new != name:
                self.rename(name, new)

    def stored_name(self, name: str) -> str:
        """What the files call tensor `name` (the text model's Llama-style name the engine
        reads): its stored name where it is there (a `split_rows` part's: the fused tensor's);
        for a layer's tensor that is not, another layer's stored name with this layer's number
        (Falcon's `transformer.h.1.self_attention.query_key_value.weight` for a missing
        `model.layers.1.self_attn.qkv_proj.weight`); else `name`."""
        if name in self._where:
            return self._where[name][1]
        m = _LAYER.match(name)
        seen = None if m is None else self._layer_names().get(f"{m[1]}{{}}{m[3]}")
        if seen is None:
            return name
        number, stored = seen
        return re.sub(rf"(?<=\.){number}(?=\.)", m[2], stored, count=1)

    def _layer_names(self) -> dict[str, tuple[str, str]]:
        """A layer's tensor name with its number as "{}" -> (a number, that layer's stored
        name), over every stored tensor (the fused ones `split_rows` no longer lists too; a
        `rename`d one under its new name: Kolibri 1's published norms)."""
        out: dict[str, tuple[str, str]] = {}
        for name, (_, stored) in self._where.items():
            if m := _LAYER.match(name):
                out.setdefault(f"{m[1]}{{}}{m[3]}", (m[2], stored))
        for handle in self._handles:
            for stored in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                name = _text_name(stored)
                if name is not None and (m := _LAYER.match(name)):
                    out.setdefault(f"{m[1]}{{}}{m[3]}", (m[2], stored))
        return out

    def in_stored_names(self, message: str) -> str:
        """`message` with the tensor names in it (``model.…``, ``lm_head.…``) as the files call
        them (`stored_name`): what a user finds in the checkpoint's index."""
        return _NAMES.sub(lambda m: self.stored_name(m[0]), message)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def dtype_and_shape(self, name: str) -> tuple[str, list[int]]:
        """The stored dtype ("BF16", "F32", ...) and shape, without reading the tensor."""
        if name in self._joined:
            groups, stacked = self._joined[name]
            shapes = [self._handles[i].get_slice(s).get_shape() for i, s in groups[0]]
            kind = self._handles[groups[0][0][0]].get_slice(groups[0][0][1]).get_dtype()
            shape = [sum(s[0] for s in shapes), *shapes[0][1:]]
            return kind, [len(groups), *shape] if stacked else shape
        i, stored = self._where[name]
        s = self._handles[i].get_slice(stored)
        shape = list(s.get_shape())
        if name in self._transposed:
            shape = shape[::-1]
        if name in self._rows:
            shape[0] = sum(stop - start for start, stop in self._rows[name])
        if name in self._parts_transposed:
            shape = shape[::-1]
        return s.get_dtype(), shape

    def blocks(self) -> Dense16Blocks:
        return Dense16Blocks(self)


class Dense16Blocks(Mapping):
    """The float16/bfloat16 matrices as 16-bit `QuantizedWeight`s (read in place by `qgemm` in
    float32 CPU models), built on access: a GPU or bf16 load reads none of them twice."""

    def __init__(self, weights: SafetensorsWeights) -> None:
        self._w = weights
        self._names = [
            n
            for n in weights
            if n.endswith(".weight")
            and (shape := weights.dtype_and_shape(n))[0] in ("F16", "BF16")
            and len(shape[1]) == 2
        ]
        self._set = set(self._names)

    def __getitem__(self, name: str) -> QuantizedWeight:
        if name not in self._set:
            raise KeyError(name)
        q = from_dense(self._w[name])
        if q is None:
            raise KeyError(name)
        return q

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:
        return name in self._set

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

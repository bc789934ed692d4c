"""What an engine's config asks of its model, checked before anything is built: each refusal a
ValueError of one line (`pagoda serve` checks the same in its start-up, `server/launch.py`).

The dtype, FP8-weights and KV-cache flags a family is not tested with (`family_options.py`),
block sizes a family's windows need, a `max_model_len` past the model's context, and speculative
decoding where rejected drafts would stay in a model's state or a draft model does not fit.
"""

from __future__ import annotations

import torch
from pagoda.runtime import family_options
from pagoda.runtime.config import EngineConfig, ModelConfig
from pagoda.runtime.engine import recurrent
from pagoda.runtime.model.loader import read_model_config
from pagoda.runtime.spec.draft_model import check_draft

_SPEC_STATE = (
    "speculative decoding is not supported for {} (a model that keeps per-sequence state "
    "beyond its KV cache cannot roll rejected drafts back): drop --speculative-config"
)


def check_speculative(config: EngineConfig, model: ModelConfig) -> ModelConfig | None:
    """ValueError, one line, where speculative decoding is asked for a model whose layers keep
    a recurrent state (Mamba hybrids, RWKV, xLSTM, RecurrentGemma) or per-sequence windows
    (DeepSeek-V4): rejected drafts would stay in that state. The same for a draft model, which
    must also fit the target (`spec.draft_model.check_draft`; its path read here, its config
    returned for the start-up's fit and memory checks; None without a draft model)."""
    spec = config.speculative_config
    if spec is None:
        return None
    draft = None if spec.draft_model is None else read_draft_config(spec.draft_model)
    for mc in (model,) if draft is None else (model, draft):
        if recurrent.keeps_state(mc) or mc.family.dsv4 is not None:
            raise ValueError(_SPEC_STATE.format(mc.architecture))
    if draft is not None:
        check_draft(config, model, draft)
        check_dtype(config, draft)
    return draft


def read_draft_config(path: str) -> ModelConfig:
    """The draft model's config; its path's or config's error named as the draft's."""
    try:
        return read_model_config(path)
    except ValueError as e:
        raise ValueError(f"speculative_config: the draft model: {e}") from None


def check_max_model_len(asked: int | None, model: ModelConfig) -> int:
    """The sequence length the engine serves: `asked`, or the model's context length when left
    out; more than the context is refused, as vLLM does (the RoPE past it is untrained)."""
    context = model.context_length
    if asked is not None and asked > context:
        raise ValueError(
            f"max_model_len {asked} is more than the model's context length ({context} tokens, "
            "from its metadata); lower --max-model-len"
        )
    return context if asked is None else asked


# what of an EngineConfig asks for each option `family_options` declares (its message's values),
# None where it is not asked; read only for a family not tested with the option
ENGINE_OPTIONS = {
    "float16": lambda c: {} if c.torch_dtype() == torch.float16 else None,
    "fp8": lambda c: {} if c.quantization == "fp8" else None,
    "kv_cache": lambda c: (
        {"kv": c.cache.kv_cache_dtype} if c.cache.kv_cache_dtype != "auto" else None
    ),
}


def check_dtype(config: EngineConfig, model: ModelConfig) -> None:
    """ValueError, one line, for a dtype, FP8-weights or KV-cache flag the model's family is not
    tested with (`family_options.py`: Gemma 2's to 4's activations overflow float16, as
    vLLM refuses them; FP8 GEMMs and FP8/int8 KV caches untested for some families)."""
    row = family_options.UNTESTED.get(model.architecture)
    for option in () if row is None else row.options:
        asked = ENGINE_OPTIONS[option](config) if option in ENGINE_OPTIONS else None
        if asked is not None:
            family_options.refuse(model.architecture, option, **asked)


def check_block_size(config: EngineConfig, model: ModelConfig) -> None:
    """ValueError, one line, where the family needs blocks that end on its windows'
    boundaries (DeepSeek-V4's compress rates: model/dsv4_engine.py) and `--block-size` does not."""
    if model.family.dsv4 is not None:
        from pagoda.runtime.model.dsv4_engine import check_block_size as dsv4_blocks

        dsv4_blocks(model.family.dsv4, config.cache.block_size)

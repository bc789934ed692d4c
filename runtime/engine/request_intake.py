"""A request's way into `EngineCore`: its checks (ValueError naming the field), its bad words
as token ids, and its `n` samples (`Request`s: ids, seeds, prefix-cache salt, whether each
takes drafts). `EngineCore.add_request` then hands them to the scheduler and the hooks.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pagoda.runtime.engine import recurrent
from pagoda.runtime.engine.info import longest_prompt, not_generated, token_ids_in_range, too_long
from pagoda.runtime.lora import engine as lora
from pagoda.runtime.model import longrope
from pagoda.runtime.multimodal import inputs as mm_inputs
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.bad_words import BadWords, bad_words_token_ids
from pagoda.runtime.sampling.params import SamplingParams, sample_seed

if TYPE_CHECKING:
    from pagoda.runtime.engine.core import EngineCore


def validate(
    core: EngineCore, prompt_token_ids: Sequence[int], params: SamplingParams
) -> SamplingParams:
    """Raise ValueError (naming the field) for input `core` cannot serve; returns the params
    validated as they are now (a copy: SamplingParams are mutable, as vLLM's)."""
    if not isinstance(params, SamplingParams):
        raise ValueError("params must be a SamplingParams")
    params = params.validated()
    if len(prompt_token_ids) == 0:
        raise ValueError("prompt must not be empty")
    runner = getattr(getattr(core, "config", None), "runner", "generate")
    if len(prompt_token_ids) > longest_prompt(core.max_model_len, runner):
        raise ValueError(too_long(len(prompt_token_ids), core.max_model_len, runner))
    mc = core.model_config
    vocab = mc.vocab_size
    if not token_ids_in_range(prompt_token_ids, vocab):
        raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
    if params.logit_bias and params.logit_bias[-1][0] >= vocab:  # sorted by id
        raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
    if params.allowed_token_ids is not None and max(params.allowed_token_ids) >= vocab:
        raise ValueError(f"allowed_token_ids must be in [0, {vocab})")
    if not_generated(params.allowed_token_ids, mc.family.head_rows):
        raise ValueError("allowed_token_ids holds no id this model generates: its LM head "
                         f"scores [0, {mc.family.head_rows})")  # fmt: skip
    if params.stop_token_ids and max(params.stop_token_ids) >= vocab:
        raise ValueError(f"stop_token_ids must be in [0, {vocab})")
    if params.structured_outputs is not None:  # offline: compiled here (server: before)
        compile_grammar(core, params.structured_outputs)
    if params.multi_modal is not None:  # images: a vision model's, each over its placeholders
        limits = core.config.limit_mm_per_prompt
        mm_inputs.check(prompt_token_ids, params.multi_modal, mc.vision, limits["image"],
                        core.config.scheduler.max_num_batched_tokens, limits["video"])  # fmt: skip
    return params


def compile_grammar(core: EngineCore, spec: object) -> None:
    """Compile (or find cached) a structured-output spec's grammar; ParamError if bad."""
    from pagoda.runtime.structured.compiler import compiler_for

    compiler_for(core.tokenizer, core.model_config.vocab_size).compile(spec)


def bad_words_of(core: EngineCore, params: SamplingParams) -> BadWords:
    """`params.bad_words` as token ids: the server's (`bad_words_token_ids`, checked against
    the vocabulary here) or tokenized now (offline)."""
    vocab = core.model_config.vocab_size
    bad_words = params.bad_words_token_ids
    if bad_words is None:
        bad_words = bad_words_token_ids(params.bad_words, core.tokenizer, vocab)
    elif any(not 0 <= t < vocab for ids in bad_words for t in ids):
        raise ValueError(f"bad_words_token_ids must be in [0, {vocab})")
    return bad_words


def samples(
    core: EngineCore,
    request_id: str,
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    bad_words: BadWords,
    bulk: bool,
) -> list[Request]:
    """One `Request` per sample (`n`): `request_id` itself for one, `request_id#i` for
    several, each with its own seed drawn from the request's (`bulk` with several)."""
    config, mc = core.config, core.model_config
    salt = None
    # siblings share their prompt's blocks, except a hybrid's without prefix caching: a
    # cached block does not hold its Mamba layers' state, only a snapshot does
    # (`engine/recurrent.py`), so each sibling prefills its own
    if (params.n > 1 and not config.cache.enable_prefix_caching
            and not recurrent.keeps_state(mc)):  # fmt: skip
        salt = hashlib.blake2b(request_id.encode(), digest_size=16).digest()
    elif config.cache.enable_prefix_caching:  # a longrope prompt past its original context
        salt = longrope.cache_salt(mc.rope_scaling, len(prompt_token_ids))
    if config.cache.enable_prefix_caching:  # an adapter's KV is its own
        salt = lora.lora_salt(salt, params.lora_request)
    drafter = core.drafter
    reqs = []
    for i in range(params.n):
        child_params = params
        if params.n > 1 and params.seed is not None:
            child_params = copy.copy(params)  # no second __post_init__: its seed -1
            child_params.seed = sample_seed(params.seed, i)  # is a seed, not "none"
        cid = request_id if params.n == 1 else f"{request_id}#{i}"
        reqs.append(
            req := Request(
                cid,
                list(prompt_token_ids),
                child_params,
                cache_salt=salt,
                eos_token_ids=mc.eos_token_ids,
                max_model_len=core.max_model_len,
                bad_words=bad_words,
                bulk=bulk or params.n > 1,
            )
        )
        req.takes_drafts = drafter is not None and drafter.takes_drafts(req)
    return reqs

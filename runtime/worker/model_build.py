"""The runner's models on its device: the target's (and a draft model's) weights built with an
attention backend for this rank's heads, FP8 where the device has the kernels, and a log line
saying which linear layers run quantized (it sets decode speed).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pagoda.runtime.attention import AttentionBackend, get_attention_backend
from pagoda.runtime.config import fp8_runs_on
from pagoda.runtime.model import alibi, registry
from pagoda.runtime.model.ops import select_ops
from pagoda.runtime.quantization.fp8 import check_checkpoint_form, engine_scheme
from pagoda.runtime.spec.draft_model import check_built

if TYPE_CHECKING:
    from pagoda.runtime.config import ModelConfig
    from pagoda.runtime.model.llama import LlamaModel
    from pagoda.runtime.model.loader import LoadedModel
    from pagoda.runtime.worker.model_runner import ModelRunner

log = logging.getLogger(__name__)


def attention_backend(
    runner: ModelRunner, mc: ModelConfig, whole: bool = False
) -> AttentionBackend:
    """The attention backend of model `mc` (the target's or the draft's) for this rank's
    heads (tensor parallel: its share of them; layout.py replicates KV heads when there
    are fewer than ranks); `whole`: all of its heads (a draft model, whole on rank 0)."""
    config, tp = runner.config, None if whole else runner.tp
    heads, kv_heads = mc.num_heads, mc.num_kv_heads
    if tp is not None:
        heads, kv_heads = tp.layout.local_heads(heads, kv_heads)
    # ALiBi's slopes of this rank's heads (BLOOM, MPT; None for other models)
    slopes = alibi.slopes(mc, None if tp is None else tp.layout.heads(mc.num_heads))
    images = config.limit_mm_per_prompt["image"]
    return get_attention_backend(
        config.attention_backend,
        runner.device,
        heads,
        kv_heads,
        mc.head_dim,
        mc.family.attention_scale(mc.head_dim),
        batch_invariant=config.batch_invariant,
        kv_cache_dtype=config.cache.kv_cache_dtype,
        sliding_window=mc.family.sliding_window,
        softcap=mc.family.attn_logit_softcapping,
        sinks=mc.family.attention_sinks,
        latent=None if mc.family.mla is None else mc.family.mla.kv_lora_rank,
        alibi_slopes=None if slopes is None else slopes.to(runner.device),
        rel_logits=mc.family.relative_logits,
        # (Gemma 3's images: Triton's prefill kernel, the torch backend's mask, not the CPU
        # kernel; `--limit-mm-per-prompt '{"image": 0}'` serves text only, on that kernel)
        image_spans=mc.vision is not None and mc.vision.bidirectional and images > 0,
    )


def build_model(
    runner: ModelRunner,
    loaded: LoadedModel,
    max_model_len: int,
    backend: AttentionBackend,
    whole: bool = False,
) -> LlamaModel:
    """The model on the runner's device, FP8 where the device has the kernels (an FP8
    checkpoint is dequantized at load where it has not); this rank's share of it in a
    tensor-parallel group, or with `whole` all of it (a draft model)."""
    mc, config, device = loaded.config, runner.config, runner.device
    check_checkpoint_form(config.quantization, loaded.path)
    fp8 = engine_scheme(config.quantization, loaded.fp8_scheme, fp8_runs_on(device))
    if loaded.fp8_scheme is not None and fp8 is None:
        log.info("FP8 checkpoint: no FP8 kernels on %s, weights dequantized to %s at load",
                 device, runner.dtype)  # fmt: skip
    return registry.build_model(
        mc,
        loaded.weights,
        quantized=loaded.quantized,
        dtype=runner.dtype,
        device=device,
        backend=backend,
        ops=select_ops(device, backend.name),
        # the rotary tables cover the positions served, not the whole context: Llama 4
        # Scout's 10M positions would be 5.4 GB of float32 rows at head size 128
        max_positions=max_model_len,
        batch_invariant=config.batch_invariant,
        tp=None if whole else runner.tp,
        fp8=fp8,
        check_weights=config.check_weights,
    )


def build_draft(runner: ModelRunner, draft: LoadedModel, max_model_len: int) -> LlamaModel:
    """The draft model's weights on the runner's device, with its own attention backend: all
    of it, in a tensor-parallel group too, where only rank 0 holds it (the other ranks neither
    schedule nor sample: they run the target's forward of each step only, `worker_proc.py`),
    so its forwards take no collective."""
    backend = attention_backend(runner, draft.config, whole=True)
    net = build_model(runner, draft, max_model_len, backend, whole=True)
    check_built(draft.name, net)
    log.info("speculative decoding: draft model %s (%s, %d layers) drafts %d tokens a step",
             draft.name, draft.config.architecture, draft.config.num_layers,
             runner.config.speculative_config.num_speculative_tokens)  # fmt: skip
    return net


def log_quantized_layers(model: LlamaModel) -> None:
    """Say when linear layers run in FP8, or multiply by stored blocks (float32 CPU models):
    it sets decode speed."""
    from pagoda.runtime.cpu.qgemm import QGemmWeight

    layers = model.linears()
    fp8 = [x for x in layers if hasattr(x, "weight_scale")]  # `fp8_linear.Fp8Linear`
    if fp8:
        log.info("%d of %d linear layers run in FP8 (%.0f MB of E4M3 weights and scales)",
                 len(fp8), len(layers), sum(x.nbytes for x in fp8) / 1e6)  # fmt: skip
    on_blocks = [x.fast for x in layers if isinstance(x.fast, QGemmWeight)]
    if on_blocks:
        mb = sum(w.nbytes for w in on_blocks) / 1e6
        kinds = sorted({k for w in on_blocks for k in w.kinds})
        log.info(
            "%d of %d linear layers multiply by their stored %s weights (%.0f MB a step; "
            "PAGODA_CPU_QGEMM=0 uses float32 copies)",
            len(on_blocks),
            len(layers),
            "/".join(kinds),
            mb,
        )

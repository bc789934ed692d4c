"""`PoolerConfig` (vLLM's ``--pooler-config`` JSON) and which runner a checkpoint gets.

``--runner auto`` (the default) serves a checkpoint as an embedding model (``pooling``) when it
says it is one, else as a generator (``generate``):
- a sentence-transformers layout: ``modules.json`` naming a ``Pooling`` module whose
  ``1_Pooling/config.json`` (the module's folder) sets ``pooling_mode_lasttoken``,
  ``pooling_mode_mean_tokens`` or ``pooling_mode_cls_token`` (LAST, MEAN, CLS; a ``Normalize``
  module: normalized) - the published Qwen3-Embedding layout;
- or config.json's ``architectures`` naming a bare decoder (``Qwen3Model``, ``LlamaModel``,
  ``Qwen2Model``, ``MistralModel``: no LM head) rather than a ``*ForCausalLM``;
- or naming an encoder (``BertModel``, ``RobertaModel``, ``XLMRobertaModel``: `ENCODERS`,
  bidirectional attention, model/bert.py), served by the pooling runner only.
Without a sentence-transformers layout a pooling model pools LAST and normalizes (vLLM's
default for decoder embedding models), an encoder CLS, normalized (vLLM's for BERT-like
models). ``--pooler-config`` keys override the checkpoint's. An encoder's prompts are each
computed whole in one step (`with_runner`: chunked prefill off, as prefix caching is for
every pooling model): its attention reads the whole prompt from every row.

Matryoshka models (config.json ``is_matryoshka`` / ``matryoshka_dimensions``, vLLM's names) may
be asked for fewer ``dimensions``: the pooler config's (every request) or a request's own.

Standard library only (and `option_rules`, which is too: the flag's JSON is read by its
`json_object`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagoda.runtime.option_rules import json_object

POOLING_TYPES = ("LAST", "MEAN", "CLS")
# the user's keys (vLLM's names); the rest of the fields come from the checkpoint
USER_KEYS = ("pooling_type", "normalize", "dimensions")
# config.json architectures of bare decoders (no LM head): embedding checkpoints
BARE_DECODERS = {
    "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM",
    "Qwen2Model": "Qwen2ForCausalLM",
    "Qwen3Model": "Qwen3ForCausalLM",
}
# config.json architectures of the encoders served (bidirectional attention, pooling runner
# only: model/bert.py) -> `ModelConfig.architecture`
ENCODERS = {"BertModel": "bert", "RobertaModel": "roberta", "XLMRobertaModel": "roberta",
            "ModernBertModel": "modernbert"}  # fmt: skip
# the cross-encoders served (an encoder with a one-label classifier head: a pair's score, the
# score and rerank APIs only; model/bert.py)
CROSS_ENCODERS = {"BertForSequenceClassification": "bert",
                  "RobertaForSequenceClassification": "roberta",
                  "XLMRobertaForSequenceClassification": "roberta",
                  "ModernBertForSequenceClassification": "modernbert"}  # fmt: skip
ENCODERS.update(CROSS_ENCODERS)
# decoders served as sequence classifiers (a `score` head on the last token's row, or
# Qwen3-Reranker's yes/no rows of its LM head: model/classifier_config.py) -> the generator's
# architecture, whose family reads them
DECODER_CLASSIFIERS = {
    "Qwen3ForSequenceClassification": "Qwen3ForCausalLM",
    "Qwen2ForSequenceClassification": "Qwen2ForCausalLM",
    "LlamaForSequenceClassification": "LlamaForCausalLM",
    "MistralForSequenceClassification": "MistralForCausalLM",
    "GemmaForSequenceClassification": "GemmaForCausalLM",  # (bge-reranker-v2-gemma's)
}
# every sequence classifier served (the pooling runner; the head after pooling)
CLASSIFIERS = {**CROSS_ENCODERS, **DECODER_CLASSIFIERS}
# other encoder-only checkpoints: refused, by their architectures (the masked-LM heads'
# checkpoints, DistilBERT's, MPNet's
# relative buckets, DeBERTa's disentangled attention, ELECTRA's, Nomic's and Alibaba's GTE code)
ENCODER_ONLY = frozenset({
    "BertForMaskedLM", "RobertaForMaskedLM", "XLMRobertaForMaskedLM", "ModernBertForMaskedLM", "DistilBertModel", "MPNetModel", "DebertaV2Model", "ElectraModel",
    "NomicBertModel", "NewModel", "GteModel",
})  # fmt: skip
# sentence-transformers' 1_Pooling/config.json keys -> our pooling types
_ST_MODES = {
    "pooling_mode_lasttoken": "LAST",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
}


@dataclass(frozen=True)
class PoolerConfig:
    """How a pooling model turns a prompt's final-norm hidden states into one vector:
    ``pooling_type`` LAST (the last prompt token's row), MEAN (the mean over the prompt's rows)
    or CLS (the first row); ``normalize``: to unit L2 norm; ``dimensions``: the first that many
    components (then normalized), Matryoshka models only. ``matryoshka`` /
    ``matryoshka_dimensions`` are the checkpoint's (config.json), never the user's."""

    pooling_type: str | None = None  # None: the checkpoint's, else LAST
    normalize: bool | None = None  # None: the checkpoint's, else true
    dimensions: int | None = None
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    # the checkpoint's: a sequence classifier (`CROSS_ENCODERS`), whose "vector" is its labels'
    # probabilities (`model/classifier_head.py`): one label, a cross-encoder's pair score
    cross_encoder: bool = False
    # a classifier's label names (config.json's id2label, in index order) and whether its labels
    # are independent (problem_type multi_label_classification: sigmoid, else softmax)
    labels: tuple[str, ...] = ()
    multi_label: bool = False
    # set by `resolve` alone: the checkpoint's fields are in and `dimensions` is checked against
    # them (a user's config naming every key is not: its dimensions are still to check)
    checked: bool = dataclasses.field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooler_config: pooling_type must be one of "
                             f"{', '.join(POOLING_TYPES)}, got {self.pooling_type!r}")  # fmt: skip
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"pooler_config: normalize must be true or false, got "
                             f"{self.normalize!r}")  # fmt: skip
        d = self.dimensions
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise ValueError(f"pooler_config: dimensions must be a positive integer, got {d!r}")

    @classmethod
    def parse(cls, value: Any) -> PoolerConfig | None:
        """A config from the flag's JSON text, a mapping (`LLM(pooler_config={...})`) or itself;
        None stays None. ValueError, one line, for anything else or unknown keys."""
        if value is None or isinstance(value, PoolerConfig):
            return value
        value = json_object("pooler_config", value, '{"pooling_type": "MEAN"}')
        unknown = sorted(set(value) - set(USER_KEYS))
        if unknown:
            raise ValueError(f"pooler_config: unknown or unsupported key(s) {', '.join(unknown)} "
                             f"(supported: {', '.join(USER_KEYS)})")  # fmt: skip
        value = dict(value)
        if isinstance(value.get("pooling_type"), str):
            value["pooling_type"] = value["pooling_type"].upper()
        return cls(**value)

    def user_keys(self) -> dict[str, Any]:
        """The keys the user gave (those not None)."""
        return {k: getattr(self, k) for k in USER_KEYS if getattr(self, k) is not None}

    def check_dimensions(self, dimensions: int, hidden_size: int) -> str | None:
        """Why `dimensions` cannot be served (one line), None when it can: a Matryoshka model,
        at most its width, one of its listed sizes when it lists them."""
        if not self.matryoshka:
            return ("dimensions is supported only by Matryoshka models (config.json "
                    "is_matryoshka or matryoshka_dimensions); this model has none")  # fmt: skip
        if not 1 <= dimensions <= hidden_size:
            return f"dimensions must be in [1, {hidden_size}], got {dimensions}"
        if self.matryoshka_dimensions and dimensions not in self.matryoshka_dimensions:
            sizes = ", ".join(map(str, self.matryoshka_dimensions))
            return f"dimensions {dimensions} is not one this model was trained for ({sizes})"
        return None


def check_not_encoder(architectures: list[str]) -> None:
    """ValueError, one line, for an encoder-only checkpoint not served (ModernBERT, DistilBERT,
    a masked-LM head's)."""
    enc = [a for a in architectures if a in ENCODER_ONLY]
    if enc:
        raise ValueError(f"{enc[0]} is an encoder-only model not supported; the pooling runner "
                         f"serves the encoders {', '.join(ENCODERS)} and decoder models "
                         "(Qwen3-Embedding, gte-Qwen2, e5-mistral)")  # fmt: skip


def encoder(config_json: Mapping[str, Any]) -> str | None:
    """The served encoder architecture a config.json names (`ENCODERS`), else None."""
    return next((a for a in config_json.get("architectures") or () if a in ENCODERS), None)


def _config_json(model_path: str | Path) -> dict[str, Any] | None:
    """A checkpoint directory's config.json, None for anything else (a GGUF file)."""
    path = Path(model_path)
    top = _read_json(path / "config.json") if path.is_dir() else None
    return top if isinstance(top, dict) else None


def sentence_transformers_pooling(model_dir: Path) -> dict[str, Any] | None:
    """The pooling of a sentence-transformers layout (`pooling_type`, `normalize`), None when
    the directory has none. ValueError, one line, for a Pooling module this runtime cannot run
    (several modes, weighted mean, max)."""
    modules = _read_json(model_dir / "modules.json")
    if not isinstance(modules, list):
        return None
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    pooling = kinds.get("Pooling")
    if pooling is None:
        return None
    cfg = _read_json(model_dir / str(pooling.get("path", "1_Pooling")) / "config.json")
    if not isinstance(cfg, dict):
        raise ValueError(f"{model_dir}: modules.json names a Pooling module without its config")
    modes = [t for k, t in _ST_MODES.items() if cfg.get(k)]
    other = sorted(k for k, v in cfg.items()
                   if k.startswith("pooling_mode_") and v and k not in _ST_MODES)  # fmt: skip
    if len(modes) != 1 or other:
        found = ", ".join(sorted(k for k, v in cfg.items() if k.startswith("pooling_mode_") and v))
        raise ValueError(f"{model_dir}: sentence-transformers pooling {found or 'none'} is not "
                         "supported (one of lasttoken, mean_tokens, cls_token)")  # fmt: skip
    extra = sorted(set(kinds) - {"Transformer", "Pooling", "Normalize"})
    if extra:
        raise ValueError(f"{model_dir}: sentence-transformers module(s) {', '.join(extra)} after "
                         "pooling are not supported (Transformer, Pooling, Normalize)")  # fmt: skip
    return {"pooling_type": modes[0], "normalize": "Normalize" in kinds}


def says_pooling(model_dir: Path, config_json: Mapping[str, Any]) -> bool:
    """Whether a checkpoint is an embedding model (`--runner auto`'s rule, module docstring)."""
    archs = config_json.get("architectures") or []
    if any(a in BARE_DECODERS or a in ENCODERS or a in CLASSIFIERS for a in archs):
        return True
    return sentence_transformers_pooling(model_dir) is not None


def resolve(runner: str, pooler: PoolerConfig | None, model_path: str | Path,
            hidden_size: int, config_json: Mapping[str, Any] | None = None,
            ) -> tuple[str, PoolerConfig | None]:  # fmt: skip
    """The concrete runner (``generate`` / ``pooling``) and, for pooling, the pooler config:
    the checkpoint's (sentence-transformers layout, Matryoshka fields) under the user's keys.
    ValueError, one line, for a pooler config on a generating runner or bad dimensions. A config
    `resolve` made (`checked`: a second call, EngineCore's after `pagoda serve`'s) is its own
    answer: no file is read again. `config_json`: the checkpoint's config.json where the caller
    read it already (`with_runner`); else it is read here."""
    if runner == "pooling" and pooler is not None and pooler.checked:
        return runner, pooler
    path = Path(model_path)
    model_dir = path if path.is_dir() else None
    top = (_config_json(path) or {}) if config_json is None else config_json
    if runner == "auto":
        runner = "pooling" if model_dir is not None and says_pooling(model_dir, top) else "generate"
    if runner == "generate":
        bare = [a for a in top.get("architectures") or [] if a in BARE_DECODERS]
        if bare:
            raise ValueError(f"{bare[0]} is a bare decoder without an LM head (an embedding "
                             "model): serve it with --runner pooling")  # fmt: skip
        classifier = [a for a in top.get("architectures") or [] if a in DECODER_CLASSIFIERS]
        if classifier:
            raise ValueError(f"{classifier[0]} is a sequence classifier (a score head, no LM "
                             "head): serve it with --runner pooling")  # fmt: skip
        if (enc := encoder(top)) is not None:
            raise ValueError(f"{enc} is an encoder (bidirectional attention, no LM "
                             "head): it generates nothing; serve it with --runner pooling")  # fmt: skip
        if pooler is not None:
            raise ValueError("pooler_config applies to the pooling runner only: add --runner "
                             "pooling, or drop --pooler-config")  # fmt: skip
        return runner, None
    cross = any(a in CLASSIFIERS for a in top.get("architectures") or ())
    if cross and pooler is not None:
        raise ValueError("a cross-encoder's pooling is its classifier's (its pooled row's score): "
                         "drop --pooler-config")  # fmt: skip
    fields: dict[str, Any] = {"pooling_type": "CLS" if encoder(top) else "LAST",
                              "normalize": not cross, "cross_encoder": cross}  # fmt: skip
    if cross:
        fields.update(classifier_fields(top))
        if top.get("classifier_pooling") == "mean":  # (ModernBERT's head reads the mean)
            fields["pooling_type"] = "MEAN"
    if model_dir is not None and not cross:
        fields.update(sentence_transformers_pooling(model_dir) or {})
    if pooler is not None:
        fields.update(pooler.user_keys())
    dims = top.get("matryoshka_dimensions") or ()
    fields["matryoshka"] = bool(top.get("is_matryoshka") or dims)
    fields["matryoshka_dimensions"] = tuple(int(d) for d in dims)
    out = PoolerConfig(**fields, checked=True)
    if out.dimensions is not None:
        problem = out.check_dimensions(out.dimensions, hidden_size)
        if problem is not None:
            raise ValueError(f"pooler_config: {problem}")
    return runner, out


def num_labels(top: Mapping[str, Any]) -> int:
    """A sequence classifier's labels: config.json's `num_labels`, else its `id2label`'s
    (transformers' default: 2); a head made of LM head rows (`classifier_from_token`): one
    (Qwen3-Reranker's yes less no), or one per token (`method` no_post_processing)."""
    tokens = top.get("classifier_from_token")
    if tokens:
        return len(tokens) if top.get("method") == "no_post_processing" else 1
    return int(top.get("num_labels") or len(top.get("id2label") or ()) or 2)


def classifier_fields(top: Mapping[str, Any]) -> dict[str, Any]:
    """A sequence classifier's `labels` (id2label's names; LABEL_i where it names none) and
    `multi_label` from its config.json."""
    id2label = {int(k): str(v) for k, v in (top.get("id2label") or {}).items()}
    labels = tuple(id2label.get(i, f"LABEL_{i}") for i in range(num_labels(top)))
    return {
        "labels": labels,
        "multi_label": top.get("problem_type") == "multi_label_classification",
    }


def with_runner(config: Any, model_path: str | Path, hidden_size: int) -> Any:
    """An `EngineConfig` with its runner resolved (`resolve`); itself when it was already.
    Pooling turns prefix caching off: a MEAN or CLS vector reads every prompt row, which a
    cached prefix would skip, and a pooled request's blocks are freed when it ends (LAST
    could reuse cached prefixes; one rule for every pooling type is kept instead). An encoder
    (`ENCODERS`) turns chunked prefill off too: its attention over the whole prompt needs the
    prompt in one step. The checkpoint's config.json is read once, here, for both."""
    top = _config_json(model_path) or {}
    runner, pooler = resolve(config.runner, config.pooler_config, model_path, hidden_size, top)
    sched = config.scheduler
    if sched.enable_chunked_prefill and encoder(top) is not None:
        sched = dataclasses.replace(sched, enable_chunked_prefill=False,
                                    long_prefill_token_threshold=None)  # fmt: skip
        config = dataclasses.replace(config, scheduler=sched)
    if runner == "pooling" and config.speculative_config is not None:
        raise ValueError("speculative decoding is not supported with the pooling runner (an "
                         "embedding request generates nothing): drop --speculative-config")  # fmt: skip
    if runner == "pooling" and getattr(config, "lora", None) is not None:
        raise ValueError("LoRA adapters are not supported with the pooling runner yet (no "
                         "embedding request names one): drop --enable-lora")  # fmt: skip
    if runner == config.runner and pooler is config.pooler_config:  # (resolved already: a
        return config  # user's config equal to the checkpoint's still needs the cache rule)
    cache = config.cache
    if runner == "pooling" and cache.enable_prefix_caching:
        cache = dataclasses.replace(cache, enable_prefix_caching=False)
    return dataclasses.replace(config, runner=runner, pooler_config=pooler, cache=cache)


def check_not_classifier(architectures: list[str]) -> None:
    """ValueError, one line, for a sequence-classification checkpoint (`*ForSequenceClassification`:
    a cross-encoder reranker or a classifier) other than those served (`CLASSIFIERS`), which
    has no runner here."""
    cls = [a for a in architectures
           if a.endswith("ForSequenceClassification") and a not in CLASSIFIERS]  # fmt: skip
    if cls:
        raise ValueError(f"{cls[0]} is a sequence-classification model (a cross-encoder "
                         "reranker or classifier): not supported; Pagoda's pooling runner serves "
                         "embedding models, whose /v1/score and /v1/rerank score pairs by the "
                         "cosine similarity of their vectors")  # fmt: skip


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

"""vLLM's `--hf-overrides` (offline `LLM(..., hf_overrides={...})`): config.json keys replaced
before the checkpoint is read, e.g. Qwen3-Reranker served as a sequence classifier
(``{"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no",
"yes"], "is_original_qwen3_reranker": true}``: `model/classifier_config.py`).

The override makes an overlay of the checkpoint directory (`overlay`): a directory whose
config.json is the checkpoint's with the keys replaced (as vLLM's dict override of the
config's attributes) and whose every other file is a symbolic link to the
checkpoint's. Every reader of the model (the server's checks, the engine process, the
tokenizer, the weights estimate) then reads one consistent checkpoint by its path. It lives
under the temporary directory, named by a hash of the checkpoint's path and the merged config,
so that the same override reuses it. A nested model config (`text_config`) is updated key by
key, as vLLM updates a sub-config (`merge`). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pagoda.runtime.option_rules import json_object


def parse(value: Any) -> dict[str, Any] | None:
    """The overrides from the flag's JSON text or a mapping; None stays None. ValueError, one
    line, for anything else."""
    if value is None:
        return None
    return dict(
        json_object("hf_overrides", value, '{"architectures": ["Qwen3ForSequenceClassification"]}')
    )


def merge(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`config` with `overrides`' keys replaced, as vLLM applies them: a nested model config
    (a dict with its own `model_type`: `text_config`, ...) given a dict is updated key by key
    (recursively), any other value replaced whole (`rope_scaling` too)."""
    out = dict(config)
    for key, value in overrides.items():
        old = out.get(key)
        nested = isinstance(old, dict) and "model_type" in old and isinstance(value, dict)
        out[key] = merge(old, value) if nested else value
    return out


def overlay(model_dir: str | Path, overrides: Any) -> Path:
    """The overlay of `model_dir` with config.json's keys replaced by `overrides` (module
    docstring); `model_dir` itself when there are none. ValueError, one line, for a model that
    is not a checkpoint directory with a config.json (a GGUF file)."""
    overrides = parse(overrides)
    model_dir = Path(model_dir)
    if not overrides:
        return model_dir
    config = model_dir / "config.json"
    if not config.is_file():
        raise ValueError(f"hf_overrides applies to a Hugging Face checkpoint directory with a "
                         f"config.json; {model_dir} is not one")  # fmt: skip
    merged = merge(json.loads(config.read_text()), overrides)
    text = json.dumps(merged, indent=2, sort_keys=True)
    key = hashlib.sha256(f"{model_dir.resolve()}\n{text}".encode()).hexdigest()[:20]
    out = Path(tempfile.gettempdir()) / "pagoda-hf-overrides" / key
    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        link = out / f.name
        if f.name != "config.json" and not link.is_symlink():
            link.symlink_to(f.resolve())
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".config.", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, out / "config.json")  # (atomic: a reader sees the old or the new)
    return out

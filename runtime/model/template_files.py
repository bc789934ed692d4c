"""Which file of a Hugging Face directory holds its chat template, in transformers' order.

A multimodal checkpoint (Gemma 3's `Gemma3ForConditionalGeneration`) keeps the template of its
processor beside the tokenizer's files; vLLM renders the processor's template when there is one,
else the tokenizer's. Each is read as transformers 5 reads it:

1. the processor (`ProcessorMixin.get_processor_dict`): `processor_config.json`'s
   ``chat_template`` (deprecated, but it wins), else the legacy `chat_template.json`
   (``{"chat_template": ...}``), else `chat_template.jinja`;
2. the tokenizer (`PreTrainedTokenizerBase.from_pretrained`): `chat_template.jinja`, else
   `tokenizer_config.json`'s ``chat_template``.

`chat_template.jinja` is in both lists, so the whole order is: processor_config.json,
chat_template.json, chat_template.jinja, tokenizer_config.json. Named templates (a list of
``{name, template}`` or an object by name) give their ``default``.

A request with tools renders the tokenizer's ``tool_use`` template where it has one
(`read_tool_template`: Command R's, Hermes 2 Pro's), as transformers' `get_chat_template` and
vLLM choose it; ``additional_chat_templates/tool_use.jinja`` beside `chat_template.jinja` (how
transformers saves named templates), else the one named so in `tokenizer_config.json`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROCESSOR_CONFIG = "processor_config.json"
LEGACY_PROCESSOR_TEMPLATE = "chat_template.json"
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
ADDITIONAL_TEMPLATES = "additional_chat_templates"  # transformers' folder of named templates
TOOL_USE = "tool_use"


def read_chat_template(model_dir: Path, tokenizer_config: Mapping[str, Any]) -> str | None:
    """The template `model_dir` renders chats with (None: it has none); ValueError, one line
    naming the file, for one that cannot be read."""
    processor = read_json_object(model_dir / PROCESSOR_CONFIG)
    if processor.get("chat_template") is not None:
        return _default(processor["chat_template"], PROCESSOR_CONFIG)
    legacy = model_dir / LEGACY_PROCESSOR_TEMPLATE
    if legacy.is_file():
        data = read_json_object(legacy)
        if "chat_template" not in data:  # transformers fails on it too (a KeyError)
            raise ValueError(f"{LEGACY_PROCESSOR_TEMPLATE} has no 'chat_template'")
        return _default(data["chat_template"], LEGACY_PROCESSOR_TEMPLATE)
    jinja = model_dir / TEMPLATE_FILE
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    return _default(tokenizer_config.get("chat_template"), TOKENIZER_CONFIG)


def read_tool_template(model_dir: Path, tokenizer_config: Mapping[str, Any]) -> str | None:
    """The tokenizer's template named ``tool_use`` (None: it has none), which transformers and
    vLLM render a request with tools with in place of the default."""
    if (model_dir / TEMPLATE_FILE).is_file():
        named = model_dir / ADDITIONAL_TEMPLATES / f"{TOOL_USE}.jinja"
        return named.read_text(encoding="utf-8") if named.is_file() else None
    template = tokenizer_config.get("chat_template")
    return None if isinstance(template, str) else _default(template, TOKENIZER_CONFIG, TOOL_USE)


def _default(template: Any, where: str, name: str = "default") -> str | None:
    """A template, or the one named `name` of named templates (None if none is)."""
    if template is None or isinstance(template, str):
        return template if name == "default" else None
    named: Any = None
    if isinstance(template, list) and all(isinstance(t, dict) for t in template):
        named = {t.get("name"): t.get("template") for t in template}
    elif isinstance(template, dict):
        named = template
    chosen = None if named is None else named.get(name)
    if named is None or not (chosen is None or isinstance(chosen, str)):
        raise ValueError(f"{where}: chat_template must be a string or named templates")
    return chosen


def read_json_object(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file as a dict ({} when there is no such file); ValueError, one line
    naming the file, for one that is not a JSON object."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path.name} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} must hold a JSON object")
    return data

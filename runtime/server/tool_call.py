"""A parsed tool call (OpenAI's shape) and the helpers every tool-call parser shares
(`tool_parsers.py`, `tool_parser_glm45.py`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text of an object
    id: str = field(default_factory=call_id)

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}  # fmt: skip


def prefix_overlap(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0

"""Chat messages → prompt token ids, with the client's text tokenized as text.

A chat template writes control tokens (``<|im_start|>system``) around what the client sent:
message content, tool definitions, earlier tool calls. If that text holds special-token text
and the whole prompt were tokenized at once, a client could close its own turn and open a
system turn. By default (unlike vLLM's) the client's text is tokenized as plain text: when any
string of the messages or tools holds special-token text, the template is rendered once more
with a unique marker in place of each such string; the template's own text is then tokenized
with its special tokens and each client string as text (`Tokenizer.encode_as_text`), as
written (verbatim, stripped, or JSON-escaped by `tojson`). The rendering must agree with the
plain one, special token for special token, or the request is a 400. Prompts that hold no
special-token text from the client (nearly all) are tokenized in one call, as before.
`--allow-chat-special-tokens` keeps the old behaviour for trusted deployments.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pagoda.runtime.server.protocol import APIError


def encode_chat(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any, text: str,
                content_as_text: bool = True, render: Callable[..., str] | None = None,
                ) -> list[int]:  # fmt: skip
    """Token ids of `text`, the rendering of `messages` and `tools` by the chat template
    (`render(messages, tools=...)`: the request's way, by default `apply_chat_template`'s)."""
    specials = tokenizer.special_text if content_as_text else None
    if specials is None or not specials.search(text):
        return tokenizer.encode(text, add_special_tokens=False)
    tag, found = uuid.uuid4().hex, []
    marked = _mark(list(messages), specials, tag, found)
    if not found:  # the special-token text is the template's own
        return tokenizer.encode(text, add_special_tokens=False)
    marked_tools = _mark(tools, specials, tag, found) if tools else tools
    template = (render or tokenizer.apply_chat_template)(marked, tools=marked_tools)
    pieces = _align(template, text, tag, found)
    if pieces is None or sum(len(specials.findall(p)) for p, _ in pieces) != len(
        specials.findall(text)
    ):  # each special token of the text is either the template's or inside a client's string
        return _unsupported()
    ids: list[int] = []
    for piece, client in pieces:
        if piece:
            ids += tokenizer.encode_as_text(piece) if client else \
                tokenizer.encode(piece, add_special_tokens=False)  # fmt: skip
    return ids


def _mark(value: Any, specials: re.Pattern, tag: str, found: list[str]) -> Any:
    """`value` with each string (key or value) holding special-token text replaced by a marker
    (`found[i]` is the string of marker i)."""
    if isinstance(value, str):
        if not specials.search(value):
            return value
        found.append(value)
        return f"\ue000{tag}:{len(found) - 1}\ue001"
    if isinstance(value, dict):
        return {_mark(k, specials, tag, found): _mark(v, specials, tag, found)
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_mark(v, specials, tag, found) for v in value]
    return value


def _align(template: str, text: str, tag: str, found: list[str]) -> list[tuple[str, bool]] | None:
    """(piece, is the client's) pieces that make up `text`: the template's text between the
    markers, and at each marker its string as the template wrote it; None if they disagree."""
    marker = re.compile(f"\ue000{tag}:(\\d+)\ue001")
    parts = marker.split(template)  # literal, index, literal, index, ..., literal
    pieces: list[tuple[str, bool]] = []
    at = 0
    for k in range(0, len(parts), 2):
        literal = parts[k]
        if not text.startswith(literal, at):
            return None
        pieces.append((literal, False))
        at += len(literal)
        if k + 1 == len(parts):
            break
        value, after = found[int(parts[k + 1])], parts[k + 2]
        ways = (value, value.strip(), json.dumps(value, ensure_ascii=False)[1:-1])
        way = next((w for w in ways if text.startswith(w, at)
                    and text.startswith(after, at + len(w))), None)  # fmt: skip
        if way is None:
            return None
        pieces.append((way, True))
        at += len(way)
    return pieces if at == len(text) else None


def _unsupported() -> list[int]:
    raise APIError(
        400,
        "the request holds special-token text, which is read as plain text here, but this "
        "model's chat template rewrites it so it cannot be told apart from the template's own; "
        "remove the special-token text (or start the server with --allow-chat-special-tokens)",
        param="messages", code="special_tokens_in_content",
    )  # fmt: skip

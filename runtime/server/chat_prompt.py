"""Chat messages → prompt token ids, with message content tokenized as text.

A chat template writes control tokens (``<|im_start|>system``) around each message's content.
If the content itself holds such text and the whole prompt were tokenized at once, a user could
close their own turn and open a system turn. By default (unlike vLLM's) content is tokenized as
plain text: when any content holds special-token text, the template is rendered once more with
a unique marker in place of each such content, the template's own text is tokenized with its
special tokens and the content as text (`Tokenizer.encode_as_text`). Prompts whose content
holds no special-token text (nearly all) are tokenized in one call, as before.
`--allow-chat-special-tokens` keeps the old behaviour for trusted deployments.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pagoda.runtime.server.protocol import APIError


def encode_chat(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Any, text: str,
                content_as_text: bool = True) -> list[int]:  # fmt: skip
    """Token ids of `text`, the rendering of `messages` (and `tools`) by the chat template."""
    specials = tokenizer.special_text if content_as_text else None
    marked = [i for i, m in enumerate(messages)
              if isinstance(m.get("content"), str) and specials is not None
              and specials.search(m["content"])]  # fmt: skip
    if not marked:
        return tokenizer.encode(text, add_special_tokens=False)
    tag = uuid.uuid4().hex
    markers = {i: f"\ue000{tag}:{i}\ue001" for i in marked}
    copies = [{**m, "content": markers[i]} if i in markers else m for i, m in enumerate(messages)]
    template = tokenizer.apply_chat_template(copies, tools=tools)
    pieces: list[tuple[str, bool]] = []  # (text, is content)
    at = 0
    for i in marked:
        found = template.find(markers[i], at)
        if found < 0 or template.find(markers[i], found + 1) >= 0:
            return _unsupported()
        pieces += [(template[at:found], False), (messages[i]["content"], True)]
        at = found + len(markers[i])
    pieces.append((template[at:], False))
    for strip in (False, True):  # templates that trim content write it stripped
        parts = [(p.strip() if strip and content else p, content) for p, content in pieces]
        if "".join(p for p, _ in parts) == text:
            ids: list[int] = []
            for p, content in parts:
                if p:
                    ids += tokenizer.encode_as_text(p) if content else \
                        tokenizer.encode(p, add_special_tokens=False)  # fmt: skip
            return ids
    return _unsupported()


def _unsupported() -> list[int]:
    raise APIError(
        400,
        "message content holds special-token text, which is read as plain text here, but this "
        "model's chat template rewrites message content so it cannot be told apart; remove the "
        "special-token text (or start the server with --allow-chat-special-tokens)",
        param="messages", code="special_tokens_in_content",
    )  # fmt: skip

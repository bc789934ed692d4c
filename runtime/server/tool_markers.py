"""`tool_choice` `required` and named functions for the call formats whose markers are tokens:
gpt-oss's harmony messages (`--tool-call-parser openai`) and DeepSeek's call blocks
(`deepseek_v3`, `deepseek_v31`), as xgrammar structural tags (`tools.tool_grammar`).

A marker that is one token of the vocabulary (``<|channel|>``, ``<｜tool▁call▁begin｜>``) is
named by id (xgrammar's `{"type": "token"}`): special tokens are never text to a grammar here,
so only such a tag lets the model write them (`structured/compiler.tokenizer_info` gives them a
stand-in no text rule matches; a vocabulary that is not byte-level has none, and such a tag then
allows no output: a 400). Any other marker is its text.

* harmony: an optional analysis message (free text up to ``<|end|>``: the model reasons first,
  as gpt-oss is trained to), then one call on the commentary channel, as gpt-oss writes it::

      <|channel|>analysis<|message|>…<|end|><|start|>assistant
      <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}

  the arguments held to the tool's schema; the output then ends at a stop token (gpt-oss's
  ``<|call|>``). gpt-oss makes one call per turn: `parallel_tool_calls` changes nothing.
* DeepSeek: the call block right away, each call's arguments held to its schema, calls
  separated by a newline (one call without `parallel_tool_calls`)::

      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
      ```json
      {ARGS}
      ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>                          (V3)
      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜><｜tool▁calls▁end｜>  (V3.1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pagoda.runtime.server import harmony
from pagoda.runtime.server import tool_parser_deepseek as deepseek
from xgrammar import structural_tag as st

# (tool name, the format of its arguments)
Calls = Sequence[tuple[str, Any]]
Marker = Callable[[str], "st.TokenFormat | str"]


def marker_of(tokenizer: Any | None) -> Marker:
    """`text` → the token that is it (by id) where the vocabulary has one, else the text."""

    def marker(text: str) -> st.TokenFormat | str:
        token_id = tokenizer.backend.token_to_id(text) if tokenizer is not None else None
        return st.TokenFormat(token=token_id) if token_id is not None else text

    return marker


def _element(part: st.TokenFormat | str) -> Any:
    return st.ConstStringFormat(value=part) if isinstance(part, str) else part


def _sequence(*parts: Any) -> st.SequenceFormat:
    return st.SequenceFormat(elements=[_element(p) for p in parts])


def harmony_calls(calls: Calls, parallel: bool, marker: Marker) -> Any:
    """An optional analysis message, then one call to one of `calls` (module docstring)."""
    channel, message = marker(harmony.CHANNEL), marker(harmony.MESSAGE)
    analysis = _sequence(
        channel, harmony.REASONING,
        st.TagFormat(begin=message, content=st.AnyTextFormat(), end=marker("<|end|>")),
        marker("<|start|>"), "assistant",
    )  # fmt: skip
    constrain = marker("<|constrain|>")
    one = [_sequence(channel, f"commentary to=functions.{name} ", constrain, "json", message, args)
           for name, args in calls]  # fmt: skip
    call = one[0] if len(one) == 1 else st.OrFormat(elements=one)
    return st.SequenceFormat(elements=[st.OptionalFormat(content=analysis), call])


def deepseek_calls(calls: Calls, parallel: bool, marker: Marker, v31: bool) -> Any:
    """DeepSeek's call block holding at least one of `calls` (module docstring)."""
    sep = marker(deepseek.SEP)
    tags = []
    for name, args in calls:
        if v31:
            content = _sequence(name, sep, args)
        else:
            content = _sequence("function", sep, f"{name}\n```json\n", args, "\n```")
        begin, end = marker(deepseek.CALL_BEGIN), marker(deepseek.CALL_END)
        tags.append(st.TagFormat(begin=begin, content=content, end=end))
    body = st.TagsWithSeparatorFormat(
        tags=tags, separator="\n", at_least_one=True, stop_after_first=not parallel
    )
    return _sequence(marker(deepseek.CALLS_BEGIN), body, marker(deepseek.CALLS_END))


def marked_calls(parser: str, calls: Calls, parallel: bool, tokenizer: Any | None) -> Any:
    """The structural tag format of `parser`'s calls (a key of `PARSERS`)."""
    marker = marker_of(tokenizer)
    if parser in ("deepseek_v3", "deepseek_v31"):
        return deepseek_calls(calls, parallel, marker, v31=parser == "deepseek_v31")
    return harmony_calls(calls, parallel, marker)


PARSERS = ("openai", "deepseek_v3", "deepseek_v31")

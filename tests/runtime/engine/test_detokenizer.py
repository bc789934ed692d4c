"""Incremental detokenization: whole characters only, and stop strings never leak."""

from __future__ import annotations

import pytest
from pagoda.runtime.engine.detokenizer import IncrementalDetokenizer

USE_STREAM = [True]


@pytest.fixture(autouse=True, params=[True, False], ids=["rust-stream", "two-windows"])
def _path(request):
    """Every test runs on both paths: tokenizers' DecodeStream and the Python fallback."""
    USE_STREAM[0] = request.param


def stream(tok, text: str, stop=(), include_stop=False):
    ids = tok.encode(text)
    d = IncrementalDetokenizer(
        tok, tok.encode("Hello"), stop=stop, include_stop=include_stop, use_stream=USE_STREAM[0]
    )
    assert (d.stream is not None) == USE_STREAM[0]
    deltas, matched = [], None
    for t in ids:
        matched = d.add_tokens([t])
        deltas.append(d.pop_delta(matched is not None))
        if matched:
            break
    else:
        deltas.append(d.pop_delta(True))
    return deltas, matched, d


def test_incremental_equals_full_decode_and_never_splits_characters(smol):
    tok = smol.tokenizer
    text = " naïve café 日本語 🙂 done."
    deltas, _, _ = stream(tok, text)
    assert "".join(deltas) == tok.decode(tok.encode(text))
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_cut_and_never_streamed(smol):
    tok = smol.tokenizer
    deltas, matched, _ = stream(tok, " one two three STOP four five", stop=("STOP",))
    assert matched == "STOP"
    assert "".join(deltas) == " one two three "
    assert not any("S" in x for x in deltas)


def test_stop_string_spanning_tokens_is_held_back(smol):
    tok = smol.tokenizer
    # "\n\n###" is several tokens; partial matches must not be emitted early.
    deltas, matched, _ = stream(tok, " alpha beta\n\n### gamma", stop=("\n\n###",))
    assert matched == "\n\n###"
    assert "".join(deltas) == " alpha beta"
    assert all("#" not in x for x in deltas)


def test_earliest_stop_wins_and_include_stop(smol):
    tok = smol.tokenizer
    deltas, matched, _ = stream(tok, " x END y HALT", stop=("HALT", "END"), include_stop=True)
    assert matched == "END" and "".join(deltas) == " x END"


def test_without_stop_strings_only_undelivered_text_is_kept(smol):
    """The per-step path (`push` + `pop_delta`) hands out every character once and keeps only
    what it has not handed out: the whole output is never rebuilt per token."""
    tok = smol.tokenizer
    text = " a long answer, " * 40 + "日本語 🙂"
    d = IncrementalDetokenizer(tok, tok.encode("Hello"), use_stream=USE_STREAM[0])
    deltas = []
    for t in tok.encode(text):
        d.push(t)
        deltas.append(d.pop_delta(False))
        assert len(d.text) == 0
    deltas.append(d.pop_delta(True))
    assert "".join(deltas) == tok.decode(tok.encode(text))


def test_with_stop_strings_only_the_held_tail_is_kept(smol):
    """With stop strings, what is kept between steps is at most the tail that could still
    start one; a stop string spanning steps is still found and cut."""
    tok = smol.tokenizer
    body = " a long answer, " * 40
    ids = tok.encode(body + "END here")
    d = IncrementalDetokenizer(tok, tok.encode("Hello"), stop=("END",), use_stream=USE_STREAM[0])
    deltas, matched = [], None
    for t in ids:
        matched = d.add_tokens([t])
        deltas.append(d.pop_delta(matched is not None))
        assert len(d.text) <= d.hold
        if matched:
            break
    assert matched == "END"
    assert "".join(deltas) == tok.decode(tok.encode(body))

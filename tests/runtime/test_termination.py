"""The termination-message contract (runtime/termination.py): written by `pagoda serve` and
`pagoda download` on exit 2, parsed back by the operator."""

from __future__ import annotations

import pathlib

import pytest
from pagoda.runtime import termination as t


def test_round_trip_and_what_is_not_a_termination_message() -> None:
    line = t.Termination("ModelDownloadFailed", "NotFound", "hf://a/b: not found").line()
    assert line == "ModelDownloadFailed/NotFound: hf://a/b: not found"
    assert t.parse(line + "\n") == t.Termination(
        "ModelDownloadFailed", "NotFound", "hf://a/b: not found"
    )
    assert t.parse("ModelDoesNotFit: 40 GiB of weights, 24 GiB of memory") == t.Termination(
        "ModelDoesNotFit", None, "40 GiB of weights, 24 GiB of memory"
    )
    for text in (None, "", "2026-12-04 INFO loading", "Traceback (most recent call last):",
                 "notCamel: x", "Reason:", "A/b: lower detail"):  # fmt: skip
        assert t.parse(text) is None, text


@pytest.mark.parametrize("text", [
    "INFO:     Started server process [7]",  # a log level: uvicorn's lines
    "ERROR: Exception in ASGI application",
    "RuntimeError: CUDA error: an illegal memory access was encountered",  # a traceback's end
    "KeyboardInterrupt: x\nValueError: y",
    "loading weights\nModelDoesNotFit: looks like ours, among log lines",
    "ModelDoesNotFit: 40 GiB\nINFO: shutting down",
])  # fmt: skip
def test_the_kubelets_log_fallback_is_no_message(text: str) -> None:
    """terminationMessagePolicy FallbackToLogsOnError: a container that dies without writing the
    file leaves its log's last lines (up to 80) as the message; they were read as ours when the
    first looked like `Reason: text` (an `INFO:` line made the service Degraded=INFO)."""
    assert t.parse(text) is None


def test_a_reason_that_would_read_as_a_log_line_is_not_written() -> None:
    for reason in ("OutOfMemoryError", "INFO", "UserWarning"):
        got = t.termination_of(t.ReasonedError("m", reason=reason))
        assert got.reason == t.DEFAULT_REASON and t.parse(got.line()) == got, reason


def test_error_to_line_defaults_and_limits(tmp_path: pathlib.Path, monkeypatch, capsys) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.setenv(t.TERMINATION_LOG_ENV, str(log))
    assert t.exit_error("pagoda serve", ValueError("bad\nflag   value")) == 2
    assert capsys.readouterr().err == "pagoda serve: error: bad flag value\n"
    assert log.read_text() == "InvalidConfiguration: bad flag value\n"

    err = t.ReasonedError("x" * 10_000, reason="ModelDoesNotFit")
    t.exit_error("pagoda serve", err)
    text = log.read_text()
    assert text.startswith("ModelDoesNotFit: xxx") and len(text.encode()) <= t.MAX_BYTES + 1
    assert t.parse(text).reason == "ModelDoesNotFit"


def test_where_the_message_goes(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(t.TERMINATION_LOG_ENV, "")
    assert t.termination_log_path() is None  # empty: off
    monkeypatch.delenv(t.TERMINATION_LOG_ENV)
    expected = (
        t.DEFAULT_TERMINATION_LOG if pathlib.Path(t.DEFAULT_TERMINATION_LOG).exists() else None
    )
    assert t.termination_log_path() == expected  # the kubelet's file only where it exists
    monkeypatch.setenv(t.TERMINATION_LOG_ENV, str(tmp_path / "missing-dir" / "log"))
    assert t.write_termination_log(t.Termination("X", None, "y")) is False  # never raises


def test_a_reasoned_error_crosses_a_process_boundary_with_its_reason() -> None:
    """`pagoda serve`'s checks run in the engine process: their error is pickled there
    (`core_proc.dump_error`) and exits the API process with its reason and detail."""
    import pickle

    from pagoda.runtime.engine.core_proc import dump_error
    from pagoda.runtime.model.sources.errors import DETAILS, DownloadError

    detail = sorted(DETAILS)[0]
    for error in (DownloadError(detail, "hf://x: gone"), t.ReasonedError("big", reason="Big")):
        back = pickle.loads(dump_error(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert (back.reason, back.detail) == (error.reason, error.detail)

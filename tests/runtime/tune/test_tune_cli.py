"""`pagoda tune --help` shows each flag's default, as `pagoda serve --help` does (docs/runtime.md
writes `[--time-budget 15m] [--ttft-target 2.0] [--itl-target 0.1]`; the help said nothing)."""

from __future__ import annotations

from pagoda.runtime import options
from pagoda.runtime.cli import build_parser


def test_help_shows_every_default() -> None:
    parser, _ = build_parser(["tune"])
    sub = next(a for a in parser._actions if a.dest == "command").choices["tune"]
    text = " ".join(sub.format_help().split())
    shown = 0
    for f in options.TUNE_FLAGS.values():
        assert f.name in text
        if f.default is not None and f.kind != "switch":
            assert f"(default: {f.default})" in text, f.name
            shown += 1
    assert shown >= 5 and "(default: 15m)" in text

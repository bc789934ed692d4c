"""`pagoda` command line: `pagoda serve` (OpenAI-compatible runtime), `pagoda tune`, `pagoda download`
(hf:// and s3:// models), `pagoda operator` (kopf) and `pagoda publish-profile` (the tuning Job's
hand-back, docs/operator.md).

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
imports are lazy so `pagoda operator` never loads torch and `pagoda serve` never loads kopf.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from typing import NoReturn

SUBCOMMANDS = {
    "serve": ("pagoda.runtime.server.cli", "Run the OpenAI-compatible inference server."),
    "tune": ("pagoda.runtime.tune.cli", "Measure this node for a model; write a tuned profile."),
    "download": (
        "pagoda.runtime.model.sources.cli",
        "Download an hf:// or s3:// model into the download directory.",
    ),
    "operator": ("pagoda.operator.main", "Run the Kubernetes operator (kopf)."),
    "publish-profile": (
        "pagoda.operator.autotune.publish",
        "Write a tuned profile into its ConfigMap (the operator's tuning Job).",
    ),
}


def version() -> str:
    """The installed distribution's version (the source tree's when not installed)."""
    try:
        return importlib.metadata.version("pagoda")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors (exit 2) also leave the termination message
    `InvalidArguments: ...` (runtime/termination.py), e.g. an unknown flag in spec.engine.extraArgs."""

    def error(self, message: str) -> NoReturn:
        from pagoda.runtime.termination import Termination, write_termination_log

        write_termination_log(Termination("InvalidArguments", None, f"{self.prog}: {message}"))
        super().error(message)


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, object | None]:
    parser = ArgumentParser(prog="pagoda", description="Pagoda LLM serving.")
    parser.add_argument("--version", action="version", version=f"pagoda {version()}")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    module = None
    for name, (mod_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only import the module that will run
            module = importlib.import_module(mod_name)
            module.add_arguments(p)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, module = build_parser(argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    prog = f"pagoda {chosen}" if module is not None else "pagoda"

    def error(message: str) -> NoReturn:  # e.g. unrecognized arguments: one line, exit 2
        print(f"{prog}: error: {message} (see `{prog} --help`)", file=sys.stderr)
        sys.exit(2)

    parser.error = error  # type: ignore[method-assign]
    args = parser.parse_args(argv)
    if module is None:
        parser.print_help()
        return 2
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

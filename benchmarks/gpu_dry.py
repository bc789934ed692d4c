"""gpu_check.sh's stand-in for `python3 -P` under DRY_RUN=1: each step's command line is checked
on a CPU without running it, so a renamed flag, a moved test file or a module that no longer
imports shows before a device call is spent on it.

    python3 -P benchmarks/gpu_dry.py -m pytest ARGS...   # pytest ARGS --collect-only: paths,
                                                         # markers, -k and --timeout accepted
    python3 -P benchmarks/gpu_dry.py SCRIPT.py ARGS...   # the script's own argument parser
    python3 -P benchmarks/gpu_dry.py -m MODULE ARGS...   # parses ARGS, then stops

A script or module runs as `__main__` until its first ArgumentParser.parse_args, which parses for
real (a bad flag exits 2 with argparse's message) and then ends the run with exit 0. Flags that
the script hands on to `pagoda serve` (gpu_serving.py's --servers NAME=FLAGS and --server-args,
start_to_ready.py's arguments after --) are parsed by serve's own parser too.
"""

from __future__ import annotations

import argparse
import runpy
import shlex
import sys
from pathlib import Path

_parse_args = argparse.ArgumentParser.parse_args


class Parsed(SystemExit):
    """Raised after the first parse: the command line is good; nothing more runs."""


def serve_flags(args: argparse.Namespace) -> list[list[str]]:
    """The `pagoda serve` flag lists a benchmark's arguments carry."""
    lists = []
    extra = shlex.split(getattr(args, "server_args", "") or "")
    for entry in getattr(args, "servers", None) or []:
        _, _, flags = str(entry).partition("=")
        lists.append(shlex.split(flags) + extra)
    serve = getattr(args, "extra", None)  # start_to_ready.py: serve's flags after --
    if serve:
        lists.append([a for a in serve if a != "--"])
    return lists


def check_serve_flags(lists: list[list[str]]) -> None:
    if not lists:
        return
    from pagoda.runtime.server.cli import build_parser

    for flags in lists:
        if "--model" not in flags:
            flags = ["--model", "dry-run-model", *flags]
        _parse_args(build_parser(), flags)  # exits 2 with serve's message on a bad flag


def parse_then_stop(self, args=None, namespace=None):
    ns = _parse_args(self, args, namespace)
    check_serve_flags(serve_flags(ns))
    print(f"dry run: {self.prog} {' '.join(sys.argv[1:])}: arguments parsed")
    raise Parsed(0)


def main(argv: list[str]) -> int:
    if argv[:2] == ["-m", "pytest"]:
        import pytest

        return int(pytest.main([*argv[2:], "--collect-only", "-q"]))
    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    except Parsed:
        return 0
    print(f"dry run: {' '.join(argv)} ended without parsing its arguments", file=sys.stderr)
    return 1


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))

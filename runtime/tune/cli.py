"""`pagoda tune`: measure this node for one model and write a tuned profile (see docs/runtime.md).

Order: load the model; on CUDA sweep the kernels (their winners land in ``DIR/<Device>.json``
at once); then profile the engine with those kernels; choose the scheduler knobs;
write ``DIR/profile.json`` after every measured point, so an interrupted or out-of-time run
resumes where it stopped. ``--force`` starts from scratch.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see pagoda serve: busy cores, spinning OMP

from pagoda.runtime import options
from pagoda.runtime.options import TUNE_FLAGS, Flag

DESCRIPTION = "Measure this node for a model and write a tuned profile (kernels + scheduler)."
log = logging.getLogger("pagoda.tune")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_duration(text: str) -> float:
    """'15m', '90s', '1.5h', '600' → seconds."""
    m = _DURATION.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"time budget: cannot parse {text!r} (e.g. 15m, 90s)")
    return float(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]


def _add(p: argparse.ArgumentParser, f: Flag) -> None:
    kw: dict[str, Any] = {"default": f.default, "help": f.help}
    if f.kind == "switch":
        kw["action"] = "store_true"
    else:
        kw.update(type=f.type, choices=f.choices, metavar=f.metavar)
    if f.name == "--output":
        kw["required"] = True
    p.add_argument(f.name, **kw)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from pagoda.runtime.server.cli import DefaultsHelpFormatter  # torch-free, as this module

    p.formatter_class = DefaultsHelpFormatter  # --help shows each default, as serve's does
    for f in TUNE_FLAGS.values():
        _add(p, f)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The engine flags `pagoda tune` takes, as `EngineConfig.create` arguments (the context
    length apart: it is a shape the profile is measured for)."""
    return {k: v for k, v in options.engine_kwargs(vars(args)).items() if k != "max_model_len"}


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pagoda.runtime.tune.runner import TuneRequest, tune

    try:
        from pagoda.runtime.tune.choose import Targets

        request = TuneRequest(
            model=args.model,
            output=args.output,
            revision=args.revision,
            download_dir=args.download_dir,
            engine_args=engine_kwargs(args),
            max_model_len=args.max_model_len,
            time_budget_s=parse_duration(args.time_budget),
            targets=Targets(ttft_s=args.ttft_target, itl_s=args.itl_target),
            prompt_len=args.prompt_len,
            quick=args.quick,
            force=args.force,
        )
        result = tune(request)
    except ValueError as e:  # a ProfileError, a failed download or bad --revision too
        from pagoda.runtime.termination import exit_error

        return exit_error("pagoda tune", e)  # one line, as `pagoda serve` and `pagoda download`
    print(result.summary)
    return 0 if result.usable else 3


if __name__ == "__main__":  # pragma: no cover - `pagoda tune` is the entry point
    parser = argparse.ArgumentParser(prog="pagoda tune", description=DESCRIPTION)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))

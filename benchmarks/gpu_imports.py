"""Would the GPU steps' imports resolve on the GPU node? That node has torch, triton,
transformers and the rest of benchmarks/gpu_node_packages.txt, and no registry; what `pagoda
serve` needs beyond it travels as the wheels of benchmarks/gpu_wheels.sh. Run here, in this
checkout's venv:

    .venv/bin/python -P benchmarks/gpu_imports.py            # exit 1 when something is missing

Two checks. Static: every third-party module that runtime/, kernels/ and the benchmarks of
gpu_check.sh import anywhere (lazy imports too), mapped to its distribution through this venv;
those on neither list must be in LAZY (paths the GPU steps never take). Dynamic: the modules `pagoda serve`, `pagoda tune` and
the benchmarks of gpu_check.sh load, imported in a fresh interpreter where a distribution on
neither list cannot be imported (as on the node); an optional import that its importer survives
is listed, not fatal. `--sitecustomize DIR` writes that interpreter's blocker as
DIR/sitecustomize.py: with DIR first on PYTHONPATH any command, the servers it starts included,
runs as if on the node (`PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 -p pytest_timeout` for pytest, whose
plugins this venv has and the node lacks).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# Third-party imports of runtime/ that no GPU step reaches, so not carried: s3:// models
# (boto3, botocore), structured outputs and tool calls (xgrammar), the operator's (kopf).
LAZY = {
    "boto3": "s3:// models",
    "botocore": "s3:// models",
    "xgrammar": "structured outputs",
    "av": "video_url parts (decoded in the API process)",
}
# Imported only where they are used, so the GPU steps import without them even where the node
# has them (test_gpu_imports): sentencepiece reads a tokenizer.model without tokenizer.json
# (model/spm_files.py)
OPTIONAL = frozenset({"sentencepiece"})

# What the GPU steps import: `pagoda serve` (API process and engine-core process), `pagoda tune`,
# and the benchmarks gpu_check.sh runs.
MODULES = [
    "pagoda.runtime.cli",
    "pagoda.runtime.server.cli",
    "pagoda.runtime.server.launch",
    "pagoda.runtime.server.api",
    "pagoda.runtime.server.metrics",
    "pagoda.runtime.engine.core",
    "pagoda.runtime.engine.core_proc",
    "pagoda.runtime.engine.core_client",
    "pagoda.runtime.engine.worker_proc",
    "pagoda.runtime.engine.warmup",
    "pagoda.runtime.engine.llm",
    "pagoda.runtime.model.loader",
    "pagoda.runtime.model.gguf_reader",
    "pagoda.runtime.tune.cli",
    "gpu_serving",
    "gpu_throughput",
    "kernel_speed",
    "invariance_cost",
    "start_to_ready",
    "tensor_parallel",
]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def node_packages() -> set[str]:
    lines = (BENCH / "gpu_node_packages.txt").read_text().splitlines()
    return {norm(s) for s in lines if s.strip() and not s.startswith("#")}


def wheel_packages() -> set[str]:
    """The PKGS of gpu_wheels.sh (the distributions it downloads)."""
    text = (BENCH / "gpu_wheels.sh").read_text()
    m = re.search(r'^PKGS="([^"]*)"', text, re.M)
    if not m:
        raise SystemExit('gpu_imports: no PKGS="..." in benchmarks/gpu_wheels.sh')
    return {norm(s) for s in m.group(1).split()}


# The benchmarks gpu_check.sh runs and the modules of benchmarks/ they import.
GPU_BENCHMARKS = [
    "gpu_serving", "gpu_serving_load", "gpu_serving_report", "gpu_serving_servers",
    "gpu_throughput", "kernel_speed", "kernel_cases", "kernel_profile", "invariance_cost",
    "start_to_ready", "tensor_parallel", "common", "long_context", "gpu_dry",
]  # fmt: skip


def gpu_step_files() -> list[Path]:
    files = [p for root in ("runtime", "kernels") for p in sorted((ROOT / root).rglob("*.py"))]
    return files + [BENCH / f"{name}.py" for name in GPU_BENCHMARKS]


def third_party_imports(files: list[Path] | None = None) -> dict[str, set[str]]:
    """Top-level module → files, for every non-stdlib import in the files (lazy ones too)."""
    std = set(sys.stdlib_module_names) | {"pagoda", "__future__"}
    found: dict[str, set[str]] = {}
    for path in gpu_step_files() if files is None else files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in std and not (BENCH / f"{top}.py").exists():
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def static_missing(allowed: set[str]) -> dict[str, list[str]]:
    """Modules runtime/ or kernels/ import whose distributions are on neither list."""
    dists = importlib.metadata.packages_distributions()
    missing = {}
    for top, files in third_party_imports().items():
        names = {norm(d) for d in dists.get(top, [top])}
        if not names & allowed:
            missing[top] = sorted(files)
    return missing


BLOCKER = r"""
import importlib.machinery, importlib.metadata, re, sys
ALLOWED = set(%r)
DISTS = importlib.metadata.packages_distributions()
blocked = []
class NotOnNode(importlib.machinery.PathFinder):
    # the path finder, for which a top-level module of a distribution the node lacks is absent
    # (None, as for any missing module: `find_spec` probes and `try: import` fall back)
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        top = name.split(".")[0]
        if "." not in name and top != "pagoda" and top in DISTS:
            if not {re.sub(r"[-_.]+", "-", d).lower() for d in DISTS[top]} & ALLOWED:
                blocked.append(top)
                return None
        return super().find_spec(name, path, target)
sys.meta_path[:] = [NotOnNode if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""

CHECK = r"""
import importlib, sys
sys.path.insert(0, sys.argv[1])
failed = 0
for mod in sys.argv[2:]:
    try:
        importlib.import_module(mod)
    except ImportError as e:
        failed += 1
        print(f"FAIL {mod}: {e}")
for top in sorted(set(blocked)):
    print(f"absent {top}")
sys.exit(1 if failed else 0)
"""


def with_their_needs(dists: set[str]) -> set[str]:
    """The distributions and, transitively, what this venv's versions of them require: the node's
    own versions bring what they need, so their local stand-ins may import these."""
    seen: set[str] = set()
    todo = list(dists)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [
            norm(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]) for r in reqs if "extra ==" not in r
        ]
    return seen


def blocker(allowed: set[str], absent: frozenset[str] = frozenset()) -> str:
    """Python source that makes the distributions outside `allowed` (and those `absent`, even
    where the node has them) absent."""
    return BLOCKER % sorted((with_their_needs(node_packages()) | allowed) - absent)


def dynamic_check(
    allowed: set[str], modules: list[str], absent: frozenset[str] = frozenset()
) -> tuple[int, str]:
    """Import the modules in a fresh interpreter that cannot import what the node lacks (nor
    `absent`: a package the GPU steps must import only lazily)."""
    cmd = [sys.executable, "-P", "-c", blocker(allowed, absent) + CHECK, str(BENCH), *modules]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr[-2000:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--static-only", action="store_true", help="skip the fresh-interpreter imports")
    ap.add_argument(
        "--sitecustomize", metavar="DIR",
        help="write DIR/sitecustomize.py with the blocker and stop: put DIR first on PYTHONPATH "
        "to run any command (servers included) as if on the node",
    )  # fmt: skip
    ap.add_argument("modules", nargs="*", default=MODULES, help="modules to import (default: all)")
    args = ap.parse_args(argv)
    allowed = node_packages() | wheel_packages()
    if args.sitecustomize:
        Path(args.sitecustomize).mkdir(parents=True, exist_ok=True)
        Path(args.sitecustomize, "sitecustomize.py").write_text(blocker(allowed))
        return 0
    rc = 0
    for top, files in sorted(static_missing(allowed).items()):
        if top in LAZY:
            print(f"not carried: {top} ({LAZY[top]}; {', '.join(files)})")
        else:
            rc = 1
            print(f"MISSING: {top}, imported by {', '.join(files)}: add its wheel to gpu_wheels.sh")
    if not args.static_only:
        code, out = dynamic_check(allowed, args.modules)
        print(out.rstrip())
        rc = rc or code
    print(
        "gpu_imports: ok" if rc == 0 else "gpu_imports: something the GPU steps import is missing"
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())

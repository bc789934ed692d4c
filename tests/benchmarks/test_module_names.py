"""Running a benchmark puts benchmarks/ first on sys.path, so a script named like an installed
package shadows it for everything the benchmark imports. `benchmarks/kernels.py` did: once a
fresh install brought Hugging Face's `kernels` (a transformers 5.25 dependency), importing
transformers from a benchmark or a test failed. No script may take an installed module's name."""

from __future__ import annotations

import sys
from importlib.machinery import PathFinder
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_no_benchmark_script_shadows_an_installed_module():
    outside = [p for p in sys.path if p not in ("", ".") and Path(p).resolve() != BENCHMARKS]
    names = sorted(p.stem for p in BENCHMARKS.glob("*.py"))
    assert "serving" in names and "step_overhead" in names
    shadowed = {
        name: "built in" if name in sys.builtin_module_names else spec.origin
        for name in names
        if name in sys.builtin_module_names or (spec := PathFinder.find_spec(name, outside))
    }
    assert not shadowed, f"benchmark scripts named like installed modules: {shadowed}"

"""benchmarks/gpu_imports.py: what the GPU steps import is on the GPU node or among
gpu_wheels.sh's wheels (the node has no registry: a missing wheel costs a device call)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_imports


def test_every_runtime_import_is_carried_or_lazy():
    allowed = gpu_imports.node_packages() | gpu_imports.wheel_packages()
    assert {"torch", "triton", "transformers"} <= allowed
    assert set(gpu_imports.static_missing(allowed)) <= set(gpu_imports.LAZY)
    # without jsonschema's wheel (the server's API imports it) the static check names it
    missing = gpu_imports.static_missing(allowed - {"jsonschema"})
    assert "runtime/structured/schema.py" in missing["jsonschema"]


@pytest.mark.slow
def test_serve_modules_import_with_only_the_nodes_packages_and_the_wheels():
    allowed = gpu_imports.node_packages() | gpu_imports.wheel_packages()
    # sentencepiece is imported only where a tokenizer.model is read (model/spm_files.py): the
    # server imports without it, and the blocker does block it. Nothing asks for it (no
    # "absent"), so with it allowed (the script's own run) the same imports happen alike.
    code, out = gpu_imports.dynamic_check(allowed, gpu_imports.MODULES, gpu_imports.OPTIONAL)
    assert code == 0 and "absent sentencepiece" not in out, out
    probe = ["pagoda.runtime.model.hf_loader", "sentencepiece"]
    code, out = gpu_imports.dynamic_check(allowed, probe, gpu_imports.OPTIONAL)
    assert code == 1 and "FAIL sentencepiece" in out and "FAIL pagoda" not in out, out
    # the blocker bites: without msgspec's wheel the engine's output messages cannot import
    code, out = gpu_imports.dynamic_check(allowed - {"msgspec"}, ["pagoda.runtime.engine.outputs"])
    assert code == 1 and "msgspec" in out, out

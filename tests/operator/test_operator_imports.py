"""The operator image has no torch: importing any operator module (and publishing a profile, the
tuning Job's last step) must not load it. From the runtime the operator imports only the options
contract and the tuned-profile module (docs/operator.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numpy", "triton", "transformers", "gguf", "fastapi", "uvicorn")
ALLOWED_RUNTIME = {
    "pagoda.runtime",
    "pagoda.runtime.options",
    "pagoda.runtime.option_rules",  # what values the flags accept (the CRD's rules)
    "pagoda.runtime.tuned_profile",
    "pagoda.runtime.termination",  # the termination-message format (pod failures → conditions)
    "pagoda.runtime.model",  # empty package
    "pagoda.runtime.model.sources",  # empty package
    "pagoda.runtime.model.sources.uri",  # the hf:// and s3:// grammar
    "pagoda.runtime.spec",  # a package whose __init__ imports nothing
    "pagoda.runtime.spec.config",  # SpeculativeConfig (spec.engine.speculative), stdlib only
    "pagoda.runtime.pooler_config",  # PoolerConfig (spec.engine.poolerConfig), stdlib only
}

SCRIPT = """
import importlib, importlib.abc, json, pathlib, pkgutil, sys, tempfile

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)")

sys.meta_path.insert(0, Block())
import pagoda.operator
for info in pkgutil.walk_packages(pagoda.operator.__path__, "pagoda.operator."):
    importlib.import_module(info.name)

from pagoda.operator.autotune.publish import profile_data
from pagoda.runtime.tuned_profile import SCHEMA_VERSION, write_profile

folder = pathlib.Path(tempfile.mkdtemp())
write_profile(folder, {"schema_version": SCHEMA_VERSION, "device": "NVIDIA H200",
                       "model": "m", "dtype": "bfloat16", "created": "2026-12-01T00:00:00Z"})
(folder / "NVIDIA_H200.json").write_text(json.dumps({"device": "NVIDIA H200", "kernels": {}}))
assert sorted(profile_data(folder)) == ["NVIDIA_H200.json", "profile.json"]
print(json.dumps(sorted(m for m in sys.modules if m.startswith("pagoda.runtime"))))
"""


def test_operator_imports_neither_torch_nor_the_engine() -> None:
    code = f"BLOCKED = {list(HEAVY)!r}\n{textwrap.dedent(SCRIPT)}"
    result = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runtime_modules = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert runtime_modules <= ALLOWED_RUNTIME, runtime_modules - ALLOWED_RUNTIME

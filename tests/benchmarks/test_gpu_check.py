"""benchmarks/gpu_check.sh under DRY_RUN=1 on the CPU: each step's command line checked (argument
parsing, the `pagoda serve` flags passed on, pytest collection), the wheels installed for the
node's Python, each finished step recorded in $OUT/steps.txt, and BUDGET_S respected."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def gpu_check(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path / "out"
    # the script's `python3` is the node's (torch installed): here, this interpreter's venv
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "DRY_RUN": "1", "OUT": str(out), **env}
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    return proc, (out / "steps.txt").read_text()


def pure_wheel(folder: Path) -> None:
    """A minimal py3-none-any wheel, as the pure-Python ones of gpu_wheels.sh are."""
    folder.mkdir()
    with zipfile.ZipFile(folder / "drypkg-0.1-py3-none-any.whl", "w") as z:
        z.writestr("drypkg/__init__.py", "")
        z.writestr(
            "drypkg-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: drypkg\nVersion: 0.1\n"
        )
        z.writestr(
            "drypkg-0.1.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr("drypkg-0.1.dist-info/RECORD", "")


def test_budget_skips_what_does_not_fit(tmp_path):
    proc, steps = gpu_check(tmp_path, STEPS="serving tests", BUDGET_S="20", WHEELS=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "serving: skipped" in steps and "tests: skipped" in steps
    assert "wheels: none in" in steps


@pytest.mark.slow
def test_dry_run_checks_each_command_and_installs_the_wheels(tmp_path):
    """The issue-40 steps and kcache; a `pagoda serve` flag that no longer exists is caught."""
    pure_wheel(tmp_path / "wheels")
    proc, steps = gpu_check(
        tmp_path, STEPS="serving ready kcache", WHEELS=str(tmp_path / "wheels"),
        SERVING_ARGS="--server-args=--no-such-serve-flag", KCACHE_ROUNDS="1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert steps.startswith("dry run on ")  # the GPU's line (nvidia-smi's on a device)
    lines = dict(line.split(": ", 1) for line in steps.splitlines()[1:])
    assert lines["wheels"].endswith("install rc=0"), steps
    assert lines["serving"].startswith("rc=2"), steps
    assert "--no-such-serve-flag" in (tmp_path / "out" / "serving.log").read_text()
    assert lines["ready"].startswith("rc=0") and lines["kcache"].startswith("rc=0"), steps
    assert (tmp_path / "out" / "kcache.log").read_text().count("arguments parsed") == 2


def test_family_steps_hold_every_gpu_marked_model_test_file_once():
    """FAMILY_TESTS (families), FAMILY_TESTS2 (families2) and FAMILY_TESTS3 (families3) between
    them list each test file of tests/runtime/model with a gpu-marked test, once: a new family's
    GPU test is not left out."""
    import re

    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    lists = [re.search(rf"^{name}=\$\{{{name}:-(.*?)\}}$", script, re.M | re.S)
             for name in ("FAMILY_TESTS", "FAMILY_TESTS2", "FAMILY_TESTS3")]  # fmt: skip
    listed = [p for m in lists for p in m.group(1).replace("\\\n", " ").split()]
    gpu = re.compile(r"mark\.gpu|= gpu_test\(")  # marked, or bound to arch_cases.gpu_test's
    marked = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests/runtime/model").glob("test_*.py")
                    if gpu.search(p.read_text()))  # fmt: skip
    assert sorted(listed) == marked

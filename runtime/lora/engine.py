"""What the engine core and the scheduler ask of LoRA, kept out of their files: a request's
adapter checked (read) on arrival, its prefix-cache salt, the scheduler's adapter limit, and
the adapters running and waiting (metrics).

Prefix caching: a block's KV depends on the adapter that computed it, so the adapter's id is
part of the chained block hash (through the request's cache salt): the same prompt with another
adapter (or none) misses, with the same adapter hits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from pagoda.runtime.lora_config import LoRARequest
from pagoda.runtime.request import Request


def lora_of(req: Request) -> LoRARequest | None:
    return req.params.lora_request


def lora_salt(salt: bytes | None, lora: LoRARequest | None) -> bytes | None:
    """`salt` (the request's cache salt, None: the global cache) made the adapter's own."""
    if lora is None:
        return salt
    h = hashlib.blake2b(b"pagoda-lora", digest_size=16)
    h.update(salt or b"")
    h.update(lora.lora_int_id.to_bytes(8, "little"))
    return h.digest()


class LoRAGate:
    """The scheduler's limit: at most `max_loras` distinct adapters among running requests;
    a waiting request whose adapter would be one more waits (others behind it may go)."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self.active: set[int] = set()

    def start_step(self, running: Iterable[Request]) -> None:
        self.active = {lr.lora_int_id for r in running if (lr := lora_of(r)) is not None}

    def admits(self, req: Request) -> bool:
        """Whether `req` may start running now (and counts its adapter if so)."""
        lr = lora_of(req)
        if lr is None or lr.lora_int_id in self.active:
            return True
        if len(self.active) >= self.max_loras:
            return False
        self.active.add(lr.lora_int_id)
        return True


def adapter_names(reqs: Iterable[Request]) -> list[str]:
    """The adapter names of `reqs`, each once, in order of first appearance (metrics)."""
    return list(dict.fromkeys(lr.lora_name for r in reqs if (lr := lora_of(r)) is not None))

"""A fake engine core: EngineCore's interface without a model, for the engine-process tests
(tests/runtime/engine/test_core_client.py) and, subclassed, the engine-thread and HTTP tests
(tests/server/test_async_engine.py's `FakeCore`).

Module level so that a spawned engine process can import it (its factory crosses by pickle).
One token per running sample per step; a prompt starting with 99 is refused when added, one
starting with 98 makes the step raise (the loop dies), and a step sleeps `step_s`.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from pagoda.runtime.engine.outputs import EngineStats, StepOutput
from pagoda.runtime.model_config import FamilyConfig


class FakeTokenizer:
    vocab_size = 100

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 90 for c in text] or [1]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)

    def token_to_str(self, i: int) -> str:
        return chr(97 + i % 26)


class LocalTokenizer(FakeTokenizer):
    """A tokenizer that must stay in its process (it refuses to pickle)."""

    def __reduce__(self):
        raise TypeError("this tokenizer does not leave its process")


class FakeCore:
    max_model_len = 20_000
    model_config = SimpleNamespace(vocab_size=100, family=FamilyConfig())

    def __init__(
        self, step_s: float = 0.002, fail_load: bool = False, mark: str = "", local_tokenizer=False
    ) -> None:
        if fail_load:
            raise ValueError("model file is corrupt")
        if mark:  # a file that gets one line per core built (where the loads are seen)
            with open(mark, "a") as f:
                f.write("built\n")
        self.tokenizer = LocalTokenizer() if local_tokenizer else FakeTokenizer()
        self.model_name = "fake"
        self.step_s = step_s
        self.reqs: dict[str, dict] = {}
        self.aborted: list[str] = []
        self.crash = False

    def add_request(self, rid, ids, params, checked=False, bulk=False) -> None:
        if ids[0] == 99:
            raise ValueError("prompt refused by the core")
        self.crash = self.crash or ids[0] == 98
        self._add(rid, params)

    def _add(self, rid, params) -> None:
        for i in range(params.n):
            self.reqs[f"{rid}#{i}"] = {"rid": rid, "i": i, "left": params.max_tokens, "out": 0}

    def abort_request(self, rid) -> None:
        self.aborted.append(rid)
        for key in [k for k, r in self.reqs.items() if r["rid"] == rid]:
            del self.reqs[key]

    def has_unfinished_requests(self) -> bool:
        return bool(self.reqs)

    def step(self) -> list[StepOutput]:
        if self.crash:
            raise RuntimeError("boom")
        now, outs = time.monotonic(), []
        for key, r in list(self.reqs.items()):
            r["left"] -= 1
            r["out"] += 1
            done = r["left"] == 0
            outs.append(self._output(r, done, now))
            if done:
                del self.reqs[key]
        time.sleep(self.step_s)
        return outs

    @staticmethod
    def _output(r: dict, done: bool, now: float) -> StepOutput:
        return StepOutput(
            r["rid"],
            r["i"],
            [r["out"]],
            "x",
            [],
            done,
            "length" if done else None,
            num_prompt_tokens=3,
            num_output_tokens=r["out"],
            arrival_time=now,
            first_scheduled_time=now,
            first_token_time=now,
        )

    def stats(self) -> EngineStats:
        return EngineStats(len(self.reqs), 0, 0.0, 10, 10, 0, 0, 0)

    def reset_counters(self) -> None:  # EngineCore's (after the warm-up); this one counts none
        pass

    def check_integrity(self) -> None:
        pass


def aborted(core: FakeCore) -> list[str]:
    """`run_in_engine` probe: the request ids the core was asked to abort."""
    return list(core.aborted)

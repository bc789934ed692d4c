"""The step channel (runtime/worker/step_channel.py) without a process group: a recording
`TPGroup` stand-in replays rank 0's broadcasts to the receiving rank, so a step's arrays and
its LoRA loads cross exactly as `send` wrote them."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from pagoda.runtime.lora_config import LoRARequest
from pagoda.runtime.worker.step_channel import StepChannel, _decode_loads, _encode_loads
from pagoda.runtime.worker.step_inputs import StepInputs


class Replay:
    """Rank 0's broadcasts recorded (`send`), then copied into the receiver's buffers in order."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []
        self.receiving = False

    def broadcast_host(self, x: torch.Tensor) -> torch.Tensor:
        if self.receiving:
            x.copy_(self.sent.pop(0))
        else:
            self.sent.append(x.clone())
        return x

    broadcast = broadcast_host


def _every_field_set() -> LoRARequest:
    """A request whose every field differs from its default (a field the channel forgot would
    come back as its default, or fail to build)."""
    r = LoRARequest("sql-adapter", 7, "/adapters/sql", base_model_name="base-model")
    for f in dataclasses.fields(LoRARequest):
        assert f.default is dataclasses.MISSING or getattr(r, f.name) != f.default, (
            f"set LoRARequest.{f.name} in this test"
        )
    return r


def test_a_lora_load_round_trips_every_field_of_its_request():
    r = _every_field_set()
    assert _decode_loads(_encode_loads([(3, r)])) == [(3, r)]
    assert _encode_loads([]) == b"" and _encode_loads(None) == b""


def test_a_step_with_a_lora_load_reaches_the_other_rank_as_sent():
    r = _every_field_set()
    inp = StepInputs(
        ids=np.array([5, 6, 7], dtype=np.int64), positions=np.array([0, 1, 4], dtype=np.int64),
        slots=np.array([0, 1, 20], dtype=np.int64), table=np.array([[0], [1]], dtype=np.int32),
        qlens=np.array([2, 1], dtype=np.int64), seq_lens=np.array([2, 5], dtype=np.int64),
        cu=np.array([0, 2, 3], dtype=np.int64), sampling=[0, 1], num_decodes=0,
        lora=np.array([1, 1, 0], dtype=np.int64), lora_loads=[(1, r)],
    )  # fmt: skip
    group = Replay()
    StepChannel(group).send(inp, torch.from_numpy(inp.ids))
    group.receiving = True
    got, ids = StepChannel(group).receive()
    assert ids.tolist() == [5, 6, 7] and not group.sent
    assert got.lora_loads == [(1, r)] and got.lora.tolist() == [1, 1, 0]
    for name in ("positions", "slots", "table", "qlens", "seq_lens", "cu"):
        assert np.array_equal(getattr(got, name), getattr(inp, name)), name
    assert got.sampling == [0, 1]


def test_a_step_with_m_rope_positions_reaches_the_other_rank_as_sent():
    """Qwen2-VL's [3, T] positions (`StepInputs.mrope`) cross with the host arrays; a step
    without them arrives without them."""
    mrope = np.array([[0, 1, 1, 1], [0, 1, 1, 2], [0, 1, 2, 1]], dtype=np.int64)
    inp = StepInputs(
        ids=np.array([5, 9, 9, 9], dtype=np.int64), positions=np.arange(4, dtype=np.int64),
        slots=np.arange(4, dtype=np.int64), table=np.array([[0]], dtype=np.int32),
        qlens=np.array([4], dtype=np.int64), seq_lens=np.array([4], dtype=np.int64),
        cu=np.array([0, 4], dtype=np.int64), sampling=[0], mrope=mrope,
    )  # fmt: skip
    for sent in (mrope, None):
        inp.mrope = sent
        group = Replay()
        StepChannel(group).send(inp, torch.from_numpy(inp.ids))
        group.receiving = True
        got, ids = StepChannel(group).receive()
        assert ids.tolist() == [5, 9, 9, 9] and not group.sent
        assert np.array_equal(got.positions, inp.positions) and got.sampling == [0]
        assert (got.mrope is None) if sent is None else np.array_equal(got.mrope, mrope)


def test_a_step_with_token_history_reaches_the_other_rank_as_sent():
    """A model reading the tokens before each sequence's step (Qwen4-Exp's n-grams,
    `token_history` 2 on both ranks): its [B, 2] history crosses after the rest."""
    history = np.array([[-1, -1], [3, 4]], dtype=np.int64)
    inp = StepInputs(
        ids=np.array([5, 6, 7], dtype=np.int64), positions=np.array([0, 1, 4], dtype=np.int64),
        slots=np.array([0, 1, 20], dtype=np.int64), table=np.array([[0], [1]], dtype=np.int32),
        qlens=np.array([2, 1], dtype=np.int64), seq_lens=np.array([2, 5], dtype=np.int64),
        cu=np.array([0, 2, 3], dtype=np.int64), sampling=[0, 1], num_decodes=0,
        history=history,
    )  # fmt: skip
    group = Replay()
    StepChannel(group, history=2).send(inp, torch.from_numpy(inp.ids))
    group.receiving = True
    got, _ = StepChannel(group, history=2).receive()
    assert np.array_equal(got.history, history) and got.sampling == [0, 1] and not group.sent
    assert np.array_equal(got.positions, inp.positions)

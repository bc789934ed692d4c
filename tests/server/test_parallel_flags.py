"""The tensor-parallel flags of `pagoda serve` (the contract the operator renders for a pod or a
LeaderWorkerSet group): parsed from `options.PARALLEL_FLAGS`, validated once by
`Parallelism`; a group the model cannot be split over (heads that do not divide) or
this node cannot hold (fewer GPUs than ranks) is refused with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pagoda.runtime import options
from pagoda.runtime.parallelism import Parallelism
from pagoda.runtime.server.cli import build_parser, parallelism

ROOT = Path(__file__).resolve().parents[2]


def layout(*argv: str) -> Parallelism:
    return Parallelism.from_values(vars(build_parser().parse_args(list(argv))))


def test_defaults_are_one_rank_on_one_node() -> None:
    p = layout()
    assert (p.tensor_parallel_size, p.nnodes, p.node_rank, p.ranks_per_node) == (1, 1, 0, 1)
    assert (p.address, p.master_port, p.is_worker) == ("127.0.0.1", 29500, False)
    assert parallelism(build_parser().parse_args([])) == p


def test_a_group_of_two_nodes_parses() -> None:
    p = layout("--tensor-parallel-size", "16", "--nnodes", "2", "--node-rank", "1",
               "--master-addr", "chat-lws-0.chat-lws.team-a", "--master-port", "29600")  # fmt: skip
    assert (p.ranks_per_node, p.is_worker, p.address) == (8, True, "chat-lws-0.chat-lws.team-a")
    rendered = options.render_args(
        {"tensor_parallel_size": 16, "nnodes": 2, "node_rank": 1, "master_addr": "h"}
    )
    assert layout(*rendered) == Parallelism(16, 2, 1, "h")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be in 1..1024"),
        (["--tensor-parallel-size", "3", "--nnodes", "2", "--master-addr", "h"], "must divide"),
        (["--tensor-parallel-size", "2", "--nnodes", "4", "--master-addr", "h"], "must divide"),
        (
            [
                "--tensor-parallel-size",
                "4",
                "--nnodes",
                "2",
                "--node-rank",
                "2",
                "--master-addr",
                "h",
            ],
            "--node-rank must be in 0..1",
        ),
        (["--node-rank", "-1"], "--node-rank must be in 0..0"),
        (["--tensor-parallel-size", "4", "--nnodes", "2"], "needs --master-addr"),
        (["--master-port", "70000"], "--master-port must be in 1..65535"),
    ],
)
def test_impossible_layouts_name_the_flag(argv: list[str], words: str) -> None:
    with pytest.raises(ValueError, match=words.replace(".", r"\.")):
        layout(*argv)


def test_a_group_the_model_or_node_cannot_hold_is_one_line_and_exit_2() -> None:
    """Checked before anything loads: one line naming the flag, exit 2, no traceback (the test
    below checks each of preflight's group refusals in process)."""
    argv = ["--tensor-parallel-size", "2"]  # the embedded model has 9 attention heads
    cmd = [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--port", "0", *argv]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagoda serve: error:"), result.stderr
    assert "--tensor-parallel-size 2 does not divide the model's 9 attention heads" in lines[0]
    assert "Traceback" not in result.stderr and "Uvicorn" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        # the embedded model has 9 attention heads and 3 KV heads
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2 does not divide the model's 9 "
         "attention heads"),
        (["--tensor-parallel-size", "9"], "does not divide the model's MLP width (1536)"),
        (["--tensor-parallel-size", "3", "--device", "cuda"],
         "runs 3 ranks on this node, one per GPU, and it has"),
    ],
)  # fmt: skip
def test_a_group_the_model_or_node_cannot_hold_is_refused_by_preflight(argv, words) -> None:
    import torch
    from pagoda.runtime.server.cli import server_config
    from pagoda.runtime.server.launch import preflight

    if "cuda" in argv and torch.cuda.device_count() >= 3:
        pytest.skip("this node has the GPUs")
    args = build_parser().parse_args(argv)
    with pytest.raises(ValueError) as err:
        preflight(
            server_config(args), options.engine_kwargs(vars(args)), parallel=parallelism(args)
        )
    assert words in str(err.value), err.value

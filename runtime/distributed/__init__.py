"""Tensor parallelism: process groups (NCCL or gloo), sharded layers, rank 0's executor and the
other ranks' step loop (docs/runtime.md, "Tensor parallelism")."""

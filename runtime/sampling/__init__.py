"""Sampling: the request's parameters (`params`), the batched sampler (`sampler`) over the
PyTorch ops (`ops`) and penalties (`penalties`), and the native CPU kernels (`native`, C in
``csrc/``)."""

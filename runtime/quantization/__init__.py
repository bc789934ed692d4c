"""Quantized weights for the model loader: FP8 checkpoint formats and online FP8 (`fp8`)."""

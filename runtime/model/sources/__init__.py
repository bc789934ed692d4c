"""Weights from where people keep them: `hf://ORG/NAME[@REVISION]` and `s3://BUCKET/PREFIX`.

    fetch.resolve_model("hf://Qwen/Qwen3-0.6B", "/models")   # → /models/models--Qwen--Qwen3-0.6B/snapshots/<commit>

uri.py (the grammar; torch-free, the operator validates with it), errors.py (failure classes),
cache.py (download-dir layout, manifests, free space), progress.py (log lines), hub.py
(huggingface_hub), resume.py (a killed hf:// download goes on), s3.py (boto3), s3_parts.py (an
object in ranged parts, resumable), prune.py (old snapshots, in-use locks), fetch.py (cache or
download), cli.py (`pagoda download`).
huggingface_hub and boto3 are imported only when a download happens; this package imports
nothing, so the operator (without torch) loads only uri.py.
"""

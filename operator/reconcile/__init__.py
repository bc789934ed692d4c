"""Making the cluster match the spec, and the paths that run it.

* `apply.py`     — create or patch one child (409/404 handled), delete one that must not exist
* `reconcile.py` — one InferenceService: validate, apply every child, write status; child events
* `retry.py`     — `Reconciler`: kopf's error semantics, metrics, follow-up retries, the resync
"""

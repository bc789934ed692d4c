"""The Kubernetes floor: what the operator knows of the API, and nothing of the spec.

* `names.py`  — the bottom floor: API group and kind, labels, selectors, owned kinds, the port
* `client.py` — `KubeApi`: every API call besides kopf's own (aiohttp), `ApiError`, Events
* `rbac.py`   — every (group, resource, verbs) those calls and kopf's need
* `locks.py`  — the per-object lock the reconciler and the autoscaler share
* `drift.py`  — is a live object in sync with the desired one; the merge patch that fixes it
"""

"""The children of an InferenceService as pure builders: parsed spec + owner → manifests (dicts).

* `owner.py`      — the owner's identity and `kopf.adopt`
* `serve_args.py` — spec → the `pagoda serve` command line (the contract with the runtime)
* `config_map.py`, `deployment.py`, `service.py`, `pdb.py`, `monitoring.py` — one kind each
* `leaderworkerset.py` — a multi-node group (LeaderWorkerSet) from the Deployment's pod template
* `build.py`      — `build_children`: all of them in apply order, and those that must not exist
"""

"""Autotuning: one `pagoda tune` Job per (GPU product, model, shapes, image) key, its profile in a
shared ConfigMap mounted into the serving pods, and the autoscaler's predictive floor.

See docs/operator.md ("Autotuning"); `spec.autotune` itself is parsed in spec/engine.py. Modules: keys (what a profile is
measured for), jobs (Job + least-privilege hand-back RBAC), profiles (the ConfigMap), mount (the
Deployment side), loop (the I/O shell), publish (`pagoda publish-profile`, run by the Job), floor.
"""

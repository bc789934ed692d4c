"""Prometheus's command-line tools in the tests (tests/charts, tests/operator): find one, run
promtool, and promtool's unit test of the TTFT alert, which the chart's rules and the operator's
per-service ones both answer."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
from typing import Any

import pytest
import yaml


def require_tool(*names: str) -> str:
    """The first of `names` on PATH; else skip, or fail in CI (PAGODA_REQUIRE_E2E=1, as
    tests/conftest.py's skip_or_fail: .ci/run installs Prometheus and Alertmanager)."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    reason = (
        f"{' or '.join(names)} not installed (apt-get install prometheus prometheus-alertmanager)"
    )
    if os.environ.get("PAGODA_REQUIRE_E2E") == "1":
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def promtool(*args: str, cwd: pathlib.Path) -> str:
    """`promtool args...` run in `cwd`; its output (the test fails where promtool does)."""
    result = subprocess.run(
        [require_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def promtool_test(tmp_path: pathlib.Path, test: dict[str, Any]) -> str:
    """`promtool test rules` of the unit test file `test` (its `rule_files` in `tmp_path`)."""
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    return promtool("test", "rules", "test.yaml", cwd=tmp_path)


def ttft_alert_test(
    rule_files: list[str],
    namespace: str,
    isvc: str,
    buckets: list[tuple[str, int]],
    annotations: dict[str, str],
) -> dict[str, Any]:
    """A promtool unit test: `isvc` and `other` in `namespace` with the same TTFT histogram
    (`buckets`: each bucket's `le` and its count's rise per minute, from one pod each); at 5 min
    PagodaTTFTHigh fires once, for `isvc` alone, with `annotations`."""
    series = [
        {
            "series": f'pagoda:time_to_first_token_seconds_bucket{{namespace="{namespace}",'
            f'inferenceservice="{name}",pod="{name}-0",le="{le}"}}',
            "values": f"0+{per_min}x10",
        }
        for name in (isvc, "other")
        for le, per_min in buckets
    ]
    labels = {"severity": "warning", "pagoda_action": "scale_up", "namespace": namespace,
              "inferenceservice": isvc}  # fmt: skip
    alert = {"exp_labels": labels, "exp_annotations": annotations}
    return {
        "rule_files": rule_files,
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "PagodaTTFTHigh", "exp_alerts": [alert]}
                ],
            }
        ],
    }

"""Tell the user, before `make test` runs, which end-to-end tests will skip and how to get them.

Exit status 1 when a tool is missing (the Makefile goes on either way; CI sets
PAGODA_REQUIRE_E2E=1, which turns those skips into failures).
"""

import shutil
import sys

TOOLS = {
    "prometheus": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "promtool": "prometheus",
    "kubectl": "kubectl",
}

missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
if missing:
    print(
        "NOTE: the autoscaling/kubectl end-to-end tests will be SKIPPED: not installed: "
        f"{', '.join(missing)}.\n"
        "      Install Prometheus and Alertmanager with `sudo make test-deps` "
        "(Debian/Ubuntu: apt-get install prometheus prometheus-alertmanager), then run make test again.",
        file=sys.stderr,
    )
    sys.exit(1)

#!/usr/bin/env sh
# Copy the CRDs (source of truth: crds/ at the repository root) into the Helm chart.
# tests/charts/test_chart_files.py fails until the two folders are byte-identical.
set -eu
root="$(cd "$(dirname "$0")/.." && pwd)"
rm -f "$root"/charts/pagoda/crds/*.yaml
cp "$root"/crds/*.yaml "$root"/charts/pagoda/crds/
echo "synced: $(cd "$root/crds" && ls ./*.yaml | tr '\n' ' ')"

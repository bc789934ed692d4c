"""Tune tests start real `pagoda serve` processes with the server tests' helper."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server"))

"""Where things are, once."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The controller's tools, beside the interpreter running the tests (the project's venv).
BIN = Path(sys.executable).parent

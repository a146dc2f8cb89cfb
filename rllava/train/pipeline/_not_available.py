"""RLLaVA's pipeline modules rllava has not built yet: the module exists, so `python -m` names what to use
instead in one line (exit 2) rather than failing with "No module named"."""

from __future__ import annotations

import sys


def not_available(module: str, what: str, instead: str) -> None:
    print(f"rllava: error: {module} ({what}) is not available yet in rllava; {instead}", file=sys.stderr)
    sys.exit(2)

"""Command-line entry shared by the pipelines: config from `config=FILE k=v ...`, one-line errors."""

from __future__ import annotations

import sys
import time
from typing import Callable

from rllava.config import load_config
from rllava.errors import RllavaError


def run_cli(train: Callable, argv: list[str] | None = None) -> None:
    """`train(cfg) -> outputs_dir`. A user error (config, data, reward file, model path) prints one line and
    exits with status 2, never a traceback."""
    start = time.time()
    try:
        outputs_dir = train(load_config(sys.argv[1:] if argv is None else argv))
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"done in {time.time() - start:.0f}s; outputs in {outputs_dir}")

"""Command-line entry shared by the pipelines: config from `config=FILE k=v ...`, one-line errors."""

from __future__ import annotations

import sys
import time
from typing import Callable

from rllava import distributed as D
from rllava.config import load_config
from rllava.errors import RllavaError


def run_cli(train: Callable, argv: list[str] | None = None) -> None:
    """`train(cfg) -> outputs_dir`. A user error (config, data, reward file, model path) prints one line and
    exits with status 2, never a traceback. From the command line (`argv` None) the process ends through
    `D.exit_process`, so a torchrun worker never races its communication threads at exit."""
    start, code = time.time(), 0
    try:
        outputs_dir = train(load_config(sys.argv[1:] if argv is None else argv))
    except RllavaError as e:
        print(f"rllava: error: {e}", file=sys.stderr)
        code = 2
    else:
        D.close()
        print(f"done in {time.time() - start:.0f}s; outputs in {outputs_dir}")
    if argv is None:
        D.exit_process(code)
    elif code:
        sys.exit(code)

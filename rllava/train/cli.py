"""Command-line entry shared by the pipelines: config from `config=FILE k=v ...`, one-line errors, exit codes.

    0    the run finished (final/ written)
    2    a user error: one line `rllava: error: ...` (bad config, data, reward file, model, checkpoint, a full or
         unwritable disk). RLLAVA_DEBUG=1 prints the traceback as well.
    130  interrupted (Ctrl-C / SIGINT), one line; checkpoints already written stay, final/ is not written
    SIGTERM keeps its default action (the process ends with the signal, a non-zero status); what a kill leaves
    half-written (`.tmp` directories) is removed by the next start.
"""

from __future__ import annotations

import errno
import os
import sys
import time
import traceback
import warnings
from typing import Callable

from rllava import distributed as D
from rllava.config import load_config
from rllava.errors import RllavaError, first_failure

# OSErrors that are the machine's state, not a bug: reported as one line naming the path.
ENVIRONMENT_ERRNOS = {errno.ENOSPC: "free some space there or point trainer.outputs_dir elsewhere",
                      errno.EDQUOT: "free some space there or point trainer.outputs_dir elsewhere",
                      errno.EACCES: "check the permissions or point trainer.outputs_dir elsewhere",
                      errno.EPERM: "check the permissions or point trainer.outputs_dir elsewhere",
                      errno.EROFS: "point trainer.outputs_dir at a writable file system",
                      errno.ENOTDIR: "a path component is a file, not a directory"}


def user_message(e: BaseException) -> str | None:
    """The one line a user gets for `e`, or None for a bug (which keeps its traceback)."""
    if isinstance(e, RllavaError):
        return str(e)
    cause = first_failure(e)  # torch DCP wraps each rank's failure
    if cause is not e:
        return user_message(cause)
    if isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS:
        where = f": {e.filename}" if e.filename else ""
        return f"{e.strerror or os.strerror(e.errno)}{where} ({ENVIRONMENT_ERRNOS[e.errno]})"
    return None


def _next_time(cfg) -> str:
    """What the same command does next time, after an interrupt."""
    if cfg is None:
        return "nothing was started"
    from rllava.train import builders as B
    from rllava.train import checkpoint as C

    outputs_dir = B.run_outputs_dir(cfg)
    saved = C.list_checkpoints(C.checkpoint_root(cfg, outputs_dir))
    if saved and cfg.trainer.resume == "none":
        return f"trainer.resume=auto continues it from {saved[-1][1]} (step {saved[-1][0]})"
    if saved:
        return f"the same command resumes from {saved[-1][1]} (step {saved[-1][0]})"
    return "no checkpoint was saved: the same command starts this run again"


_library_format = warnings.formatwarning


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """rllava's own warnings (a key the run ignores, ...) as one line, without Python's file:line header."""
    if f"{os.sep}rllava{os.sep}" in filename and issubclass(category, UserWarning):
        return f"rllava: warning: {message}\n"
    return _library_format(message, category, filename, lineno, line)


def quiet_libraries() -> None:
    """No library noise at start-up: DeepSpeed's accelerator guess on a machine without CUDA (it is imported
    by transformers when a model is saved), datasets' per-file progress bars; rllava's warnings in one line."""
    import datasets
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    datasets.disable_progress_bars()
    warnings.formatwarning = _one_line_warning


def _elastic_error_record(line: str) -> None:
    """Under torchrun, the root cause its failure summary prints (torch.distributed.elastic's error file, the
    documented hand-over): the one line, at the end of what the user sees, instead of a link to the docs."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        import json

        with open(path, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                 "timestamp": str(int(time.time()))}}}, f)


def run_cli(train: Callable, argv: list[str] | None = None) -> None:
    """`train(cfg) -> outputs_dir`. A user error prints one line and exits with status 2, never a traceback
    (unless RLLAVA_DEBUG=1); Ctrl-C exits 130. From the command line (`argv` None) the process ends through
    `D.exit_process`, so a torchrun worker never races its communication threads at exit."""
    start, code, cfg = time.time(), 0, None
    quiet_libraries()
    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv)
        outputs_dir = train(cfg)
    except KeyboardInterrupt:
        if os.environ.get("RLLAVA_DEBUG") == "1":
            traceback.print_exc()
        print(f"rllava: interrupted: no final/ written; {_next_time(cfg)}", file=sys.stderr)
        code = 130
    except BaseException as e:  # noqa: BLE001  DCP's CheckpointException is a BaseException
        message = None if isinstance(e, SystemExit) else user_message(e)
        if message is None:
            raise
        if os.environ.get("RLLAVA_DEBUG") == "1":
            traceback.print_exc()
        print(f"rllava: error: {message}", file=sys.stderr)
        _elastic_error_record(f"rllava: error: {message}")
        code = 2
    else:
        D.close()  # after the last collective: every rank here, then the group destroyed
        print(f"done in {time.time() - start:.0f}s; outputs in {outputs_dir}")
    if argv is None:
        D.exit_process(code)
    elif code:
        sys.exit(code)

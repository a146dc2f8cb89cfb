"""Command-line entry shared by the pipelines: config from `config=FILE k=v ...`, one-line errors, exit codes.

    0    the run finished (final/ written), or had finished before and nothing is left to do (one line says so)
    2    a user error: one line `rllava: error: ...` (bad config, data, reward file, model, checkpoint, a full or
         unwritable disk). RLLAVA_DEBUG=1 prints the traceback as well.
    130  interrupted (Ctrl-C / SIGINT), one line; checkpoints already written stay, final/ is not written
    SIGTERM keeps its default action (the process ends with the signal, a non-zero status); what a kill leaves
    half-written (`.tmp` directories) is removed by the next start.
"""

from __future__ import annotations

import ast
import errno
import importlib.util
import json
import logging
import os
import sys
import time
import traceback
import warnings
from typing import Callable

from rllava.config import load_config  # no torch: `check_config` runs before the pipeline imports it
from rllava.errors import RllavaError, RunFinished, first_failure

# OSErrors that are the machine's state, not a bug: reported as one line naming the path.
_FULL = "free some space there or point trainer.outputs_dir elsewhere"
_DENIED = "check the permissions or point trainer.outputs_dir elsewhere"
ENVIRONMENT_ERRNOS = {errno.ENOSPC: _FULL, errno.EDQUOT: _FULL, errno.EACCES: _DENIED, errno.EPERM: _DENIED,
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

    saved = C.list_checkpoints(C.checkpoint_root(cfg, B.run_outputs_dir(cfg)))
    if not saved:
        return "no checkpoint was saved: the same command starts this run again"
    how = "trainer.resume=auto continues it" if cfg.trainer.resume == "none" else "the same command resumes"
    return f"{how} from {saved[-1][1]} (step {saved[-1][0]})"


_library_format = warnings.formatwarning


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """rllava's own warnings (a key the run ignores, ...) as one line, without Python's file:line header."""
    if f"{os.sep}rllava{os.sep}" in filename and issubclass(category, UserWarning):
        return f"rllava: warning: {message}\n"
    return _library_format(message, category, filename, lineno, line)


def quiet_libraries() -> None:
    """No library noise at start-up: datasets' per-file progress bars (DeepSpeed's accelerator guess: rllava.model);
    rllava's warnings in one line."""
    import datasets

    datasets.disable_progress_bars()
    warnings.formatwarning = _one_line_warning


def command_line(argv: list[str], module: str) -> None:
    """What `python -m rllava.train.pipeline.<name>` (`module`) does before it imports torch (~10 s of CPU): --help,
    the config's error at once, torch's CPU threads, rllava's logged warnings as `rllava: warning:` lines, from rank 0
    only."""
    if "-h" in argv or "--help" in argv:
        print(pipeline_help(module))
        sys.exit(0)
    check_config(argv)
    cpu_threads()
    log = logging.getLogger("rllava")
    log.addHandler(logging.StreamHandler())
    log.handlers[-1].setFormatter(logging.Formatter("rllava: warning: %(message)s"))
    if not _is_main():
        warnings.simplefilter("ignore")
        log.setLevel(logging.ERROR)
        os.environ["TQDM_DISABLE"] = "1"  # and no progress bars (loading weights, ...)


def pipeline_help(module: str) -> str:
    """A pipeline's --help: its module's docstring, read without importing the module (and torch), and its arguments."""
    with open(importlib.util.find_spec(module).origin) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    return (f"{doc}\n\narguments: config=FILE (a YAML file), then any key as key=value (every key, its default and "
            "what it does: docs/config.md); an unknown key is an error naming the closest")


RANK0_GRACE_S = 10


def _say_error(line: str, main: bool) -> None:
    """Rank 0 prints the line. Under torchrun every rank writes it to torch.distributed.elastic's error file, so the
    failure summary ends with it, not a link to the docs; the others wait RANK0_GRACE_S first: every rank usually
    meets the same error and torchrun ends them once rank 0 fails, so the summary names one failure, not one each."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if main or not path:
        print(line, file=sys.stderr, flush=True)
    else:
        time.sleep(RANK0_GRACE_S)
    if path:
        with open(path, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                 "timestamp": str(int(time.time()))}}}, f)


def _is_main() -> bool:
    """Rank 0 of the launch (RANK before `rllava.distributed` renumbers the ranks of trainer.rollout_ranks)."""
    return os.environ.get("RANK", "0") == "0"


def check_config(argv: list[str]) -> None:
    """Exit 2 with the config's one-line error, if any, before torch is imported (the run's own load warns)."""
    if os.environ.get("RLLAVA_DEBUG") == "1":  # the run's own load prints the traceback
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_config(argv)
    except RllavaError as e:
        _say_error(f"rllava: error: {e}", _is_main())
        sys.exit(2)


def cpu_threads(seconds: float = 0.2, stat: str = "/proc/stat") -> None:
    """Call before torch loads. torch runs a thread per core; where other processes keep cores busy they wait for each
    other at every op (2-4x slower steps on 2 cores, one busy: docs/rllava_scripts.md, "CPU threads"). Unless
    OMP_NUM_THREADS is set: as many threads as cores were idle over `seconds`, shared by this node's processes."""
    if "OMP_NUM_THREADS" in os.environ or not os.path.exists(stat):
        return
    cpus = {f"cpu{i}" for i in os.sched_getaffinity(0)}

    def idle_and_total() -> tuple[int, int]:  # ticks of this process's CPUs in /proc/stat: idle + iowait, all
        with open(stat) as f:
            rows = [r.split() for r in f if r.split()[0] in cpus]
        return sum(int(r[4]) + int(r[5]) for r in rows), sum(int(x) for r in rows for x in r[1:9])

    idle0, total0 = idle_and_total()
    time.sleep(seconds)
    idle1, total1 = idle_and_total()
    idle = round(len(cpus) * (idle1 - idle0) / max(total1 - total0, 1))
    if idle < len(cpus):
        os.environ["OMP_NUM_THREADS"] = str(max(1, idle // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        if _is_main():
            print(f"rllava: {len(cpus) - idle} of {len(cpus)} CPU cores busy: {os.environ['OMP_NUM_THREADS']} torch "
                  "thread(s) a process (OMP_NUM_THREADS=N to choose)", file=sys.stderr)


def run_cli(train: Callable, argv: list[str] | None = None) -> None:
    """`train(cfg) -> outputs_dir`; a user error exits 2 with one line (a traceback only with RLLAVA_DEBUG=1), Ctrl-C
    130; rank 0 alone speaks. From the command line (`argv` None) `D.exit_process` ends it: no thread races the exit."""
    from rllava import distributed as D

    start, code, cfg, main = time.time(), 0, None, _is_main()
    quiet_libraries()
    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv)
        outputs_dir = train(cfg)
    except RunFinished as e:  # the same run asked again, finished: its line, exit 0
        if main:
            print(e, flush=True)
    except BaseException as e:  # noqa: BLE001  DCP's CheckpointException is a BaseException
        interrupted = isinstance(e, KeyboardInterrupt)
        message = None if interrupted or isinstance(e, SystemExit) else user_message(e)
        if message is None and not interrupted:
            raise
        if os.environ.get("RLLAVA_DEBUG") == "1":
            traceback.print_exc()
        if not interrupted:
            _say_error(f"rllava: error: {message}", main)
        elif main:
            print(f"rllava: interrupted: no final/ written; {_next_time(cfg)}", file=sys.stderr)
        code = 130 if interrupted else 2
    else:
        D.close()  # after the last collective: every rank here, then the group destroyed
        if main:
            print(f"done in {time.time() - start:.0f}s; outputs in {outputs_dir}")
    if argv is None:
        D.exit_process(code)
    elif code:
        sys.exit(code)

"""Guarding the run against a user's reward function: a time limit per call, and nothing it does ends the run.

A reward file may loop, sleep, raise, call `sys.exit` or `os._exit`, or return garbage: every call ends in an `Outcome`,
the value or one line on what went wrong (raised, timed out, exited); the caller (`rllava.reward.function`) stops the
run (`reward.strict=true`) or scores the sample `reward.fallback_score`. `HANG_LIMIT` calls in a row (in one batch) past
`reward.timeout` stop the run, named: a hanging function would cost that for every sample.

Two runners, picked by `reward.num_cpus`:
- `InProcess` (num_cpus=1, the default and the fast path): calls in this process under a SIGALRM timer
  (`signal.setitimer`), which interrupts Python code (a `time.sleep`, a loop) but not a C call that never returns to the
  interpreter (a pathological regex); `sys.exit` is caught as its `SystemExit`, and `os._exit` made to raise.
- `WorkerPool` (num_cpus=N>1): N forked workers score in parallel. A call past its limit gets its worker killed (SIGKILL
  stops anything, C code included) and replaced; one that exits (os._exit, a crash) is reported and replaced."""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import threading
import time
import warnings
from collections import deque
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Callable

from rllava.errors import RllavaError

HANG_LIMIT = 3  # calls in a row past reward.timeout: the function hangs, the run stops


class Hanging(RllavaError):
    """HANG_LIMIT calls in a row did not return within the time limit."""


class _Hangs:
    """Counts a batch's timeouts in a row (in the order calls end); at HANG_LIMIT, raises Hanging naming `name`."""

    def __init__(self, name: str, timeout: float | None):
        self.name, self.timeout, self.in_a_row = name, timeout, 0

    def __call__(self, out: "Outcome") -> "Outcome":
        timed_out = self.timeout is not None and out.error == _timeout_text(self.timeout)
        self.in_a_row = self.in_a_row + 1 if timed_out else 0
        if self.in_a_row >= HANG_LIMIT:
            raise Hanging(f"{self.name}: {HANG_LIMIT} calls in a row did not return within reward.timeout="
                          f"{self.timeout:g}s: it hangs, and the run stops rather than wait that long for every "
                          "sample; fix it, or raise reward.timeout if it is only slow")
        return out


@dataclass
class Outcome:
    value: Any = None
    error: str | None = None  # e.g. "raised KeyError: 'x'", "did not return within reward.timeout=5s"


class _TimedOut(BaseException):
    """Raised by the SIGALRM handler. A BaseException, so a reward's own `except Exception:` does not eat it."""


class _ProcessExit(BaseException):
    code = property(lambda self: self.args[0])  # os._exit(code)'s


def _timeout_text(timeout: float | None) -> str:
    return f"did not return within reward.timeout={timeout:g}s"


def call_once(fn: Callable, args: tuple, kwargs: dict) -> Outcome:
    """`fn(*args, **kwargs)` -> Outcome; KeyboardInterrupt (Ctrl-C) and the runner's own timer pass through."""
    try:
        return Outcome(fn(*args, **kwargs))
    except (KeyboardInterrupt, _TimedOut):
        raise
    except BaseException as e:  # noqa: BLE001  SystemExit and GeneratorExit too: they are the reward's bugs
        if isinstance(e, (SystemExit, _ProcessExit)):  # one line for what the call did instead of returning
            exit_fn = "sys.exit" if isinstance(e, SystemExit) else "os._exit"
            return Outcome(error=f"called {exit_fn}({e.code!r}) (a reward must return a score, not end the process)")
        text = str(e).splitlines()[0] if str(e) else ""
        return Outcome(error=f"raised {type(e).__name__}" + (f": {text}" if text else ""))


class InProcess:
    """Calls in this process, each under a SIGALRM timer of `timeout` seconds (None = no limit)."""

    def __init__(self, fn: Callable, timeout: float | None, name: str = "the reward function"):
        self.fn, self.timeout, self.name = fn, timeout, name

    def run(self, calls: list[tuple[tuple, dict]]) -> list[Outcome]:
        hangs = _Hangs(self.name, self.timeout)
        with self._guarded() as timed:
            return [hangs(self._one(args, kwargs, timed)) for args, kwargs in calls]

    def _one(self, args: tuple, kwargs: dict, timed: bool) -> Outcome:
        start = time.perf_counter()
        try:
            if timed:
                signal.setitimer(signal.ITIMER_REAL, self.timeout)
            out = call_once(self.fn, args, kwargs)
        except _TimedOut:
            return Outcome(error=_timeout_text(self.timeout))
        finally:
            if timed:
                signal.setitimer(signal.ITIMER_REAL, 0)
        # a reward may cancel the timer itself (libraries that use SIGALRM for their own limits do): still late
        late = self.timeout is not None and out.error is None and time.perf_counter() - start > self.timeout
        return Outcome(error=_timeout_text(self.timeout)) if late else out

    @contextmanager
    def _guarded(self):
        """os._exit raises in the call; SIGALRM raises _TimedOut (main thread only; elsewhere checked afterwards)."""
        real_exit = os._exit

        def no_exit(code):
            raise _ProcessExit(code)

        def on_alarm(signum, frame):
            raise _TimedOut()

        timed = self.timeout is not None and threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGALRM, on_alarm) if timed else None
        os._exit = no_exit
        try:
            yield timed
        finally:
            os._exit = real_exit
            if timed:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)

    def close(self) -> None:
        pass


def _serve(conn, fn: Callable) -> None:
    """A worker: calls from the pipe until None or the parent goes away. Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if msg is None:
            return
        out = call_once(fn, *msg)
        try:
            conn.send(out)
        except Exception as e:  # noqa: BLE001  e.g. a result that cannot be pickled
            conn.send(Outcome(error=f"returned a value that cannot be sent back ({type(e).__name__}: {e})"))


class _Worker:
    def __init__(self, ctx, fn: Callable):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, fn), daemon=True)
        with warnings.catch_warnings():  # fork with torch's threads alive: the worker runs only the reward
            warnings.simplefilter("ignore", DeprecationWarning)
            self.proc.start()
        child.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


class WorkerPool:
    """`num_workers` forked processes, each running `fn`; a call past `timeout` seconds kills its worker."""

    def __init__(self, fn: Callable, timeout: float | None, num_workers: int, name: str = "the reward function"):
        self.fn, self.timeout, self.name = fn, timeout, name
        self.ctx = mp.get_context("fork")  # the worker inherits the loaded reward function: no re-import
        self.workers = [_Worker(self.ctx, fn) for _ in range(num_workers)]

    def run(self, calls: list[tuple[tuple, dict]]) -> list[Outcome]:
        results: list[Outcome | None] = [None] * len(calls)
        todo, busy = deque(range(len(calls))), {}  # busy: worker index -> (call index, deadline)
        hangs = _Hangs(self.name, self.timeout)
        while todo or busy:
            for w in range(len(self.workers)):
                if todo and w not in busy:
                    i = todo.popleft()
                    self.workers[w].conn.send(calls[i])
                    busy[w] = (i, time.monotonic() + self.timeout if self.timeout is not None else None)
            deadlines = [d for _, d in busy.values() if d is not None]
            wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            mp.connection.wait([self.workers[w].conn for w in busy] + [self.workers[w].proc.sentinel for w in busy],
                               timeout=wait)
            for w, (i, deadline) in list(busy.items()):
                worker = self.workers[w]
                if worker.conn.poll():
                    try:
                        results[i] = hangs(worker.conn.recv())
                        del busy[w]
                        continue
                    except (EOFError, OSError):  # the worker is gone: reap it to read its exit code
                        worker.proc.join(timeout=5)
                if not worker.proc.is_alive():
                    results[i] = Outcome(error=f"ended its worker process (exit code {worker.proc.exitcode}: "
                                               "os._exit or a crash; a reward must return a score)")
                elif deadline is not None and time.monotonic() >= deadline:
                    results[i] = Outcome(error=_timeout_text(self.timeout))
                else:
                    continue
                worker.kill()
                self.workers[w] = _Worker(self.ctx, self.fn)
                del busy[w]
                hangs(results[i])
        return results

    def close(self) -> None:
        for w in self.workers:
            with suppress(OSError, ValueError):
                w.conn.send(None)
            w.proc.join(timeout=1)
            if w.proc.is_alive():
                w.kill()
        self.workers = []


def make_runner(fn: Callable, timeout: float | None, num_cpus: int, name: str = "the reward function"):
    """reward.num_cpus=1: in this process; N>1: a pool of N worker processes. `name`: for the messages."""
    return InProcess(fn, timeout, name) if num_cpus <= 1 else WorkerPool(fn, timeout, num_cpus, name)

"""Run model-written Python where it can harm nothing: the executor of the `code` tool.

    python -m rllava.agent.sandbox FILE.py [--image IMG ...] [--cpu-s 5 --wall-s 10 --memory-mb 1024 ...]

prints the observation a model would get for that snippet (exit 0 even when the snippet failed), so the limits
can be tried by hand. Model output is hostile input; each call runs in a fresh child process, forked from a
warmed-up server (`rllava/agent/sandbox_child.py`, `python -I`, an empty environment: no tokens, keys or proxies
inherited; a fork costs milliseconds where a fresh interpreter costs ~0.17 s) that

1. loads what a snippet may import (PIL with every format plugin, numpy, math, re, random, collections, ...),
2. leaves the network: a new network namespace with no interface; where the OS refuses one, the socket layer
   is disabled inside the interpreter instead (`Result.guards` says which held),
3. is shut into a fresh temporary directory holding only the task's images (`image.png`, `image_1.png`, ...):
   chroot, so nothing else of the file system exists for it: not /etc, not the project, not /proc,
4. sets its limits with setrlimit: CPU seconds, address space, file size, open files, processes, no core file,
5. drops to user nobody when it runs as root (so that the process limit binds and nothing of root's can be
   read, written or signalled); not root, it keeps only a user namespace's root with every capability cleared.

The parent kills the child's process group at the wall-clock limit, keeps at most `output_chars` of its stdout
and stderr, takes back the images the snippet saved in its directory (PNG/JPEG/BMP/GIF/WEBP, at most
`max_images`, each checked against `max_pixels` before it is decoded: no decompression bomb), and deletes the
directory (and any process still jailed in it, found by its root directory, even one that left the group).
Where neither a chroot nor a user namespace is possible, files outside the directory are refused by
a Python audit hook (weaker: C code is not stopped); the fallback is logged once.

Not a VM: it does not protect against kernel exploits, or against using the CPU and memory it is allowed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

from PIL import Image

log = logging.getLogger(__name__)
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
_warned: set[str] = set()


@dataclass(frozen=True)
class Limits:
    """What one snippet may use (`rollout.agent.tool_kwargs.code.*`)."""

    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU)
    wall_s: float = 10.0  # seconds before the whole process group is killed
    memory_mb: int = 1024  # address space (RLIMIT_AS); the interpreter with numpy and PIL takes ~400 of it
    file_mb: int = 16  # largest file it may write, its output included (RLIMIT_FSIZE)
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 64  # processes and threads of user nobody (RLIMIT_NPROC), all sandboxes together
    output_chars: int = 2000  # of stdout and of stderr, each, kept for the observation
    max_images: int = 4  # images taken back
    max_pixels: int = 4096 * 4096  # per image taken back


@dataclass
class Result:
    """What a snippet did: its output, the images it saved, and which limit (if any) stopped it."""

    stdout: str = ""
    stderr: str = ""
    images: list = field(default_factory=list)
    returncode: int = 0
    stopped_by: str | None = None  # "wall-clock limit", "CPU time limit", "memory limit", ...
    guards: dict = field(default_factory=dict)  # which guard held for the network, files and user

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.stopped_by is None

    def text(self) -> str:
        """The observation's text: the output, or what went wrong and why."""
        parts = [self.stdout.rstrip()] if self.stdout.strip() else []
        if not self.ok:
            why = self.stopped_by or f"exit status {self.returncode}"
            parts.append(f"Error ({why}):\n{self.stderr.rstrip()}" if self.stderr.strip() else f"Error ({why})")
        if self.images:
            parts.append(f"[{len(self.images)} image{'s' if len(self.images) > 1 else ''} saved]")
        return "\n".join(parts) or "(no output)"


def run_code(code: str, images: list | tuple = (), limits: Limits = Limits()) -> Result:
    """Run `code` in a fresh sandbox whose directory holds `images` (PIL) as image.png, image_1.png, ..."""
    workdir = tempfile.mkdtemp(prefix="rllava_sandbox_")
    try:
        for i, image in enumerate(images):
            image.save(os.path.join(workdir, "image.png" if i == 0 else f"image_{i}.png"))
        with open(os.path.join(workdir, "snippet.py"), "w") as f:
            f.write(code)
        if os.geteuid() == 0:  # the child runs as nobody: its directory must be its own
            for path in [workdir] + [os.path.join(workdir, n) for n in os.listdir(workdir)]:
                os.chown(path, 65534, 65534)
        given = set(os.listdir(workdir))
        return _run(workdir, given, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _ForkServer:
    """The warmed-up interpreter that forks one child per snippet (rllava/agent/sandbox_child.py): started on first
    use by each process that runs snippets, and again if it died. Thread-safe: the code tool's calls of one round
    run from a pool of threads."""

    ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # nothing of the trainer's environment

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-I", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=self.ENV, cwd="/", start_new_session=True, text=True, bufsize=1)
        self.owner, self.lock, self.ids, self.boxes = os.getpid(), threading.Lock(), itertools.count(), {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.lock:
                box = self.boxes.get(message["id"])
            if box is not None:
                box.put(message)
        with self.lock:  # the server is gone: nobody waits for an answer that cannot come
            for box in self.boxes.values():
                box.put({"dead": True})

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def run(self, request: dict, wall_s: float) -> tuple[int, bool]:
        """(exit status, timed out) of one snippet; at the wall clock its session is killed."""
        box, rid = queue.Queue(), next(self.ids)
        with self.lock:
            self.boxes[rid] = box
            self.proc.stdin.write(json.dumps({**request, "id": rid}) + "\n")
            self.proc.stdin.flush()
        try:
            pid = self._answer(box, 30.0)["pid"]
            try:
                return self._answer(box, wall_s)["status"], False
            except queue.Empty:
                _kill_group(pid)
                return self._answer(box, 30.0)["status"], True
            finally:
                _kill_group(pid)  # what it left in its session
        finally:
            with self.lock:
                del self.boxes[rid]

    @staticmethod
    def _answer(box: queue.Queue, timeout: float) -> dict:
        message = box.get(timeout=timeout)
        if message.get("dead"):
            raise RuntimeError("the sandbox's fork server died")
        return message


_server: _ForkServer | None = None
_server_lock = threading.Lock()


def _fork_server() -> _ForkServer:
    global _server
    with _server_lock:
        if _server is None or not _server.alive():
            _server = _ForkServer()
        return _server


def _run(workdir: str, given: set, limits: Limits) -> Result:
    with tempfile.TemporaryDirectory(prefix="rllava_sandbox_out_") as io_dir:  # outside the jail, root's
        out, err = os.path.join(io_dir, "stdout"), os.path.join(io_dir, "stderr")
        for path in (out, err):
            open(path, "w").close()
        request = {"workdir": workdir, "limits": asdict(limits), "out": out, "err": err}
        code, timed_out = _fork_server().run(request, limits.wall_s)
        _kill_jailed(workdir)
        stdout, stderr = (_read(path, limits.output_chars) for path in (out, err))
    result = Result(stdout, stderr, returncode=code)
    result.guards = _guards(workdir)
    result.stopped_by = _which_limit(code, stderr, timed_out)
    result.images, skipped = _images(workdir, given, limits)
    if skipped:
        result.stderr += ("\n" if result.stderr else "") + skipped
    return result


def _kill_group(pgid: int) -> None:
    """SIGKILL the snippet's process group until none of it is left (a fork racing the signal can add one)."""
    for _ in range(1000):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.005)
    log.warning("sandbox: process group %d still alive after SIGKILL (its CPU limit will end it)", pgid)


def _kill_jailed(workdir: str) -> None:
    """SIGKILL every process whose root directory is the sandbox's (one that left the process group with
    setsid): what the chroot put there is found by /proc/<pid>/root."""
    real = os.path.realpath(workdir)
    for _ in range(100):
        found = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/root") == real:
                    os.kill(int(pid), signal.SIGKILL)
                    found = True
            except OSError:
                continue
        if not found:
            return
        time.sleep(0.01)


def _read(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        data = f.read(4 * limit + 4).decode("utf-8", "replace")
    return data if len(data) <= limit else data[:limit] + f"\n... (output cut at {limit} characters)"


def _guards(workdir: str) -> dict:
    try:
        with open(os.path.join(workdir, ".guards.json")) as f:
            guards = json.load(f)
    except (OSError, ValueError):
        return {}
    for what, how in guards.items():
        if how.startswith(("socket", "audit", "unchanged")) and what not in _warned:
            _warned.add(what)
            log.warning("sandbox: %s guarded by %s on this machine (weaker than a namespace/chroot)", what, how)
    return guards


# what a snippet's traceback says when a limit stopped it, checked before how the process ended (a thread bomb
# stopped by the process limit may still be killed at the wall clock, its threads asleep)
LIMIT_MARKERS = (("MemoryError", "memory limit"), ("File too large", "file size limit"),
                 ("Too many open files", "open files limit"), ("can't start new thread", "process limit"),
                 ("BlockingIOError", "process limit"), ("Resource temporarily unavailable", "process limit"))


def _which_limit(code: int, stderr: str, timed_out: bool) -> str | None:
    for marker, limit in LIMIT_MARKERS:
        if marker in stderr:
            return limit
    if timed_out:
        return "wall-clock limit"
    if code in (-signal.SIGXCPU, -signal.SIGKILL):  # RLIMIT_CPU: SIGXCPU, then SIGKILL
        return "CPU time limit"
    if code == -signal.SIGXFSZ:
        return "file size limit"
    return f"crashed (signal {signal.Signals(-code).name})" if code < 0 else None


def _images(workdir: str, given: set, limits: Limits) -> tuple[list, str]:
    """The images the snippet saved (not the ones it was given, unless it overwrote them), checked before
    decoding; and a note on any it could not have."""
    images, notes = [], []
    for name in sorted(os.listdir(workdir)):
        path = os.path.join(workdir, name)
        if not name.lower().endswith(IMAGE_SUFFIXES) or os.path.islink(path) or not os.path.isfile(path):
            continue
        if name in given and os.path.getmtime(path) <= os.path.getmtime(os.path.join(workdir, "snippet.py")):
            continue
        if len(images) == limits.max_images:
            notes.append(f"only the first {limits.max_images} images are shown")
            break
        try:
            with Image.open(path) as im:
                if im.width * im.height > limits.max_pixels:
                    notes.append(f"{name}: {im.width} x {im.height} is over {limits.max_pixels} pixels")
                    continue
                images.append(im.convert("RGB"))
        except Image.DecompressionBombError:
            notes.append(f"{name}: a decompression bomb (over PIL's pixel limit), not decoded")
        except (OSError, ValueError) as e:
            notes.append(f"{name}: not a readable image ({type(e).__name__})")
    return images, "\n".join(notes)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", help="a .py snippet")
    p.add_argument("--image", action="append", default=[], help="an image the snippet finds as image.png, ...")
    for name, value in asdict(Limits()).items():
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        code = open(a.file).read()
        images = [Image.open(path).convert("RGB") for path in a.image]
    except OSError as e:
        raise SystemExit(f"rllava.agent.sandbox: {e}")
    limits = Limits(**{k: getattr(a, k) for k in asdict(Limits())})
    result = run_code(code, images, limits)
    print(result.text())
    print(f"\n[guards: {', '.join(f'{k}: {v}' for k, v in result.guards.items())}; "
          f"images back: {[im.size for im in result.images]}]")


if __name__ == "__main__":
    main()

"""The sandbox's fork server (see rllava/agent/sandbox.py): `python -I sandbox_child.py`.

It loads what snippets may import once, then reads one request a line on stdin ({"id", "workdir", "limits",
"out", "err"}) and forks a child per request, answering {"id", "pid"} at once and {"id", "status"} when the child
ends. The child (trusted code up to `_run`) leaves the network, shuts itself into its workdir, sets its limits,
drops its privileges, records which guards hold in .guards.json, then runs snippet.py. A fork of a warmed-up
interpreter costs milliseconds where a fresh one importing numpy and PIL costs ~0.17 s. It imports nothing of
rllava (nor torch): it holds nothing of the trainer.
"""

import json
import os
import resource
import sys

# What a snippet may import: loaded now, while the interpreter's files are still visible (after the jail they
# are not, so any other import fails).
import base64  # noqa: F401
import encodings.idna  # noqa: F401  (host names: a failed lookup is then an OSError)
import collections  # noqa: F401
import functools  # noqa: F401
import io  # noqa: F401
import itertools  # noqa: F401
import math  # noqa: F401
import random  # noqa: F401
import re  # noqa: F401
import socket  # noqa: F401  (a snippet that tries the network meets the namespace, not an ImportError)
import statistics  # noqa: F401
import string  # noqa: F401

import numpy  # noqa: F401
from PIL import Image, ImageChops, ImageDraw, ImageEnhance, ImageFilter, ImageOps, ImageStat  # noqa: F401

Image.init()  # every image format plugin, for the same reason

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
NOBODY = 65534


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> bool:
    ctypes, libc = _libc()
    return libc.unshare(ctypes.c_int(flags)) == 0


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _drop_capabilities() -> None:
    """Clear every capability set (capset v3) and forbid regaining any (no_new_privs): the user-namespace root
    that did the chroot can then not undo it."""
    ctypes, libc = _libc()

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    if libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


def _block_sockets() -> None:
    """The fallback where no network namespace can be made: the socket layer refuses to make sockets."""
    import socket

    def refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in the sandbox")

    socket.socket = socket.create_connection = socket.socketpair = socket.fromfd = refuse  # type: ignore
    socket.getaddrinfo = socket.gethostbyname = refuse  # type: ignore


def _block_files_outside(workdir: str) -> None:
    """The fallback where no jail can be made: an audit hook refuses to open files outside `workdir` (Python-level
    only: code that reaches C directly is not stopped)."""
    root = os.path.realpath(workdir) + os.sep

    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if not (path + os.sep).startswith(root) and path != "/dev/null":
                raise PermissionError(f"{args[0]!r} is outside the sandbox")
        elif event in ("os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                       "subprocess.Popen", "ctypes.dlopen", "os.kill", "os.killpg"):
            raise PermissionError(f"{event} is disabled in the sandbox")

    sys.addaudithook(hook)


def _jail(workdir: str, limits: dict) -> dict:
    guards = {}
    root = os.geteuid() == 0
    namespaces = CLONE_NEWNET if root else CLONE_NEWUSER | CLONE_NEWNET
    guards["network"] = "namespace" if _unshare(namespaces) else "socket layer blocked (no network namespace)"
    if not root and guards["network"] == "namespace":  # the user namespace's root: enough to chroot, no more
        uid, gid = os.getuid(), os.getgid()
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    try:
        os.chroot(workdir)
        os.chdir("/")
        guards["files"] = "chroot to the work directory"
    except OSError:
        os.chdir(workdir)
        guards["files"] = "audit hook (no chroot)"
    for name, value in (("RLIMIT_CPU", limits["cpu_s"]), ("RLIMIT_AS", limits["memory_mb"] << 20),
                        ("RLIMIT_FSIZE", limits["file_mb"] << 20), ("RLIMIT_NOFILE", limits["open_files"]),
                        ("RLIMIT_NPROC", limits["processes"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    if root:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        guards["user"] = "nobody"
    elif guards["network"] == "namespace":
        _drop_capabilities()
        guards["user"] = "no capabilities (user namespace)"
    else:
        guards["user"] = "unchanged (not root, no user namespace)"
    if not guards["network"].startswith("namespace"):
        _block_sockets()
    if guards["files"].startswith("audit"):
        _block_files_outside(workdir)
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]  # its files are out of reach now; a snippet cannot load it again
    return guards


def _run(here: str) -> None:
    code = open(os.path.join(here, "snippet.py")).read()
    sys.argv = ["snippet.py"]
    exec(compile(code, "snippet.py", "exec"), {"__name__": "__main__"})


def _child(req: dict) -> None:
    """In the forked child: its own session, its output files, the jail, the snippet; never returns."""
    code = 1
    try:
        os.setsid()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(req["out"], os.O_WRONLY), 1)
        os.dup2(os.open(req["err"], os.O_WRONLY), 2)
        os.closerange(3, 1 << 16)  # the server's pipes and anything else it held
        # fresh file objects: the server's may have been locked by its writer thread at the fork
        sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="backslashreplace")
        sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="backslashreplace")
        workdir = req["workdir"]
        guards = _jail(workdir, req["limits"])
        here = "/" if guards["files"].startswith("chroot") else workdir
        with open(os.path.join(here, ".guards.json"), "w") as f:
            json.dump(guards, f)
        _run(here)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    import threading

    lock = threading.Lock()

    def say(message: dict) -> None:
        with lock:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    def reap(request_id: int, pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        say({"id": request_id, "status": os.waitstatus_to_exitcode(status)})

    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        say({"id": req["id"], "pid": pid})
        threading.Thread(target=reap, args=(req["id"], pid), daemon=True).start()


if __name__ == "__main__":
    serve()

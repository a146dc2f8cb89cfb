"""Run model-written Python where it can harm nothing: the executor of the `code` tool.

    python -m rllava.agent.sandbox FILE.py [--image IMG ...] [--cpu-s 5 --wall-s 10 --memory-mb 1024 ...]

prints the jail this machine gives and the observation a model would get for that snippet (exit 0 even when the snippet
failed), to try the limits by hand. Model output is hostile input (in GRPO, sabotaging its group's other rollouts raises
a snippet's advantage): every call is a jail of its own, forked by a zygote (`_Zygote`: `sandbox_init.py --serve`) in
bubblewrap (`bwrap`), in namespaces of its own (`sandbox_init.enter`: its first process is PID 1, whose end ends the
call), with no capability and the seccomp filter (`confine`, `SECCOMP_DENIED`); limits per process (setrlimit) and per
call (a cgroup where one can be made, else RLIMIT_NPROC in its user namespace), `wall_s` and `file_mb` counted here.
docs/agents.md, "The code sandbox": each guard, what it stops, its tested bounds.

Fail closed: where a guard cannot be set up (no bwrap, user namespaces refused, no libseccomp / pyseccomp, root with no
writable cgroup), `check()` (the code tool's, before the model loads) is one error naming what is missing and how to get
it; `rollout.agent.tool_kwargs.code.allow_weaker=true` runs what can run (bwrap without the cgroup, or a plain child
process with the per-process limits in a temporary directory) and warns once naming what is not isolated.

Which limit stopped a call comes from what the parent saw (its clock, output bytes, the cgroup's OOM and pids counters)
and the first process's report (exit status, CPU time, the exception that ended it: MemoryError, errno EMFILE / EFBIG /
ENOSPC / EAGAIN), never from the output's text. Saved images (at most `max_images` of at most `file_mb`) are decoded by
the first process under the call's limits and come back as RGB of at most `max_pixels`: no decoder runs here.
Not a VM: it does not protect against kernel exploits, or against using the CPU and memory it is allowed."""

from __future__ import annotations

import argparse
import atexit
import errno
import functools
import glob
import importlib.util
import io
import json
import logging
import os
import queue
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from itertools import count
from pathlib import Path

from PIL import Image

from rllava.agent.sandbox_init import ERRNO_LIMITS, FILES_LIMIT
from rllava.errors import ConfigError

log = logging.getLogger(__name__)
INIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_init.py")
MODULES = ("numpy", "PIL")  # besides the standard library, what a snippet may import
NOBODY = 65534
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/work", "OMP_NUM_THREADS": "1",
       "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
KEY = "rollout.agent.tool_kwargs.code"
_warned: set[str] = set()


@dataclass(frozen=True)
class Limits:
    """What one call may use (`rollout.agent.tool_kwargs.code.*`)."""

    cpu_s: int = 5  # CPU seconds of each process (RLIMIT_CPU)
    wall_s: float = 10.0  # seconds for the whole call, after which it is killed
    memory_mb: int = 1024  # the call's memory (cgroup) and each process's address space (RLIMIT_AS)
    file_mb: int = 16  # largest file it may write (RLIMIT_FSIZE), its output, and each image taken back
    disk_mb: int = 64  # its work directory: a tmpfs of this size, the given images included
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 8  # processes and threads of the call, all together
    output_chars: int = 2000  # of stdout and of stderr, each, kept for the observation
    max_images: int = 4  # images taken back
    max_pixels: int = 4096 * 4096  # per image taken back
    files: int = 4096  # files, directories and links in /work (tmpfs's --size bounds bytes, not inodes)


@dataclass
class Result:
    """What a snippet did: its output, the images it saved, and which limit (if any) stopped it."""

    stdout: str = ""
    stderr: str = ""
    images: list = field(default_factory=list)
    returncode: int = 0
    stopped_by: str | None = None  # "wall-clock limit", "CPU time limit", "memory limit", ...
    guards: dict = field(default_factory=dict)  # what the parent set up: the jail, files, user, totals

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.stopped_by is None

    def text(self) -> str:
        """The observation's text: the output, or what went wrong and why."""
        parts = [self.stdout.rstrip()] if self.stdout.strip() else []
        if not self.ok:
            why = self.stopped_by or f"exit status {self.returncode}"
            parts.append(f"Error ({why}):\n{self.stderr.rstrip()}" if self.stderr.strip() else f"Error ({why})")
        parts += [f"[{len(self.images)} image{'s' if len(self.images) > 1 else ''} saved]"] if self.images else []
        return "\n".join(parts) or "(no output)"


# cgroups: controller -> (limit file, events file, the event counted) per cgroup version; the swap file is optional
CGROUP_FILES = {2: {"memory": ("memory.max", "memory.events", "oom_kill"), "pids": ("pids.max", "pids.events", "max")},
                1: {"memory": ("memory.limit_in_bytes", "memory.oom_control", "oom_kill"),
                    "pids": ("pids.max", "pids.events", "max")}}
SWAP_FILES = {2: "memory.swap.max", 1: "memory.memsw.limit_in_bytes"}


def _cgroup_bases() -> tuple[int, dict[str, str]] | None:
    """(version, controller -> the directory a call's cgroup is made in), or None: where this process can make cgroups
    with the memory and pids controllers. v2: beside its own cgroup (one with processes cannot hand controllers to
    children), so calls stay inside whatever limits hold this process; v1: inside its own cgroup of each hierarchy."""
    mounts = {}  # (version, controller or "") -> (mount point, its root)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fields, (fstype, _, options) = left.split(), right.split()[:3]
            if fstype == "cgroup2":
                mounts[(2, "")] = (fields[4], fields[3])
            elif fstype == "cgroup":
                for c in set(options.split(",")) & {"memory", "pids"}:
                    mounts[(1, c)] = (fields[4], fields[3])
    own = {}  # (version, controller or "") -> this process's cgroup path
    with open("/proc/self/cgroup") as f:
        for line in f:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            for c in (controllers.split(",") if number != "0" else [""]):
                own[(1 if number != "0" else 2, c)] = path

    def directory(key):
        mount, root = mounts[key]
        path = own[key][len(root):] if root != "/" and own[key].startswith(root) else own[key]
        return os.path.join(mount, path.lstrip("/")), path in ("", "/")

    if (2, "") in mounts and (2, "") in own:
        here, at_root = directory((2, ""))
        controllers = []
        with suppress(OSError):
            controllers = open(os.path.join(here, "cgroup.controllers")).read().split()
        base = here if at_root else os.path.dirname(here)
        if {"memory", "pids"} <= set(controllers) and os.access(base, os.W_OK):
            return 2, {"memory": base, "pids": base}
    if all((1, c) in mounts and (1, c) in own for c in ("memory", "pids")):
        bases = {c: directory((1, c))[0] for c in ("memory", "pids")}
        if all(os.access(b, os.W_OK) for b in bases.values()):
            return 1, bases
    return None


class _Cgroup:
    """One call's cgroup: memory and tasks of the call as a whole; its OOM kills and refused forks counted."""

    ids = count()

    def __init__(self, version: int, bases: dict[str, str], limits: Limits):
        self.version, name = version, f"rllava-sandbox-{os.getpid()}-{next(self.ids)}"
        self.dirs = {c: os.path.join(base, name) for c, base in bases.items()}
        values = {"memory": limits.memory_mb << 20, "pids": limits.processes + 1}  # + the call's first process
        for c, d in self.dirs.items():
            os.makedirs(d, exist_ok=True)
            Path(d, CGROUP_FILES[version][c][0]).write_text(str(values[c]))
        swap = os.path.join(self.dirs["memory"], SWAP_FILES[version])
        if os.path.exists(swap):
            Path(swap).write_text(str(0 if version == 2 else values["memory"]))

    def add(self, pid: int) -> None:
        for d in set(self.dirs.values()):
            Path(d, "cgroup.procs").write_text(str(pid))

    def events(self) -> dict[str, int]:
        """controller -> how often its limit was hit (OOM kills, refused forks)."""
        hits = {}
        for c, d in self.dirs.items():
            _, events, key = CGROUP_FILES[self.version][c]
            lines = []
            with suppress(OSError):
                lines = open(os.path.join(d, events)).read().splitlines()
            hits[c] = sum(int(line.split()[1]) for line in lines if line.split()[:1] == [key])
        return hits

    def remove(self) -> None:
        """Kill what is left (nothing in the jail: the namespace went with its first process), then remove it."""
        for d in set(self.dirs.values()):
            for _ in range(200):
                try:
                    pids = open(os.path.join(d, "cgroup.procs")).read().split()
                    for pid in pids:
                        with suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
                    if not pids:
                        os.rmdir(d)
                        break
                except FileNotFoundError:
                    break
                except OSError:
                    pass  # busy while its last tasks exit
                time.sleep(0.005)


# The syscall filter. Docker's default seccomp profile (moby/profiles/seccomp/default.json) is the anchor: these are the
# x86_64 syscalls it refuses to an unprivileged container (and io_uring since Docker 25), plus what rllava refuses
# beyond it: kernel objects that no rlimit of the call counts, or that are a quota of the host user or the machine
# (docs/agents.md, "what the jail bounds"). It differs in form: Docker allows a list and refuses the rest, this
# refuses a list and allows the rest (the interpreter, numpy and PIL need no care then; a syscall new to the kernel
# is allowed here). clone3 gets ENOSYS, as in Docker (libc falls back to clone).
SECCOMP_BOUNDS = (  # the ones the sandbox's documented bounds rest on: the filter is not built without each
    "ptrace", "pidfd_getfd", "process_vm_readv", "process_vm_writev", "kcmp",  # other processes' memory and fds
    "add_key", "keyctl", "request_key",  # keyrings: charged to the host user's key quota
    "inotify_init", "inotify_init1", "fanotify_init",  # per-user host instance limits
    "shmget", "msgget", "semget",  # SysV IPC: segments count against no rlimit
    "memfd_create", "memfd_secret",  # pages no rlimit counts (RLIMIT_AS counts mappings), held by an fd
    "io_setup",  # Linux AIO: contexts come out of the machine's fs.aio-max-nr (DeepSpeed's NVMe offload uses AIO)
    "sendmsg", "sendmmsg",  # SCM_RIGHTS: fds in flight are counted per host user, and hold what they refer to
    "flock",  # a lock on the read-only system's files, which every concurrent call shares: a channel between them
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "perf_event_open", "bpf")
SECCOMP_DENIED = SECCOMP_BOUNDS + (  # and the rest of Docker's (those this kernel's libseccomp does not know: skipped)
    "mount", "umount2", "pivot_root", "unshare", "setns", "open_by_handle_at", "name_to_handle_at", "personality",
    "acct", "quotactl", "swapon", "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "iopl", "ioperm", "clock_settime", "clock_adjtime", "settimeofday",
    "lookup_dcookie", "sysfs", "uselib", "ustat", "mbind", "set_mempolicy", "get_mempolicy", "move_pages",
    "_sysctl", "vm86", "vm86old", "create_module", "get_kernel_syms", "query_module", "nfsservctl")
SECCOMP_SETUP = ("mount", "unshare", "sendmsg")  # the zygote's alone: it makes each call's namespaces, sends its pidfd
CLONE_NAMESPACES = (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000, 0x80)  # CLONE_NEW*
AF_UNIX, F_SETPIPE_SZ = 1, 1031
# Refused by an argument: (syscall, the argument's index, its mask, the values refused, errno); refused where
# (argument & mask) == value. An int argument is compared on its low 32 bits: the kernel ignores the rest.
SECCOMP_ARGUMENTS = (
    # a socket of any family but AF_UNIX: AF_VSOCK is not network-namespaced (the hypervisor is one connect() away),
    # AF_NETLINK talks to the kernel, and a TCP socket's buffers count against the machine's tcp_mem
    ("socket", 0, 0xFFFFFFFF, tuple(f for f in range(64) if f != AF_UNIX), errno.EAFNOSUPPORT),
    ("socketpair", 0, 0xFFFFFFFF, tuple(f for f in range(64) if f != AF_UNIX), errno.EAFNOSUPPORT),
    # record locks (F_GETLK, F_SETLK, F_SETLKW, their F_OFD_ forms, F_SETLEASE): flock's channel again
    ("fcntl", 1, 0xFFFFFFFF, (5, 6, 7, 36, 37, 38, 1024), errno.ENOLCK),
    # buffers past the defaults, which count against no rlimit: a pipe of 1 MB, a socket's of net.core.wmem_max
    ("fcntl", 1, 0xFFFFFFFF, (F_SETPIPE_SZ,), errno.EPERM),
    ("setsockopt", 2, 0xFFFFFFFF, (7, 8, 32, 33), errno.EPERM),  # SOL_SOCKET's SO_SNDBUF, SO_RCVBUF, their FORCE forms
    # a new user namespace would give back every capability
    *(("clone", 0, flag, (flag,), errno.EPERM) for flag in CLONE_NAMESPACES))


@functools.cache
def seccomp_program(zygote: bool = False) -> bytes:
    """The BPF program of every call (SECCOMP_DENIED -> EPERM, SECCOMP_ARGUMENTS -> their errno, clone3 -> ENOSYS,
    the rest allowed); with `zygote`, the one bwrap loads for the zygote (`--seccomp FD`), which allows what a call's
    namespaces are made with (SECCOMP_SETUP). Raises without libseccomp or its Python binding (the jail fails
    closed)."""
    import pyseccomp

    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in (n for n in SECCOMP_DENIED if not (zygote and n in SECCOMP_SETUP)):
        try:
            f.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except (ValueError, OSError, RuntimeError):
            if name in SECCOMP_BOUNDS:
                raise
    for name, index, mask, values, code in SECCOMP_ARGUMENTS:
        for value in values:
            f.add_rule(pyseccomp.ERRNO(code), name, pyseccomp.Arg(index, pyseccomp.MASKED_EQ, mask, value))
    f.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def _seccomp_fd(program: bytes) -> int:
    """A pipe's read end holding the program, for bwrap to read once."""
    r, w = os.pipe()
    os.write(w, program)  # a few hundred bytes: inside the pipe's buffer
    os.close(w)
    return r


@dataclass
class Jail:
    """What this machine gives: how calls run, what the full jail lacks, and the guards as the parent set them up."""

    bwrap: list[str] | None  # bubblewrap's argv (None: a plain child process)
    cgroup: tuple[int, dict[str, str]] | None  # the cgroup bases (None: per-process limits)
    missing: list[str]  # what the full jail lacks here, and how to get it
    weaker: list[str]  # what is not isolated when running without what is missing
    guards: dict
    pylib: list[str]  # sys.path entries for the snippet's modules (in the jail: /pylib)
    seccomp: bytes | None = None  # the calls' syscall filter, a BPF program (None: none, allow_weaker)
    zygote_seccomp: bytes | None = None  # the zygote's


def _module_dirs() -> dict[str, str]:
    """host directory -> its name under /pylib: numpy and PIL, and the shared libraries their wheels carry."""
    dirs = {}
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        where = list(spec.submodule_search_locations)[0]
        libs = [d for d in glob.glob(os.path.join(os.path.dirname(where), "*.libs"))
                if os.path.basename(d).lower() in {"numpy.libs", "pillow.libs"}]
        dirs.update({d: os.path.basename(d) for d in [where, *libs]})
    return dirs


def _python() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _bwrap_argv(bwrap: str) -> list[str]:
    """bubblewrap's options for the zygote: the read-only root of every call (`sandbox_init.enter` mounts the rest)."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--as-pid-1", "--clearenv",
            "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    for prefix in sorted(prefixes - {"/usr"}):
        argv += ["--ro-bind", prefix, prefix]
        for site in glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages")):
            argv += ["--tmpfs", site]  # the base interpreter's own packages stay out
    for src, name in _module_dirs().items():
        argv += ["--ro-bind", src, f"/pylib/{name}"]
    argv += ["--ro-bind", INIT, "/init.py", "--proc", "/proc", "--dev", "/dev", "--dir", "/work", "--chdir", "/work",
             "--remount-ro", "/dev", "--remount-ro", "/"]
    for k, v in ENV.items():
        argv += ["--setenv", k, v]
    return argv


_jail: Jail | None = None
_jail_lock = threading.Lock()


def jail() -> Jail:
    """What this machine gives, found once per process by making one jail."""
    global _jail
    with _jail_lock:
        if _jail is None:
            _jail = _find_jail()
        return _jail


def _find_jail() -> Jail:
    missing, weaker, root, program, zygote = [], [], os.geteuid() == 0, None, None
    bwrap = shutil.which("bwrap")
    argv = _bwrap_argv(bwrap) if bwrap else None
    version = (0,)  # bubblewrap's, where it does not say
    with suppress(OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout if bwrap else ""
        version = tuple(int(x) for x in out.split()[-1].split(".")[:2])
    if not bwrap:
        missing.append("bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf "
                       "install bubblewrap)")
    elif version < (0, 8):
        missing.append(f"bubblewrap {'.'.join(map(str, version))} is too old: 0.8 or newer is needed "
                       "(its --size and --disable-userns; Ubuntu 22.04 ships 0.6: take a newer distribution's "
                       "package or build a release of github.com/containers/bubblewrap)")
        argv = None
    else:
        try:
            program, zygote = seccomp_program(), seccomp_program(zygote=True)
        except Exception as e:  # noqa: BLE001 - no libseccomp, no binding, a refused rule: fail closed
            missing.append(f"the syscall filter cannot be built ({type(e).__name__}: {e}): it needs libseccomp "
                           "(Debian/Ubuntu: apt-get install libseccomp2) and pyseccomp (pip install pyseccomp)")
            weaker.append("no syscall filter: keyrings, inotify, SysV IPC, memfd, AIO, io_uring, userfaultfd, "
                          "perf, bpf, vsock, netlink and new namespaces are reachable")
        fds = [_seccomp_fd(zygote or b""), _seccomp_fd(program or b"")]  # both or neither
        try:  # a call's namespaces made in the zygote's jail, as every call makes them
            seccomp = ["--seccomp", str(fds[0])] if program else []
            probe = subprocess.run([*argv[:1], *seccomp, *argv[1:], _python(), "-I", "-S", "/init.py", "--probe",
                                    str(fds[1])], capture_output=True, text=True, timeout=30, pass_fds=fds)
            ok, why = probe.stdout.split() == ["1", str(NOBODY)], (probe.stderr.strip() or probe.stdout).splitlines()
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, why = False, [str(e)]
        finally:
            for fd in fds:
                os.close(fd)
        if not ok:
            missing.append(f"bubblewrap cannot make the jail here ({why[-1] if why else 'no output'}): "
                           "allow user namespaces (sysctl kernel.unprivileged_userns_clone=1 on Debian, "
                           "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04, user.max_user_namespaces"
                           " > 0; in a container: --security-opt seccomp=unconfined --security-opt "
                           "apparmor=unconfined, or --privileged)")
            argv = None
    try:
        cgroup = _cgroup_bases()
        if cgroup:
            _Cgroup(*cgroup, Limits()).remove()  # one can be made and limited
    except (OSError, ValueError, IndexError, KeyError):
        cgroup = None
    if argv is None:
        weaker.append(f"files, network and processes of this user (uid {os.geteuid()}) are reachable: a plain child "
                      "process in a temporary directory, limited per process" + ("" if cgroup else
                                                                                  ", its processes not counted"))
    if cgroup is None and root:
        missing.append("as root the per-call totals (processes, memory) need a cgroup this process can make: "
                       "cgroup v2 with the memory and pids controllers, or v1 memory and pids hierarchies, mounted "
                       "writable (in a container: --cgroupns=host or --privileged); or run as a non-root user")
        weaker.append("processes and memory are limited per process only: as root, RLIMIT_NPROC does not bind")
    totals = (f"cgroup v{cgroup[0]}: memory_mb and processes for the whole call" if cgroup else
              "RLIMIT_NPROC in the call's user namespace (processes per call), memory_mb per process"
              if argv and not root else "per process only")
    guards = {"jail": "bubblewrap: own pid, ipc, mount, network, uts and user namespaces; the call ends with its "
                      "first process" if argv else "none: a plain child process (allow_weaker)",
              "files": "read-only system, Python, numpy and PIL; a tmpfs of disk_mb at /work" if argv else
                       "a temporary directory; the whole file system is reachable",
              "user": f"uid {NOBODY} with no capabilities" if argv else f"uid {os.geteuid()} (this user)",
              "syscalls": "seccomp: keyrings, inotify, SysV IPC, memfd, AIO, io_uring, userfaultfd, perf, bpf, "
                          "ptrace, pidfd_getfd, process_vm_*, fd passing, file locks, buffer resizing and sockets "
                          "but AF_UNIX refused" if argv and program else "no filter",
              "totals": totals}
    pylib = ["/pylib"] if argv else sorted({os.path.dirname(d) for d in _module_dirs()})
    return Jail(argv, cgroup, missing, weaker, guards, pylib, *((program, zygote) if argv else (None, None)))


def check(allow_weaker: bool = False) -> Jail:
    """The jail, or one error naming what is missing and how to get it; `allow_weaker`: what can run, warned once."""
    j = jail()
    if j.missing and not allow_weaker:
        raise ConfigError(f"rollout.agent.tools=[code]: the code sandbox cannot isolate its calls on this machine: "
                          f"{'; '.join(j.missing)}. Set {KEY}.allow_weaker=true to run them anyway, weaker "
                          f"({'; '.join(j.weaker)})")
    if j.missing:
        _warn_once(f"code sandbox ({KEY}.allow_weaker=true): running weaker than promised: {'; '.join(j.weaker)} "
                   f"(missing: {'; '.join(j.missing)})")
    return j


def run_code(code: str, images: list | tuple = (), limits: Limits = Limits(), allow_weaker: bool = False) -> Result:
    """Run `code` in a jail of its own whose /work holds `images` (PIL) as image.png, image_1.png, ..."""
    j = check(allow_weaker)
    files = [("snippet.py", code.encode("utf-8", "replace"))]
    for i, image in enumerate(images):
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        files.append(("image.png" if i == 0 else f"image_{i}.png", buf.getvalue()))
    head = {"limits": asdict(limits), "files": [[name, len(data)] for name, data in files], "path": j.pylib}
    request = json.dumps(head).encode() + b"\n" + b"".join(data for _, data in files)
    workdir = None if j.bwrap else tempfile.mkdtemp(prefix="rllava_sandbox_")
    started = ZYGOTE.take(j, limits) if j.bwrap else None
    try:
        started = started or _start(j, limits, workdir)
        seen = _finish(started, request, limits)
        hits = started.cgroup.events() if started.cgroup else {}
    finally:
        if j.bwrap:
            ZYGOTE.done(j, limits)
        if started and started.cgroup:  # every process of the call is gone: removing it (~7 ms) can wait
            ZYGOTE.later(started.cgroup.remove)
        if workdir:  # rm walks any depth of tree; shutil.rmtree recurses
            subprocess.run(["rm", "-rf", "--one-file-system", "--", workdir], capture_output=True, env=ENV)
    return _result(seen, hits, limits, dict(j.guards))


@dataclass
class _Started:
    """A call's first process, forked by the zygote and waiting for its request: our ends of its pipes and socket."""

    pipes: dict  # "stdin", "stdout", "stderr", "result" -> fd
    back: socket.socket  # the call's exit status comes back on it
    first: int | None  # a pidfd of the call's first process: PID 1 of its namespace, whose end ends them all
    cgroup: _Cgroup | None
    weak: bool = False  # no jail (allow_weaker): a plain process, whose snippet's process group is killed at the end


def _start(j: Jail, limits: Limits, workdir: str | None = None) -> _Started:
    """The zygote forks the call's first process (in the jail: in namespaces and a /work of its own), which waits
    for the request; it joins the call's cgroup before the request, so the snippet's first fork is inside."""
    pipes = [os.pipe() for _ in range(4)]
    ours, theirs = socket.socketpair()
    given = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1], theirs.fileno()]
    try:
        ZYGOTE.order(j, {"disk": limits.disk_mb << 20, "cwd": workdir}, given)
    finally:
        for fd in given[:4]:
            os.close(fd)
        theirs.close()
    started = _Started(dict(zip(("stdin", "stdout", "stderr", "result"), (pipes[0][1], *(p[0] for p in pipes[1:])))),
                       ours, None, _Cgroup(*j.cgroup, limits) if j.cgroup else None, weak=not j.bwrap)
    if _wait_readable(ours.fileno(), max(limits.wall_s, 10.0)):
        try:
            started.first = socket.recv_fds(ours, 8, 1)[1][0]
            if started.cgroup:
                started.cgroup.add(_host_pid(started.first))
        except (OSError, ValueError, IndexError, StopIteration):  # the fork failed, the call is gone, or it is
            if started.first is not None:  # outside its cgroup: it never gets its request
                _end(started)
                started.first = None
    return started


def _host_pid(pidfd: int) -> int:
    """The pid, in our PID namespace, of the process a pidfd refers to (the zygote's fork sees another)."""
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
        return int(next(line for line in f if line.startswith("Pid:")).split()[1])


# Output read in batches: after BATCH_AFTER select rounds of a call, a round that moved under BATCH_BYTES is followed
# by BATCH_S of sleep (the pipes hold what comes meanwhile), so a drip of 1-byte writes wakes the trainer at most
# 1 / BATCH_S times a second, and an honest call (a few rounds) or a full pipe is never made to wait.
BATCH_AFTER, BATCH_BYTES, BATCH_S = 16, 1 << 14, 0.005


def _finish(started: _Started, request: bytes, limits: Limits) -> dict:
    """Write the request, read stdout / stderr (keeping what the limits allow) and the report (into `_Report`, as it
    comes) until every pipe is closed, the wall clock is past, or the output is over `file_mb`, in batches (BATCH_S);
    return when every process of the call is gone."""
    seen = {"stdout": bytearray(), "stderr": bytearray(), "result": _Report(limits), "output": 0,
            "timed_out": False, "over": False}
    deadline, pipes, keep = time.monotonic() + limits.wall_s, started.pipes, 4 * limits.output_chars + 4
    rounds, moved = 0, 0  # select rounds so far, bytes moved in the last
    todo = memoryview(request if started.first is not None else b"")
    try:
        with selectors.DefaultSelector() as sel:
            for name, f in pipes.items():
                os.set_blocking(f, False)
                sel.register(f, selectors.EVENT_WRITE if name == "stdin" else selectors.EVENT_READ, name)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    seen["timed_out"] = True
                    return seen
                if rounds > BATCH_AFTER and moved < BATCH_BYTES:  # a drip: let the pipes fill (a writer may block)
                    time.sleep(min(BATCH_S, left))
                rounds, moved = rounds + 1, 0
                for key, _ in sel.select(left):
                    if key.data == "stdin":
                        try:
                            written = os.write(key.fd, todo)
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:  # the first process is gone: nothing more to send
                            written = len(todo)
                        todo, moved = todo[written:], moved + written
                        if not todo:
                            sel.unregister(key.fd)
                            os.close(pipes.pop("stdin"))
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    moved += len(chunk)
                    if not chunk:
                        sel.unregister(key.fd)
                    elif key.data == "result":
                        seen["result"].feed(chunk)
                    else:
                        seen[key.data] += chunk[:max(0, keep - len(seen[key.data]))]
                        seen["output"] += len(chunk)
                        if seen["output"] > limits.file_mb << 20:
                            seen["over"] = True
                            return seen
    finally:
        _end(started, seen)
    return seen


def _end(started: _Started, seen: dict | None = None) -> None:
    if started.first is not None:
        with suppress(ProcessLookupError):  # PID 1 of the call's namespace: the kernel ends the rest with it
            signal.pidfd_send_signal(started.first, signal.SIGKILL)
    if started.weak and seen is not None:
        # without a jail: the snippet's process group as the first process reported it (one that left it escapes)
        try:
            pid = json.loads(bytes(seen["result"].raw[:64]).split(b"\n", 1)[0]).get("pgid")  # {"pgid": N}: short
        except (ValueError, AttributeError):
            pid = None
        if isinstance(pid, int) and pid > 1:  # kill(0), kill(-1): this process's group, all it may signal
            with suppress(OSError):
                os.kill(-pid, signal.SIGKILL)  # kill(2) of -pgid: the whole group
    for fd in started.pipes.values():
        with suppress(OSError):  # closed already
            os.close(fd)
    seen = {} if seen is None else seen
    seen["exit"] = -signal.SIGKILL
    if started.first is not None:  # readable once PID 1 has exited, after the kernel reaped the rest of the call
        _wait_readable(started.first, 10.0)
        os.close(started.first)
        if _wait_readable(started.back.fileno(), 10.0):
            with suppress(OSError, ValueError):
                seen["exit"] = int(started.back.recv(32) or -signal.SIGKILL)
    started.back.close()


class _Zygote:
    """The process that forks every call (`sandbox_init.serve`, the module docstring), in the jail inside bubblewrap.
    One per process (a forked trainer starts its own), started on first use, restarted when it died; it dies with us.
    Calls are also forked ahead of need (`take`): a call's cgroup is joined before its request, and the kernel's
    cgroup migration waits out an RCU grace period (~13 ms on an idle machine); a call takes a first process
    forked behind the last one, and another is forked behind it. Kept per `Limits` (the /work tmpfs's size and
    the cgroup are the call's), as many as calls of those limits ran at once, at most `MAX` in all."""

    MAX = 8

    def __init__(self):
        self.lock, self.proc, self.sock, self.jail, self.pid = threading.Lock(), None, None, None, None
        self.threads, self.helper = {}, threading.Lock()  # lane -> (queue, thread); a lock for the rest
        self.ahead, self.want, self.running = {}, {}, {}  # (limits, jail) -> [_Started], most at once, now
        self.counted_in = os.getpid()  # the process `ahead` and `running` belong to
        atexit.register(self.close)

    def take(self, j: Jail, limits: Limits) -> _Started | None:
        """A first process forked ahead for `limits` (another is forked behind it), or None; a `done` follows each."""
        key = (limits, id(j))
        with self.helper:
            if self.counted_in != os.getpid():  # a forked trainer: the calls forked ahead are its parent's
                self.ahead, self.running, self.counted_in = {}, {}, os.getpid()
            self.running[key] = self.running.get(key, 0) + 1
            self.want[key] = min(self.MAX, max(self.want.get(key, 1), self.running[key]))
            ready = self.ahead.get(key, [])
            started = ready.pop(0) if ready else None
        self.later(lambda: self._ahead(j, limits))
        if started is not None and _wait_readable(started.first, 0):  # it died waiting: the call forks its own
            self.later(lambda: _discard(started))
            started = None
        return started

    def done(self, j: Jail, limits: Limits) -> None:
        with self.helper:
            self.running[(limits, id(j))] -= 1

    def _ahead(self, j: Jail, limits: Limits) -> None:
        """Fork first processes for `limits` until `want` wait (others' make room under MAX)."""
        key = (limits, id(j))
        while True:
            with self.helper:
                ready, evict = self.ahead.setdefault(key, []), None
                if len(ready) >= self.want.get(key, 1) or self.jail is not j:
                    return
                if sum(map(len, self.ahead.values())) >= self.MAX:
                    evict = next((v.pop() for k, v in self.ahead.items() if k != key and v), None)
                    if evict is None:
                        return
            if evict is not None:
                _discard(evict)
            started = _start(j, limits)
            if started.first is None:
                return _discard(started)
            with self.helper:
                self.ahead.setdefault(key, []).append(started)

    def order(self, j: Jail, order: dict, fds: list[int]) -> None:
        """Have the zygote for `j` fork a call on `fds` (the call's stdin, stdout, stderr, report, socket back)."""
        with self.lock:
            for _ in range(2):
                try:
                    if self.proc is None or self.proc.poll() is not None or self.jail is not j or \
                            self.pid != os.getpid():
                        self._restart(j)
                    socket.send_fds(self.sock, [json.dumps(order).encode()], fds)
                    return
                except OSError as e:  # it died since: once more with a new one
                    why = e
                    self.close(wait=False)
            _warn_once(f"code sandbox: the zygote takes no calls ({type(why).__name__}: {why})")

    def _restart(self, j: Jail) -> None:
        if self.pid == os.getpid():
            self.close(wait=False)
        self.pid, self.jail = os.getpid(), j
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds = [theirs.fileno(), _seccomp_fd(j.seccomp or b"")]
        if j.bwrap and j.zygote_seccomp:
            fds.append(_seccomp_fd(j.zygote_seccomp))
        init = "/init.py" if j.bwrap else INIT
        argv = [_python(), "-I", "-S", init, "--serve", *map(str, fds[:2]), ":".join(j.pylib)]
        if j.bwrap:
            argv = j.bwrap[:1] + (["--seccomp", str(fds[2])] if len(fds) > 2 else []) + j.bwrap[1:] + argv
        started = queue.SimpleQueue()

        def start():
            try:
                started.put(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, pass_fds=fds, env=ENV, cwd="/",
                                             start_new_session=True))
            except OSError as e:
                started.put(e)
        self.later(start, "spawn")
        try:
            self.proc = started.get(timeout=60)
            if isinstance(self.proc, OSError):
                self.proc, error = None, self.proc
                raise error
        finally:
            theirs.close()
            for fd in fds[1:]:
                os.close(fd)
        self.sock = ours

    def later(self, job, lane: str = "work") -> None:
        """Run `job()` on a helper thread that lives as long as the process: "spawn" starts the zygote alone (bwrap's
        --die-with-parent, the kernel's parent-death signal, follows the starting thread), "work" the rest."""
        with self.helper:
            _, thread = self.threads.get(lane, (None, None))
            if thread is None or not thread.is_alive():  # none yet, or a forked trainer's (threads are not forked)
                thread = threading.Thread(target=self._serve, args=(lane,), name=f"rllava-sandbox-{lane}", daemon=True)
                self.threads[lane] = (queue.SimpleQueue(), thread)
                thread.start()
        self.threads[lane][0].put(job)

    def _serve(self, lane: str) -> None:
        while True:
            job = self.threads[lane][0].get()
            try:
                job()
            except Exception as e:  # noqa: BLE001 - a zygote that failed to start: its calls report it
                _warn_once(f"code sandbox: {type(e).__name__}: {e}")

    def close(self, wait: bool = True) -> None:
        """End the zygote (calls in flight end with it), and let the helper thread finish what it was given."""
        with self.helper:
            ahead, self.ahead, self.want = [s for v in self.ahead.values() for s in v], {}, {}
        for started in ahead if self.counted_in == os.getpid() else ():
            _discard(started)
        proc, self.proc = self.proc, None
        if proc is not None and self.pid == os.getpid():
            proc.kill()
            proc.wait()
            self.sock.close()
        if wait and "work" in self.threads and self.pid == os.getpid():
            drained = threading.Event()
            self.later(drained.set)
            drained.wait(30)


def _discard(started: _Started) -> None:
    """End a first process that served no call."""
    _end(started)
    if started.cgroup:
        started.cgroup.remove()


ZYGOTE = _Zygote()


def _wait_readable(fd: int, timeout: float) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(timeout))


def _result(seen: dict, hits: dict, limits: Limits, guards: dict) -> Result:
    report, images = _report(seen["result"], limits)
    status = report.get("status", seen["exit"]) if report else seen["exit"]
    result = Result(_text(seen["stdout"], limits), _text(seen["stderr"], limits), images, status, guards=guards)
    said = report.get("limit") if report else None
    cpu = report and (status == -signal.SIGXCPU or (status == -signal.SIGKILL and report["cpu_s"] >= limits.cpu_s))
    stops = ((seen["timed_out"], "wall-clock limit"), (seen["over"], f"output limit ({limits.file_mb} MB)"),
             (hits.get("memory"), "memory limit"), (said in LABELS, said),
             (hits.get("pids") and status, "process limit"), (cpu, "CPU time limit"),
             (status == -signal.SIGXFSZ, "file size limit"))  # the first that holds
    result.stopped_by = next((label for hit, label in stops if hit), None)
    if result.stopped_by is None and not report:
        why = result.stderr.strip().splitlines()[-1:] or [f"exit status {seen['exit']}"]
        _warn_once(f"code sandbox: a call ended without its report (its stderr: {why[0][:200]!r})")
        result.stopped_by, result.returncode = "sandbox error", result.returncode or 1
    elif result.stopped_by is None and status < 0:
        result.stopped_by = f"crashed (signal {_signal_name(-status)})"
    notes = list(report.get("notes", [])) if report else []
    if notes:
        result.stderr += ("\n" if result.stderr else "") + "\n".join(notes)
    return result


def _signal_name(number: int) -> str:
    """SIGSEGV, SIGRTMIN+6, or the number: a real-time signal has no `signal.Signals` member."""
    with suppress(ValueError):
        return signal.Signals(number).name
    if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
        return f"SIGRTMIN+{number - signal.SIGRTMIN}"
    return str(number)


LABELS = {*ERRNO_LIMITS.values(), "memory limit", "process limit", FILES_LIMIT}  # what sandbox_init.limit_of can say


def _report(data: _Report | bytes, limits: Limits = Limits()) -> tuple[dict | None, list]:
    """The first process's report ({"status", "limit", "cpu_s", "notes"}) and its images, from the stream `_finish`
    fed (or from its bytes, fed a pipe's 64 KB at a time); (None, []) when there is none or it does not parse (the
    call was killed)."""
    if isinstance(data, (bytes, bytearray)):
        stream, view = _Report(limits), memoryview(data)
        for at in range(0, len(view), 1 << 16):
            stream.feed(view[at:at + (1 << 16)])
        data = stream
    return data.done()


class _Report:
    """The first process's report, parsed as it arrives: a {"pgid"} line, a head line ({"status", "limit", "cpu_s",
    "images": [[name, width, height], ...], "notes"}), then each image's RGB bytes, pasted into its PIL image a chunk
    at a time (no decoder runs on them; PIL holds RGB in 4 bytes a pixel), so the trainer never holds the raw
    pixels: at most the images (`max_images` x 4 x `max_pixels` bytes) and a chunk. Untrusted bytes: the {"pgid"}
    line is read within 64 bytes and the head within 2 KB per image name and note (`max_images` + 8), else neither
    is parsed (a forged line of millions of notes could be GBs as objects); nor an image over `max_pixels`, nor a
    report shorter than its images; bytes past them are ignored."""

    def __init__(self, limits: Limits):
        self.limits, self.raw, self.head, self.broken = limits, bytearray(), None, False  # raw: the lines so far
        self.sizes, self.images, self.filled, self.pending = [], [], 0, b""  # pending: < 3 bytes, a pixel's start

    def feed(self, chunk: bytes) -> None:
        """The next bytes of the report's pipe."""
        if self.head is None and not self.broken:
            self.raw += chunk
            first = self.raw.find(b"\n", 0, 64) + 1
            cap = first + 2048 * (8 + self.limits.max_images) if first else 64
            end = self.raw.find(b"\n", first, cap) if first else -1
            if end < 0:
                self.broken = len(self.raw) >= cap
                return
            self.head, chunk = self._head(self.raw[first:end]), bytes(self.raw[end + 1:])
            self.raw, self.broken = self.raw[:first], self.head is None  # the {"pgid"} line stays, for `_end`
        if not self.broken:
            self._paste(chunk)

    def _head(self, line: bytearray) -> dict | None:
        try:
            head = json.loads(line)
            status, cpu, limit = int(head["status"]), float(head["cpu_s"]), str(head.get("limit"))
            sizes = [(int(w), int(h)) for name, w, h in head["images"][:self.limits.max_images]]
            notes = [str(n)[:200] for n in head["notes"][:8]]
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):  # RecursionError: a nested line
            return None
        if not all(0 < w and 0 < h and w * h <= self.limits.max_pixels for w, h in sizes):
            return None  # an image over max_pixels
        self.sizes = sizes
        return {"status": status, "limit": limit, "cpu_s": cpu, "notes": notes}

    def _paste(self, chunk: bytes) -> None:
        """Paste whole pixels of `chunk` into the images, each made as its first bytes arrive."""
        data, at = self.pending + chunk, 0
        while len(data) - at >= 3 and not self._complete():
            if not self.images or self.filled == self.images[-1].width * self.images[-1].height:
                self.images.append(Image.new("RGB", self.sizes[len(self.images)], None))  # None: not filled
                self.filled = 0
            im = self.images[-1]
            x, y, w, h = _piece(self.filled, min((len(data) - at) // 3, im.width * im.height - self.filled), im.width)
            im.paste(Image.frombytes("RGB", (w, h), data[at:at + 3 * w * h]), (x, y))
            self.filled, at = self.filled + w * h, at + 3 * w * h
        self.pending = b"" if self._complete() else data[at:]  # past the last image: ignored

    def _complete(self) -> bool:
        last = self.images[-1] if self.images else None
        return self.head is not None and len(self.images) == len(self.sizes) and \
            (last is None or self.filled == last.width * last.height)

    def done(self) -> tuple[dict | None, list]:
        return (self.head, self.images) if self._complete() else (None, [])


def _piece(filled: int, n: int, width: int) -> tuple[int, int, int, int]:
    """(x, y, w, h) of the next `n` pixels of an image `width` wide whose first `filled` are pasted: the rest of a
    row, whole rows, or the start of a row (one paste each)."""
    x, y = filled % width, filled // width
    if x or n < width:
        return x, y, min(n, width - x), 1
    return 0, y, width, n // width


def _text(data: bytearray, limits: Limits) -> str:
    text = bytes(data).decode("utf-8", "replace")
    limit = limits.output_chars
    return text if len(text) <= limit else text[:limit] + f"\n... (output cut at {limit} characters)"


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", help="a .py snippet")
    p.add_argument("--image", action="append", default=[], help="an image the snippet finds as image.png, ...")
    p.add_argument("--allow-weaker", action="store_true", help="run where the full jail cannot be made")
    for name, value in asdict(Limits()).items():
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        code = open(a.file).read()
        images = [Image.open(path).convert("RGB") for path in a.image]
        result = run_code(code, images, Limits(**{k: getattr(a, k) for k in asdict(Limits())}), a.allow_weaker)
    except (OSError, ConfigError) as e:
        raise SystemExit(f"rllava.agent.sandbox: {e}")
    print("\n".join(f"[{k}: {v}]" for k, v in result.guards.items()), result.text(),
          f"\n[images back: {[im.size for im in result.images]}]", sep="\n")


if __name__ == "__main__":
    main()

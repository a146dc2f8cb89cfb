"""What runs in the code sandbox (rllava/agent/sandbox.py): the zygote (`serve`), which forks every call into namespaces
of its own (`enter`, `confine`), and each call's first process (`call`), PID 1 of the call's PID namespace, whose exit
ends every other process of the call. PID 1 reads the request on stdin (a JSON line: limits, file names and sizes; then
the files' bytes), writes snippet.py and the images into /work, and forks the snippet's process (its limits set, stdin
on /dev/null, without the report fd). When it ends, PID 1 kills what it left, reads the images it saved (through the
directory's fd, O_NOFOLLOW, regular files only, at most `file_mb` each), decodes them under the call's limits (only
`FORMATS`, at most `max_pixels`, none `_costly`), and writes the report after a first line {"pgid"}: a JSON line
({"status", "limit", "cpu_s", "images": [[name, width, height], ...], "notes"}) and the RGB pixels, so the trainer never
decodes the snippet's bytes. PID 1 is not dumpable (the snippet cannot ptrace, pidfd_getfd or process_vm_* it) and runs
under the call's rlimits; the parent still reads the report as untrusted bytes. Imports nothing of rllava."""

import ctypes
import errno
import json
import os
import resource
import select
import signal
import socket
import stat
import sys
from contextlib import suppress

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
# magic -> PIL's plugin: the formats decoded, by decoders whose cost is linear in pixels (no RLE BMP: `_costly`)
FORMATS = {b"\x89PNG\r\n\x1a\n": "Png", b"\xff\xd8\xff": "Jpeg", b"BM": "Bmp", b"RIFF": "WebP"}
MAX_SEGMENTS, MAX_SCANS = 64, 32  # JPEG markers before the first scan, PNG chunks besides IDAT; JPEG scans
RLIMITS = {"RLIMIT_CPU": "cpu_s", "RLIMIT_AS": "memory_mb", "RLIMIT_FSIZE": "file_mb", "RLIMIT_NOFILE": "open_files",
           "RLIMIT_NPROC": "processes"}
# Set, not inherited: the kernel charges queued signals and POSIX message queues to every user namespace up to the
# trainer's own uid, where a call that took them all left every process of that uid EAGAIN from sigqueue /
# timer_create and EMFILE from mq_open; locked memory, real-time and raised priorities no snippet needs.
FIXED_RLIMITS = {"RLIMIT_SIGPENDING": 64, "RLIMIT_MSGQUEUE": 0, "RLIMIT_MEMLOCK": 0, "RLIMIT_RTPRIO": 0,
                 "RLIMIT_NICE": 0, "RLIMIT_CORE": 0}
PTYS = 4  # ptys of a call's devpts: every devpts but the host's shares kernel.pty.max - kernel.pty.reserve
FILES_LIMIT = "file count limit"  # more than `files` inodes in the work directory (tmpfs's --size counts bytes)
ERRNO_LIMITS = {errno.EMFILE: "open files limit", errno.ENFILE: "open files limit", errno.EFBIG: "file size limit",
                errno.ENOSPC: "disk limit", errno.EAGAIN: "process limit", errno.ENOMEM: "memory limit"}


def limit_of(e: BaseException) -> str:
    """Which limit an exception (or the one it was raised while handling) says stopped the snippet; ''."""
    for _ in range(8):
        if isinstance(e, MemoryError):
            return "memory limit"
        if isinstance(e, OSError) and e.errno in ERRNO_LIMITS:
            return ERRNO_LIMITS[e.errno]
        if isinstance(e, RuntimeError) and "can't start new thread" in str(e):
            return "process limit"
        e = getattr(e, "__cause__", None) or getattr(e, "__context__", None)  # None past the chain's end
    return ""


def _set_limits(limits: dict, jailed: bool) -> None:
    for name, key in RLIMITS.items():
        if name == "RLIMIT_NPROC" and not jailed:
            continue  # it counts every process of the user: only the call's user namespace makes it the call's
        value = limits[key] << 20 if key.endswith("_mb") else limits[key]
        hard = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU at cpu_s, SIGKILL a second later
        if name == "RLIMIT_NPROC":
            value = hard = value + 2  # this process counts too, and the zygote's fork that made the namespace
        resource.setrlimit(getattr(resource, name), (value, hard))
    for name, value in FIXED_RLIMITS.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _snippet(label_fd: int, limits: dict, jailed: bool) -> None:
    """In the forked child: limits, then the snippet; never returns."""
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _set_limits(limits, jailed)
        source = open("snippet.py", encoding="utf-8", errors="replace").read()
        sys.argv = ["snippet.py"]
        exec(compile(source, "snippet.py", "exec"), {"__name__": "__main__"})
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException as e:
        with suppress(BaseException):
            os.write(label_fd, limit_of(e).encode() + b"\n")
            import traceback

            traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # from the snippet's frame on
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


_read_ahead = bytearray()  # the request's bytes read past the header line, for the files


def _read_until(end: bytes = b"", n: int = 0) -> bytes:
    """The request's next bytes: through the first `end`, or exactly `n`."""
    while (end and end not in _read_ahead) or (not end and len(_read_ahead) < n):
        chunk = os.read(0, 1 << 20)
        if not chunk:
            raise EOFError("the request ended early")
        _read_ahead.extend(chunk)
    n = _read_ahead.index(end) + len(end) if end else n
    out = bytes(_read_ahead[:n])
    del _read_ahead[:n]
    return out


def _images(given: dict, limits: dict) -> tuple[list, list]:
    """(name, bytes) of the images the snippet saved or rewrote, and notes on the ones not taken."""
    images, notes, cap = [], [], limits["file_mb"] << 20
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in sorted(os.listdir(here)):
            if not name.lower().endswith(SUFFIXES):
                continue
            shown = os.fsencode(name).decode("utf-8", "replace")  # a name that is not UTF-8 reaches text as U+FFFD
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=here)
            except OSError:
                continue  # a symlink (ELOOP), a FIFO, ...
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or given.get(name) == (st.st_ino, st.st_mtime_ns, st.st_size):
                    continue
                if st.st_size > cap:
                    notes.append(f"{shown}: {st.st_size} bytes is over file_mb")
                    continue
                if len(images) == limits["max_images"]:
                    notes.append(f"only the first {limits['max_images']} images are shown")
                    break
                pixels = _pixels(shown, os.read(fd, cap + 1)[:cap], limits["max_pixels"], notes)
                images += [pixels] if pixels else []
            finally:
                os.close(fd)
    finally:
        os.close(here)
    return images, notes


def _costly(data: bytes) -> str:
    """Why decoding `data` costs more than its pixels, '' if it does not: PIL steps through a JPEG's markers
    before its first scan, and a PNG's chunks, in Python and keeps their text (a 16 MB JPEG of APP markers: a
    minute, GBs), libjpeg runs every progressive scan over the whole image (1000 empty ones: 39 s for 33 KB), and
    PIL decodes RLE BMP in Python. Counted on the bytes before PIL, at most one step of the walk per PIL's."""
    at, steps, chunks = 2, 0, 0
    while data[:2] == b"\xff\xd8" and at + 4 <= len(data) and data[at:at + 2] != b"\xff\xda":
        m = data[at + 1] if data[at] == 0xFF else 0  # the markers PIL reads a length of: MARKER's with a handler
        handled = 0xC0 <= m <= 0xCF and m != 0xC8 or 0xDA <= m <= 0xEF or m == 0xFE
        at, steps = at + (2 + int.from_bytes(data[at + 2:at + 4], "big") if handled else 1), steps + 1
        if steps > MAX_SEGMENTS:
            return f"a JPEG of over {MAX_SEGMENTS} markers before its first scan"
    if data[:2] == b"\xff\xd8" and data.count(b"\xff\xda") > MAX_SCANS:
        return f"a JPEG of over {MAX_SCANS} scans"
    if data[:2] == b"BM" and int.from_bytes(data[14:18], "little") >= 40 and data[30:34] in (b"\1\0\0\0", b"\2\0\0\0"):
        return "an RLE BMP"
    at = 8
    while data[:8] == b"\x89PNG\r\n\x1a\n" and at + 8 <= len(data) and data[at + 4:at + 8] != b"IEND":
        steps, chunks = steps + (data[at + 4:at + 8] != b"IDAT"), chunks + 1
        at += 12 + int.from_bytes(data[at:at + 4], "big")
        if steps > MAX_SEGMENTS or chunks > 256 * MAX_SEGMENTS:
            return f"a PNG of over {MAX_SEGMENTS} chunks besides IDAT, or {256 * MAX_SEGMENTS} in all"
    return ""


def _pixels(name: str, data: bytes, max_pixels: int, notes: list):
    """(name, width, height, RGB bytes) of an image the snippet saved, or None with a note on why not: decoded
    here, under the call's limits, so no snippet's file costs the trainer a decoder's time or memory."""
    import importlib
    import io

    why, kind = _costly(data), next((plugin for magic, plugin in FORMATS.items() if data.startswith(magic)), None)
    if why:
        notes.append(f"{name}: {why}, whose decoder costs more than its pixels: not decoded")
        return None
    try:
        if kind is None:
            raise ValueError("another format")
        plugin = importlib.import_module(f"PIL.{kind}ImagePlugin")  # its own only: Image.open imports five (7 ms)
        with getattr(plugin, f"{kind}ImageFile")(io.BytesIO(data)) as im:
            if im.width * im.height <= max_pixels:
                return name, im.width, im.height, im.convert("RGB").tobytes()
            notes.append(f"{name}: {im.width} x {im.height} is over {max_pixels} pixels")
    except Exception as e:  # a decoder's error, MemoryError: a note, never a lost report
        formats = "/".join(plugin.upper() for plugin in FORMATS.values())
        notes.append(f"{name}: not a readable {formats} image ({type(e).__name__ if kind else e})")
    return None


def _inodes() -> int:
    """Inodes in use on the work directory's tmpfs."""
    st = os.statvfs(".")
    return st.f_files - st.f_ffree


def call(result_fd: int) -> None:
    """The call's first process: the request, the snippet's process, the report (the module docstring)."""
    jailed = os.getpid() == 1
    _check(LIBC.prctl(4, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE, 0)")  # inherited by the fork
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    request = json.loads(_read_until(b"\n"))
    limits, given = request["limits"], {}
    sys.path += request["path"]  # numpy and PIL
    for name, size in request["files"]:
        with open(name, "wb") as f:
            f.write(_read_until(n=size))
        st = os.stat(name)
        given[name] = (st.st_ino, st.st_mtime_ns, st.st_size)
    _set_limits(limits, jailed)  # this process's own, before the snippet's process inherits them
    read_label, write_label = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(result_fd)
        os.close(read_label)
        _snippet(write_label, limits, jailed)
    os.close(write_label)
    out = os.fdopen(result_fd, "wb")
    out.write(json.dumps({"pgid": pid}).encode() + b"\n")  # outside a jail, the parent kills this group at its limits
    out.flush()
    label = ""
    start, exited = (_inodes(), os.pidfd_open(pid)) if jailed else (0, None)
    while True:  # in the jail, orphans of the snippet come to PID 1: reap them too; and count the tmpfs's inodes
        child, status, usage = os.wait4(-1 if jailed else pid, os.WNOHANG if jailed else 0)
        if child == pid:
            break
        if child == 0:
            if _inodes() - start > limits["files"]:  # empty files cost kernel memory that --size does not count
                label = FILES_LIMIT
                os.kill(-1, signal.SIGKILL)
            select.select([exited], [], [], 0.005)  # at once when the snippet ends, else the next count
    with suppress(OSError):  # (none left) from PID 1: every other process of the namespace; else the snippet's group
        os.kill(-1, signal.SIGKILL) if jailed else os.killpg(pid, signal.SIGKILL)
    while jailed:
        try:
            os.wait()
        except ChildProcessError:
            break
    os.set_blocking(read_label, False)
    with suppress(BlockingIOError):  # what the snippet's exception said (it can write there too: mislabel itself)
        label = label or (os.read(read_label, 64).decode("ascii", "replace").split("\n")[0] if status else "")
    images, notes = _images(given, limits)
    head = {"status": os.waitstatus_to_exitcode(status), "limit": label, "cpu_s": usage.ru_utime + usage.ru_stime,
            "images": [image[:3] for image in images], "notes": [n[:200] for n in notes[:8]]}
    with out:
        out.write(json.dumps(head).encode() + b"\n" + b"".join(image[3] for image in images))


# the zygote's: the namespaces of a call (CLONE_NEW*: mount, cgroup, UTS, IPC, user, PID, network), mount flags, libc
NAMESPACES = 0x20000 | 0x2000000 | 0x4000000 | 0x8000000 | 0x10000000 | 0x20000000 | 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 0x4000, 0x40000
LIBC = ctypes.CDLL(None, use_errno=True)


def _check(failed: int, what: str) -> None:
    if failed:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(source: str, target: str, fs: str | None, flags: int, data: str | None = None) -> None:
    _check(LIBC.mount(source.encode(), target.encode(), fs and fs.encode(), ctypes.c_ulong(flags),
                      data and data.encode()), f"mount {target}")


def enter(disk_bytes: int) -> None:
    """Make this process's namespaces the call's own (user, mount, PID, IPC, network, UTS, cgroup; its next fork
    is PID 1 of the new PID namespace) and its file system: the zygote's read-only one (bubblewrap's) with a fresh
    tmpfs of `disk_bytes` at /work and /proc hidden under an empty read-only tmpfs. Same uid and gid inside."""
    uid, gid = os.getuid(), os.getgid()
    _check(LIBC.unshare(NAMESPACES), "unshare")
    LIBC.prctl(4, 1, 0, 0, 0)  # dumpable, for the writes below (/proc/self of a non-dumpable process is root's)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    _check(LIBC.prctl(4, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE, 0)")
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", "/work", "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_bytes},mode=0755")
    _mount("tmpfs", "/proc", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=1")
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, f"newinstance,ptmxmode=0666,mode=620,max={PTYS}")
    os.chdir("/work")  # no interface up: the calls' filter refuses every socket but AF_UNIX


def confine(program: bytes) -> None:
    """Give up what `enter` gave: every capability (bounding, ambient, then the sets), no new privileges, and the
    calls' syscall filter (`program`, a BPF program: stacked on the zygote's, so the stricter one answers)."""
    cap = 0
    while not LIBC.prctl(24, cap, 0, 0, 0):  # PR_CAPBSET_DROP, until EINVAL past the last capability
        cap += 1
    LIBC.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    _check(LIBC.capset((ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()), "capset")
    _check(LIBC.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if program:
        class Program(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
        _check(LIBC.prctl(22, 2, ctypes.byref(Program(len(program) // 8, program)), 0, 0), "seccomp")


def serve(sock_fd: int, program: bytes, jailed: bool) -> None:
    """The zygote (`sandbox_init.py --serve SOCK_FD PROGRAM_FD PYLIB`): numpy and PIL imported once, then, for each
    order the trainer sends on SOCK_FD (the call's stdin, stdout, stderr and report pipes and a socket back, with
    {"disk", "cwd"}), a fork that makes the call's namespaces (`enter`; outside a jail: the work directory) and
    forks the call's first process, which gives up its capabilities (`confine`) before it reads the request. The
    fork sends the first process's pidfd back, waits for it and sends its exit status. Nothing of a call reaches
    the zygote or a later call: each is a fork of the zygote as it was, in namespaces of its own."""
    _check(LIBC.prctl(4, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE, 0)")  # no call can ptrace it or take its fds
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its forks are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import traceback  # noqa: F401 - what a failing snippet imports, imported once here
    for module in ("numpy", "PIL.Image"):
        with suppress(Exception):  # the snippet then imports it itself (and sees the error)
            __import__(module)
    if "PIL.Image" in sys.modules:
        sys.modules["PIL.Image"].preinit()  # the plugins of `Image.open`
    os.closerange(3, sock_fd)  # what bubblewrap leaves open (its --seccomp pipe): no call inherits it
    os.closerange(sock_fd + 1, 1 << 16)
    sock = socket.socket(fileno=sock_fd)
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 4096, 5)
        if not message:
            os._exit(0)  # the trainer is gone
        try:
            pid = os.fork() if len(fds) == 5 else -1
        except OSError:
            pid = -1  # the order's socket closes unanswered: the trainer reports a sandbox error
        if pid == 0:
            sock.close()
            _fork_call(json.loads(message), fds, program, jailed)
        for fd in fds:
            os.close(fd)


def _fork_call(order: dict, fds: list[int], program: bytes, jailed: bool) -> None:
    """In the zygote's fork: the call's namespaces, its first process, the pidfd and the exit status back."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    status = 1
    try:
        back, result = socket.socket(fileno=fds[4]), fds[3]
        for i in range(3):  # stdin, stdout, stderr: what goes wrong from here on reaches the trainer's stderr
            os.dup2(fds[i], i)
            os.close(fds[i])
        enter(order["disk"]) if jailed else os.chdir(order["cwd"])
        first = os.fork()
        if first == 0:
            back.close()
            confine(program) if jailed else os.setsid()  # outside a jail: a group the trainer can kill
            call(result)
            os._exit(0)
        for fd in (0, 1, 2, result):
            os.close(fd)
        socket.send_fds(back, [b"1"], [os.pidfd_open(first)])
        status = os.waitstatus_to_exitcode(os.waitpid(first, 0)[1])
        back.sendall(str(status).encode())
    except BaseException as e:  # noqa: BLE001 - said on the call's stderr; the call ends without its report
        os.write(2, f"sandbox: the call's jail could not be made: {type(e).__name__}: {e}\n".encode())
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "--probe":  # what `sandbox.jail()` runs once in bubblewrap: a call's namespaces can be made
        if os.fork() == 0:
            enter(1 << 20)
            if os.fork() == 0:
                confine(os.read(int(sys.argv[2]), 1 << 16))
                print(os.getpid(), os.getuid(), flush=True)
                os._exit(0)
            os._exit(os.waitstatus_to_exitcode(os.wait()[1]))
        os._exit(os.waitstatus_to_exitcode(os.wait()[1]))
    sys.path += sys.argv[4].split(":")
    with os.fdopen(int(sys.argv[3]), "rb") as f:
        serve(int(sys.argv[2]), f.read(), os.getpid() == 1)

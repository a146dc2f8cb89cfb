"""The code sandbox (rllava.agent.sandbox) against hostile snippets: each fails safely, the limit or guard that
stopped it is named, the trainer's process and the other calls go on, and nothing outside the call changes.

Model output is hostile input, and in GRPO a snippet that sabotages the other rollouts of its group raises its
own advantage: besides the direct attacks (network, files, bombs), calls attack each other (kill(-1), SysV IPC),
outlive themselves, race the image take-back, and forge what the parent reads. The whole file runs again as an
unprivileged user (`test_the_suite_holds_for_an_unprivileged_user`). Where the jail cannot be made here these
tests skip with the reason, and `test_no_jail_is_a_startup_error_naming_what_is_missing` asserts the error."""

import contextlib
import errno
import glob
import io
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import struct
import sys
import tempfile
import time
import tracemalloc
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from PIL import Image

from rllava.agent import sandbox
from rllava.agent.sandbox import Limits, run_code
from rllava.agent.sandbox_init import FIXED_RLIMITS, PTYS, _costly
from rllava.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = Limits(cpu_s=2, wall_s=4.0, memory_mb=1024, file_mb=2, processes=32, output_chars=500)
NONROOT_RUN = "RLLAVA_SANDBOX_SUITE_UID"  # set in the run of this file as an unprivileged user


def _jail_or_skip():
    try:
        return sandbox.check()
    except ConfigError as e:
        pytest.skip(str(e))


@pytest.fixture(autouse=True)
def jail(request):
    """The jail this machine gives; a test that needs it skips where it cannot be made (the reason is the
    start-up error), except the ones about that error."""
    if request.node.name.startswith(("test_no_jail", "test_root_without")):
        return None
    return _jail_or_skip()


def children(pid: int) -> list[int]:
    """Every descendant of `pid`."""
    found = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            found += [int(c) for c in open(task).read().split()]
        except OSError:
            pass
    return found + [d for c in found for d in children(c)]


def leftovers(within_s: float = 5.0) -> list[int]:
    """Host processes of this process's sandbox calls that outlived them: the first process's command line,
    which its forks keep, on a process that is neither our zygote (bubblewrap's child) nor inside another
    trainer's bwrap. Waits up to `within_s` for the kernel to reap what a call that just ended leaves."""
    def status(pid):
        try:
            text = open(f"/proc/{pid}/status").read()
            return int(text.split("\nPPid:")[1].split()[0]), open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except (OSError, IndexError, ValueError):
            return 0, []

    def ours(pid):  # the zygote and its bwrap, started by this process
        parent, cmd = status(pid)
        return cmd and os.path.basename(cmd[0]) == b"bwrap" and parent == os.getpid()

    deadline = time.monotonic() + within_s
    while True:
        with sandbox.ZYGOTE.helper:  # forked ahead, waiting for their calls: the first process and its parent
            waiting = {sandbox._host_pid(s.first) for v in sandbox.ZYGOTE.ahead.values() for s in v}
        waiting |= {status(pid)[0] for pid in waiting}
        found = []
        for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
            parent, cmd = status(pid)
            if pid in waiting or not (b"/init.py" in cmd or any(c.endswith(b"sandbox_init.py") for c in cmd)) or \
                    os.path.basename(cmd[0]) == b"bwrap" or ours(parent) or b"--serve" in cmd and parent == os.getpid():
                continue  # not a call's, or our zygote
            while parent > 1 and parent != os.getpid():  # a live call of another trainer: under its bwrap
                if ours(parent):
                    break  # a call of ours, still there
                parent, cmd = status(parent)
                if cmd and os.path.basename(cmd[0]) == b"bwrap" and not ours(parent):
                    break
            else:
                found.append(pid)
                continue
            found += [pid] if ours(parent) else []
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _sysv_keys() -> set[str]:
    keys = set()
    for table in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{table}") as f:
            keys |= {f"{table}:{line.split()[0]}" for line in f.readlines()[1:]}
    return keys


@pytest.fixture
def outside(tmp_path):
    """A file outside the sandbox, and a check that it is exactly as it was."""
    path = tmp_path / "sentinel.txt"
    path.write_text("untouched")

    def unchanged():
        return sorted(os.listdir(tmp_path)) == ["sentinel.txt"] and path.read_text() == "untouched"
    return str(path), unchanged


# ------------------------------------------------------------------------------------------- direct attacks
def test_a_snippet_reads_its_image_and_saves_one_back(jail):
    image = Image.new("RGB", (40, 20), (200, 10, 10))
    result = run_code("from PIL import Image\nim = Image.open('image.png')\nprint(im.size)\n"
                      "im.rotate(90, expand=True).save('out.png')\n", [image], FAST)
    assert result.ok and result.stdout.strip() == "(40, 20)" and [im.size for im in result.images] == [(20, 40)]
    assert result.guards == jail.guards and "[1 image saved]" in result.text()


def test_network_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    snippet = (f"import socket, urllib.request\nfor how in (lambda: socket.create_connection(('127.0.0.1', {port}),"
               " timeout=1),\n            lambda: urllib.request.urlopen('http://example.com', timeout=1)):\n"
               "    try:\n        how()\n        print('CONNECTED')\n    except OSError as e:\n"
               "        print('refused', type(e).__name__)\n"
               "try:\n    socket.getaddrinfo('localhost', 80)\n    print('RESOLVED')\nexcept OSError as e:\n"
               "    print('no dns', type(e).__name__)\n"
               f"import _socket\ntry:\n    print('raw', _socket.socket().connect_ex(('127.0.0.1', {port})))\n"
               "except OSError as e:\n    print('raw refused', e.errno)\n")
    result = run_code(snippet, [], FAST)
    with pytest.raises(socket.timeout):
        server.accept()  # nothing ever connected
    server.close()
    assert result.ok and result.stdout.count("refused") >= 2 and "no dns" in result.stdout, result.text()
    assert "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout and "raw 0" not in result.stdout


@pytest.mark.parametrize("path", ["/etc/passwd", os.path.expanduser("~/.bashrc"), os.path.join(REPO, "README.md"),
                                  f"/proc/{os.getpid()}/environ", "../../../../etc/passwd"])
def test_nothing_outside_can_be_read(path):
    result = run_code(f"try:\n    print(open({path!r}).read()[:50])\nexcept OSError as e:\n"
                      "    print(type(e).__name__)\n", [], FAST)
    assert result.ok and result.stdout.strip() == "FileNotFoundError", result.text()


def test_the_trainers_environment_and_files_are_not_there_even_through_libc():
    os.environ["RLLAVA_TEST_SECRET"] = "hf_secret_token"
    try:
        result = run_code("import ctypes, os\nlibc = ctypes.CDLL(None)\nlibc.getenv.restype = ctypes.c_char_p\n"
                          "print(libc.getenv(b'RLLAVA_TEST_SECRET'), os.environ.get('RLLAVA_TEST_SECRET'))\n"
                          f"print(libc.open({os.path.join(REPO, 'README.md').encode()!r}, 0))\n"
                          "print(sorted(os.listdir('/')), os.listdir('/etc'))\nprint(os.listdir('/proc'))\n", [], FAST)
    finally:
        del os.environ["RLLAVA_TEST_SECRET"]
    assert result.ok and "hf_secret" not in result.stdout, result.text()
    lines = result.stdout.splitlines()
    assert lines[0] == "None None" and lines[1] == "-1"
    assert "'work'" in lines[2] and lines[2].endswith("['ld.so.cache']") and lines[3] == "[]"  # /proc: empty


def test_nothing_outside_can_be_written_or_deleted(outside):
    path, unchanged = outside
    snippet = (f"import os\nfor attempt in (lambda: open({path!r}, 'w').write('x'), lambda: os.remove({path!r}),\n"
               f"                lambda: open('../../{os.path.basename(path)}', 'w').write('x'),\n"
               "                lambda: open('/usr/evil', 'w'), lambda: open('/evil', 'w'),\n"
               f"                lambda: os.symlink({path!r}, 'link.png')):\n"
               "    try:\n        attempt()\n        print('did')\n    except OSError as e:\n"
               "        print(type(e).__name__)\n")
    result = run_code(snippet, [], FAST)
    assert result.ok and unchanged(), result.text()
    assert result.stdout.split()[:5] == ["FileNotFoundError"] * 2 + ["OSError"] * 3 or "did" not in \
        result.stdout.split()[:5], result.text()
    assert result.images == []  # the symlink (if made) is not followed back out


@pytest.mark.parametrize("snippet, limit", [
    ("import os\nwhile True:\n    os.fork()\n", "process limit"),
    ("import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()\n",
     "process limit"),
    ("x = bytearray(8 << 30)\n", "memory limit"),
    ("while True:\n    pass\n", "CPU time limit"),
    ("import time\ntime.sleep(60)\n", "wall-clock limit"),
    ("while True:\n    print('x' * 1000)\n", "output limit (2 MB)"),
    ("open('big.bin', 'wb').write(b'0' * (64 << 20))\n", "file size limit"),
    ("fs = [open(f'f{i}', 'w') for i in range(10000)]\n", "open files limit"),
    ("for i in range(100):\n    open(f'f{i}', 'wb').write(b'0' * (1 << 20))\n", "disk limit"),
])
def test_each_limit_stops_its_bomb(snippet, limit, outside):
    _, unchanged = outside
    result = run_code(snippet, [], Limits(**{**FAST.__dict__, "disk_mb": 16}))
    assert result.stopped_by == limit and not result.ok, result.text()
    assert len(result.stdout) < FAST.output_chars + 100 and unchanged()
    assert leftovers() == []  # the whole call was killed


def test_a_process_that_leaves_the_group_is_killed_too():
    snippet = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')\n")
    result = run_code(snippet, [], FAST)
    assert result.ok and "parent done" in result.stdout
    assert leftovers() == []


def test_the_trainer_survives_kill_exit_and_crash():
    for target in (os.getpid(), os.getppid(), 1):  # this (the trainer's) process, its parent, the call's PID 1
        result = run_code(f"import os, signal\ntry:\n    os.kill({target}, signal.SIGKILL)\nexcept OSError as e:\n"
                          "    print(type(e).__name__)\nprint('after')\n", [], FAST)
        assert result.stopped_by is None and "after" in result.stdout, result.text()
    for snippet, code in [("import sys\nsys.exit(3)\n", 3), ("import os\nos._exit(0)\n", 0),
                          ("raise SystemExit('bye')\n", 1), ("import ctypes\nctypes.string_at(0)\n", -11)]:
        result = run_code(snippet, [], FAST)
        assert result.returncode == code, result.text()
    assert result.stopped_by == "crashed (signal SIGSEGV)"


def test_bomb_and_garbage_images_are_not_decoded():
    snippet = ("from PIL import Image\nImage.new('1', (20000, 20000)).save('bomb.png')\n"
               "Image.new('1', (5000, 5000)).save('big.png')\n"
               "open('fake.png', 'wb').write(b'not an image')\nImage.new('RGB', (8, 8)).save('fine.png')\n")
    result = run_code(snippet, [], Limits(**{**FAST.__dict__, "max_pixels": 4000 * 4000}))
    assert [im.size for im in result.images] == [(8, 8)], result.text()
    assert "bomb.png: 20000 x 20000 is over" in result.stderr and "big.png: 5000 x 5000 is over" in result.stderr
    assert "fake.png: not a readable" in result.stderr, result.text()


def test_output_is_cut_and_the_cli_prints_the_jail_and_the_observation(tmp_path, jail):
    result = run_code("print('y' * 10000)", [], FAST)
    assert result.ok and result.stdout.endswith("(output cut at 500 characters)")
    snippet = tmp_path / "s.py"
    snippet.write_text("import sys\nprint('hello')\nsys.exit(2)\n")
    out = subprocess.run([sys.executable, "-m", "rllava.agent.sandbox", str(snippet), "--wall-s", "5"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "hello" in out.stdout and "Error (exit status 2)" in out.stdout, out.stderr
    assert f"[jail: {jail.guards['jail']}]" in out.stdout and f"[totals: {jail.guards['totals']}]" in out.stdout


def test_concurrent_snippets_keep_their_own_output_and_images():
    """The code tool's pool calls the sandbox from several threads at once: each call gets its own."""
    def one(i):
        return run_code(f"from PIL import Image\nprint({i})\nImage.new('RGB', ({i + 1}, 3)).save('o.png')\n", [],
                        FAST)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(16)]
    assert [r.images[0].size for r in results] == [(i + 1, 3) for i in range(16)]


# ----------------------------------------------------------------------- calls against calls, and time
def test_1_kill_minus_one_reaches_no_other_call_and_no_process_of_the_trainer():
    bystander = subprocess.Popen(["sleep", "30"])  # a process of the trainer's user
    killer = ("import os, signal, time\ntime.sleep(0.5)\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n"
              "    pass  # no other process in its call\nprint('killed what it could')\n")
    victim = "import time\ntime.sleep(1.5)\nprint('alive')\n"
    try:
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(run_code, victim if i % 3 else killer, [], FAST) for i in range(6)]
            results = [f.result() for f in futures]
        assert bystander.poll() is None  # the trainer's process lives
    finally:
        bystander.kill()
        bystander.wait()
    for i, r in enumerate(results):
        assert r.ok and ("killed what it could" if i % 3 == 0 else "alive") in r.stdout, r.text()


SHM = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
       "shm = libc.shmget(0x5EED, 64 << 20, 0o1666)\nif shm >= 0:\n    addr = libc.shmat(shm, None, 0)\n"
       "    ctypes.memset(ctypes.c_void_p(addr), 1, 64 << 20)\n    ctypes.memmove(ctypes.c_void_p(addr), b'secret', 6)\n"
       "    libc.shmdt(ctypes.c_void_p(addr))\nprint('made', shm >= 0, libc.msgget(0x5EED, 0o1666) >= 0)\n")
SHM_READ = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('found', libc.shmget(0x5EED, 0, 0) >= 0, libc.msgget(0x5EED, 0) >= 0)\n")


def test_2_sysv_ipc_dies_with_its_call():
    """SysV IPC is refused by the syscall filter (issue 45.5/6: non-root, its segments counted against no limit);
    whatever a call could make would die with its IPC namespace anyway."""
    before = _sysv_keys()
    made = run_code(SHM, [], FAST)
    assert made.ok and made.stdout.strip() == "made False False", made.text()
    assert _sysv_keys() == before  # nothing of it left on the machine (64 MB resident, before)
    read = run_code(SHM_READ, [], FAST)
    assert read.ok and read.stdout.strip() == "found False False", read.text()


def test_3_a_process_that_outlives_its_leader_thread_ends_with_the_call():
    escapee = ("import ctypes, os, threading, time\nif os.fork() == 0:\n    os.setsid()\n    def loop():\n"
               "        time.sleep(1)\n        while True:\n            try:\n                os.kill(-1, 9)\n            except OSError:\n"
               "                pass\n            time.sleep(0.02)\n"
               "    threading.Thread(target=loop).start()\n    ctypes.CDLL(None).syscall(60, 0)  # SYS_exit: the leader\n"
               "time.sleep(0.3)\nprint('leader gone')\n")
    result = run_code(escapee, [], FAST)
    assert result.ok and "leader gone" in result.stdout, result.text()
    assert leftovers() == []
    later = run_code("import time\ntime.sleep(1)\nprint('later call alive')\n", [], FAST)
    assert later.ok and "later call alive" in later.stdout, later.text()


def test_4_take_back_never_follows_a_link_and_decodes_only_the_documented_formats():
    swapper = ("import os, time\nfrom PIL import Image\nos.mkdir('sub')\n"
               "Image.new('RGB', (9, 9), 'red').save('sub/secret.png')\nImage.new('RGB', (5, 5)).save('real.png')\n"
               "os.symlink('sub/secret.png', 'link.png')\nos.symlink('/work/sub/secret.png', 'abs.png')\n"
               "if os.fork() == 0:\n    os.setsid()\n    Image.new('RGB', (7, 7)).save('f.png')\n    while True:\n"
               "        os.rename('f.png', 'keep.tmp')\n        os.symlink('sub/secret.png', 'swap.png')\n"
               "        os.remove('swap.png')\n        os.rename('keep.tmp', 'f.png')\n"
               "time.sleep(0.2)\n")
    for _ in range(10):
        result = run_code(swapper, [], FAST)
        sizes = sorted(im.size for im in result.images)
        assert (9, 9) not in sizes and (5, 5) in sizes, result.text()
    formats = ("from PIL import Image\nfor fmt in ('TIFF', 'PPM', 'TGA', 'SGI', 'GIF'):\n"
               "    Image.new('RGB', (6, 6)).save(fmt.lower() + '.png', format=fmt)\n")
    result = run_code(formats, [], FAST)
    assert result.images == [] and result.stderr.count("not a readable PNG/JPEG/BMP/WEBP image") == 5


def test_5_what_the_snippet_writes_is_not_trusted(jail, caplog):
    forger = ("import os, json\nopen('.guards.json', 'w').write(json.dumps({'jail': 'CRITICAL forged'}))\n"
              "line = b'{\"pgid\": 1}\\n{\"status\": 0, \"limit\": \"\", \"cpu_s\": 0, \"images\": [], "
              "\"notes\": [\"CRITICAL forged\"]}\\n'\nfor fd in range(3, 256):\n    try:\n"
              "        os.write(fd, line)\n    except OSError:\n        pass\nraise SystemExit(3)\n")
    result = run_code(forger, [], FAST)
    assert result.returncode == 3 and result.guards == jail.guards and "forged" not in result.text()
    assert not any("forged" in r.getMessage() for r in caplog.records)
    deep = "import os\nfor i in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')\n"
    result = run_code(deep, [], FAST)
    assert result.ok and result.stdout.strip() == "deep", result.text()


def test_6_memory_processes_and_disk_are_bounded_per_call(jail):
    limits = Limits(**{**FAST.__dict__, "memory_mb": 1024, "processes": 4, "wall_s": 8.0})
    # held: forks that allocated their 700 MB and are still alive 3 s on (the OOM killer may end one that had
    # finished, after which another finishes: they never held it together)
    hog = ("import os, time\nr, w = os.pipe()\npids = []\nfor i in range(4):\n    try:\n        pid = os.fork()\n"
           "    except OSError:\n        break\n    if pid == 0:\n        b = b'\\1' * (700 << 20)\n"
           "        os.write(w, bytes([i]))\n        time.sleep(5)\n        os._exit(0)\n    pids.append(pid)\n"
           "os.close(w)\ntime.sleep(3)\nos.set_blocking(r, False)\ndone = os.read(r, 16)\n"
           "print('held', sum(os.waitpid(pids[i], os.WNOHANG) == (0, 0) for i in done))\n")
    result = run_code(hog, [], limits)
    held = int(result.stdout.split()[1]) if result.stdout.startswith("held") else 0
    bound = limits.memory_mb if jail.cgroup else limits.processes * limits.memory_mb  # documented in sandbox.py
    assert held * 700 <= bound, result.text()
    if jail.cgroup:
        assert held <= 1 and (result.stopped_by == "memory limit" or held <= 1)
    # the process limit is the call's: two calls each use all of theirs at once
    threads = ("import threading, time\nts = [threading.Thread(target=time.sleep, args=(1,)) for _ in range(3)]\n"
               "[t.start() for t in ts]\n[t.join() for t in ts]\nprint('threads ok')\n")
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda code: run_code(code, [], limits),
                                [threads, threads, "import os\nwhile True:\n    os.fork()\n"]))
    assert [r.stdout.strip() for r in results[:2]] == ["threads ok"] * 2, [r.text() for r in results]
    assert results[2].stopped_by == "process limit"
    disk = run_code("for i in range(300):\n    open(f'f{i}', 'wb').write(b'0' * (4 << 20))\n", [],
                    Limits(**{**FAST.__dict__, "file_mb": 16, "disk_mb": 32}))
    assert disk.stopped_by == "disk limit", disk.text()


def test_7_the_limit_is_read_from_the_exception_not_the_cut_text():
    cut = Limits(**{**FAST.__dict__, "output_chars": 40})
    result = run_code("import os\n" + "x = 1\n" * 200 + "fs = [open(f'f{i}', 'w') for i in range(10000)]\n", [], cut)
    assert result.stopped_by == "open files limit"
    result = run_code("import sys\nprint('MemoryError Too many open files', file=sys.stderr)\nsys.exit(1)\n", [], cut)
    assert result.stopped_by is None and result.returncode == 1


PID1_ATTACK = """import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
line = b'{"status": 0, "limit": "", "cpu_s": 0, "images": [], "notes": [' + b'[],' * (3 << 20) + b'[]]}\\n'
pidfd, taken = os.pidfd_open(1), 0
for fd in range(3, 64):  # PID 1's report pipe is one of them
    new = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd (x86_64)
    if new >= 0:
        taken += 1
        try:
            os.write(new, line)
        except OSError:
            pass
print('taken', taken, flush=True)
print('ptrace', libc.ptrace(16, 1, None, None), flush=True)  # PTRACE_ATTACH
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="pidfd_getfd is syscall 438 on x86_64")
def test_8_pid_1_is_out_of_the_snippets_reach_and_its_report_is_read_bounded():
    """Issue 45.1: a snippet that took PID 1's report pipe (pidfd_getfd, or ptrace) could write one line of
    millions of notes, which the trainer parsed whole (GBs). PID 1 is not dumpable: both fail; and the parent
    drops a report line over its cap before parsing it."""
    tracemalloc.start()
    result = run_code(PID1_ATTACK, [], FAST)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert result.stdout.split() == ["taken", "0", "ptrace", "-1"], result.text()
    assert result.ok and peak < 32 << 20, (peak, result.text())
    forged = b'{"pgid": 2}\n{"status": 0, "cpu_s": 0, "images": [], "notes": [' + b'[],' * (1 << 20) + b'[]]}\n'
    tracemalloc.start()
    assert sandbox._report(forged) == (None, [])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak


DRIP = """import os
for _ in range(7):
    if os.fork() == 0:
        break
while True:
    os.write(1, b"x")
"""


def test_17_a_drip_of_output_costs_the_trainer_little_cpu():
    """Issue 58.6: 8 processes writing 1 byte at a time woke the trainer's select loop on every write: 2.6 s of its
    thread's CPU in a 3 s call (5.4 s in 10 s in the issue). Output is read in batches (`sandbox.BATCH_S`): 0.06 s."""
    cpu = time.thread_time()
    result = run_code(DRIP, [], replace(FAST, wall_s=3.0))
    cpu = time.thread_time() - cpu
    assert result.stdout.startswith("x") and not result.ok, result.text()
    assert cpu < 0.3, cpu


def test_18_the_report_is_parsed_as_it_arrives_and_read_bounded():
    """Issue 58.8: the parent held the whole report (`max_images` x 3 x `max_pixels` bytes) and then copied it into
    the images. It pastes each chunk into its image as it arrives (`sandbox._Report`): in any chunking the images
    are the pixels sent; a short report, or one with an image over `max_pixels`, is none; bytes past the images are
    ignored."""
    images = [Image.effect_noise((37, 5), 60).convert("RGB"),
              Image.linear_gradient("L").resize((3, 200)).convert("RGB")]
    head = {"status": 0, "limit": "", "cpu_s": 0.1, "images": [["a.png", 37, 5], ["b.png", 3, 200]], "notes": ["n"]}
    data = b'{"pgid": 2}\n' + json.dumps(head).encode() + b"\n" + b"".join(im.tobytes() for im in images)
    for size in (1, 7, 1000, 1 << 16):
        stream = sandbox._Report(Limits())
        for at in range(0, len(data) + 5, size):
            stream.feed((data + b"extra")[at:at + size])
        report, got = stream.done()
        assert report == {"status": 0, "limit": "", "cpu_s": 0.1, "notes": ["n"]}, size
        assert [im.tobytes() for im in got] == [im.tobytes() for im in images], size
    assert sandbox._report(data[:-1]) == (None, [])
    assert sandbox._report(data.replace(b'"b.png", 3, 200', b'"b.png", 4097, 4096')) == (None, [])


BIG_IMAGES = """import hashlib, json, resource, sys
sys.path.insert(0, REPO)
from PIL import Image
from rllava.agent.sandbox import Limits, run_code
limits = Limits(wall_s=60.0, cpu_s=30)
run_code("print(1)", [], limits)  # warm-up: the jail, the zygote
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = run_code(SNIPPET, [], limits)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
want = hashlib.sha1(Image.linear_gradient("L").resize((4096, 4096)).convert("RGB").tobytes()).hexdigest()
print(json.dumps({"grown_mb": grown, "text": result.text()[-300:],
                  "same": [hashlib.sha1(im.tobytes()).hexdigest() == want for im in result.images]}))
"""
LARGE = """import sys
from PIL import Image
for i in range(4):
    Image.linear_gradient("L").resize((4096, 4096)).convert("RGB").save(f"i{i}.png")
sys.stdout.write("x" * 10000000)
"""


def test_19_images_at_the_limits_cost_the_trainer_the_images_alone():
    """Issue 58.8: 4 images of 4096 x 4096 and 10 MB of output grew the trainer's peak RSS 448 MB against the 384
    MB docs/agents.md stated: the report's bytes (192 MB, grown by realloc) and the images made from them. Now
    the images alone (`max_images` x 4 x `max_pixels`: 256 MB) + 24 MB of the interpreter's buffers (docs/agents.md,
    "The trainer's side of a round"); 256 MB measured. In a process of its own (ru_maxrss is a lifetime peak)."""
    script = f"REPO = {REPO!r}\nSNIPPET = {LARGE!r}\n" + BIG_IMAGES
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["same"] == [True] * 4, got
    assert got["grown_mb"] <= 4 * 4 * 4096 * 4096 / 2 ** 20 + 24, got


SYSCALLS = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for name, nr, args, _ in NAMES:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    print(name, r, ctypes.get_errno())
import numpy, threading, subprocess
t = threading.Thread(target=print, args=('thread ok',)); t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(3)
print('fork ok', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
import asyncio, socket
a, b = socket.socketpair()
a.sendall(b'unix ok')
asyncio.run(asyncio.sleep(0))  # its self-pipe is an AF_UNIX socketpair
print(b.recv(16).decode())
"""
EPERM, EAFNOSUPPORT, ENOLCK = 1, 97, 37
X86_64 = [("ptrace", 101, (16, 1, 0, 0), EPERM), ("pidfd_getfd", 438, (3, 3, 0), EPERM),
          ("process_vm_readv", 310, (1, 0, 0, 0, 0, 0), EPERM), ("process_vm_writev", 311, (1, 0, 0, 0, 0, 0), EPERM),
          ("add_key", 248, (0, 0, 0, 0, 0), EPERM), ("keyctl", 250, (0, 0), EPERM),
          ("request_key", 249, (0, 0, 0, 0), EPERM), ("inotify_init", 253, (), EPERM),
          ("inotify_init1", 294, (0,), EPERM), ("shmget", 29, (0, 4096, 0o1600), EPERM),
          ("msgget", 68, (0, 0o1600), EPERM), ("semget", 64, (0, 1, 0o1600), EPERM),
          ("io_uring_setup", 425, (8, 0), EPERM), ("io_uring_enter", 426, (0, 0, 0, 0, 0, 0), EPERM),
          ("io_uring_register", 427, (0, 0, 0, 0), EPERM), ("userfaultfd", 323, (0,), EPERM),
          ("perf_event_open", 298, (0, 0, -1, -1, 0), EPERM), ("bpf", 321, (0, 0, 0), EPERM),
          # issue 58: memory no rlimit counts, the machine's AIO pool, fds in flight, a lock channel between calls
          ("memfd_create", 319, (b"m", 0), EPERM), ("memfd_secret", 447, (0,), EPERM),
          ("io_setup", 206, (65536, 0), EPERM), ("sendmsg", 46, (0, 0, 0), EPERM), ("sendmmsg", 307, (0, 0, 0, 0), EPERM),
          ("flock", 73, (0, 2), EPERM), ("fcntl F_SETLK", 72, (0, 6, 0), ENOLCK), ("fcntl F_OFD_GETLK", 72, (0, 36, 0), ENOLCK),
          ("fcntl F_SETPIPE_SZ", 72, (0, 1031, 1 << 20), EPERM), ("setsockopt SO_SNDBUF", 54, (0, 1, 7, 0, 0), EPERM),
          # sockets but AF_UNIX: vsock (the hypervisor), netlink, inet, packet; the family in the low 32 bits only
          ("socket AF_VSOCK", 41, (40, 1, 0), EAFNOSUPPORT), ("socket AF_NETLINK", 41, (16, 3, 0), EAFNOSUPPORT),
          ("socket AF_INET", 41, (2, 1, 0), EAFNOSUPPORT), ("socket AF_INET6", 41, (10, 2, 0), EAFNOSUPPORT),
          ("socket AF_PACKET", 41, (17, 3, 0), EAFNOSUPPORT), ("socket AF_VSOCK high", 41, ((1 << 32) | 40, 1, 0),
                                                                  EAFNOSUPPORT),
          ("socketpair AF_VSOCK", 53, (40, 1, 0, 0), EAFNOSUPPORT),
          ("unshare", 272, (0x10000000,), EPERM), ("setns", 308, (0, 0), EPERM),
          ("clone", 56, (0x10000000 | 17, 0, 0, 0, 0), EPERM)]
# the last three: a new user namespace (all capabilities back in it), or the zygote's


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the syscall numbers are x86_64's")
def test_11_a_syscall_filter_refuses_what_reaches_outside_the_call(jail):
    """Issue 45.5: a seccomp filter on every call. Each of these reached a kernel object outside the call's
    namespaces (host root's key quota, the user's inotify instances, SysV segments no rlimit counts, io_uring,
    userfaultfd, perf, bpf, other processes' memory and fds): each returns EPERM, the snippet goes on, and what a
    snippet normally does (numpy, threads, fork) still works."""
    if jail.seccomp is None:
        pytest.skip("no syscall filter on this machine (allow_weaker)")
    result = run_code(f"NAMES = {X86_64!r}\n" + SYSCALLS, [], Limits(**{**FAST.__dict__, "output_chars": 4000}))
    lines = result.stdout.splitlines()
    assert result.ok and lines[-3:] == ["thread ok", "fork ok 3", "unix ok"], result.text()
    assert lines[:-3] == [f"{name} -1 {code}" for name, _, _, code in X86_64], result.text()
    assert "seccomp" in result.guards["syscalls"]


def test_12_the_work_directorys_inodes_are_bounded(jail):
    """Issue 45.6: tmpfs's --size bounds bytes, not inodes: empty files with long names took +690 MB of kernel
    memory against a 320 MB bound. The call is stopped past `files` inodes (PID 1 counts them as it waits)."""
    limits = Limits(**{**FAST.__dict__, "files": 500, "wall_s": 20.0})
    flood = "for i in range(200000):\n    open('f%07d' % i + 'x' * 240, 'w').close()\nprint('all made')\n"
    result = run_code(flood, [], limits)
    assert result.stopped_by == "file count limit" and "all made" not in result.stdout, result.text()
    some = run_code("import os\nfor i in range(400):\n    open(f'f{i}', 'w').close()\nprint(len(os.listdir()))\n",
                    [], limits)
    assert some.ok and int(some.stdout) == 401, some.text()  # the snippet's file too


def test_13_one_zygote_forks_each_call_into_namespaces_of_its_own():
    """Issue 45's per-call cost: one zygote per trainer process (`sandbox.ZYGOTE`, numpy and PIL imported once)
    forks every call, and each fork makes namespaces and a /work of its own before the snippet runs: nothing a
    call leaves (a file, a process, a module's state) reaches the next, and nothing outlives the zygote."""
    mark = ("import os, sys, numpy\nprint(os.path.exists('/work/mark'), getattr(numpy, 'touched', False))\n"
            "open('/work/mark', 'w').close()\nnumpy.touched = True\n"
            "if os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(30)\n")
    for _ in range(6):
        result = run_code(mark, [], FAST)
        assert result.ok and result.stdout.split() == ["False", "False"], result.text()
    preloaded = run_code("import sys\nprint('numpy' in sys.modules, 'PIL.Image' in sys.modules)\n", [], FAST)
    assert preloaded.stdout.split() == ["True", "True"], preloaded.text()  # imported in the zygote, once
    assert leftovers() == []
    deadline = time.monotonic() + 30  # a call forked ahead, or one just ended, may be mid-fork or mid-exit: polled
    while True:
        with sandbox.ZYGOTE.helper:
            ahead = [s for v in sandbox.ZYGOTE.ahead.values() for s in v]
            zygote = [sandbox.ZYGOTE.proc.pid] + children(sandbox.ZYGOTE.proc.pid)
        if len(zygote) == 2 + 2 * len(ahead) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(zygote) == 2 + 2 * len(ahead), zygote  # bubblewrap, the zygote, and the calls forked ahead
    sandbox.ZYGOTE.close()
    deadline = time.monotonic() + 30  # the kernel ends the zygote's namespace after bubblewrap: waited, not timed
    while any(os.path.exists(f"/proc/{pid}") for pid in zygote) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in zygote)
    assert run_code("print('again')", [], FAST).stdout == "again\n"  # a new one, on the next call


def test_14_what_the_kernel_charges_to_the_trainers_uid_is_bounded_per_call():
    """Issue 58.4/5: queued signals and POSIX message queues are charged up the user-namespace chain to the
    trainer's host uid; a call inherited the trainer's limits (96,365 signals, 800 KB) and took them all, so every
    process of that uid got EAGAIN from sigqueue and EMFILE from mq_open. Seven calls holding ptys drained the pool
    every devpts but the host's shares. Each is set per call now (FIXED_RLIMITS, PTYS): a call queueing signals
    until refused holds at most RLIMIT_SIGPENDING of them, and opening ptys until refused gets PTYS."""
    snippet = f"""import ctypes, os, resource, signal
for name in {list(FIXED_RLIMITS)!r}:
    print(name, *resource.getrlimit(getattr(resource, name)))
libc = ctypes.CDLL(None, use_errno=True)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
queued = 0
while queued < 200000 and libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0)) == 0:
    queued += 1
print('signals', queued, ctypes.get_errno())
print('mq_open', libc.mq_open(b'/rllava', os.O_CREAT | os.O_RDWR, 0o600, None), ctypes.get_errno())
ptys = []
try:
    while len(ptys) < 100:
        ptys.append(os.openpty())
except OSError as e:
    print('ptys', len(ptys), e.errno)
"""
    result = run_code(snippet, [], Limits(**{**FAST.__dict__, "open_files": 256}))
    lines = result.stdout.splitlines()
    assert result.ok and lines[:len(FIXED_RLIMITS)] == [f"{k} {v} {v}" for k, v in FIXED_RLIMITS.items()], \
        result.text()
    assert lines[len(FIXED_RLIMITS):] == [f"signals {FIXED_RLIMITS['RLIMIT_SIGPENDING']} {errno.EAGAIN}",
                                          f"mq_open -1 {errno.EMFILE}", f"ptys {PTYS} {errno.ENOSPC}"], result.text()


def test_15_a_snippet_killed_by_any_signal_or_a_deep_report_is_an_observation(caplog):
    """Issue 58.7/9: a snippet that died by a real-time signal crashed the step (`signal.Signals(40)` raises), a
    deeply nested report line raised RecursionError out of `_report`, and a call's stderr was quoted raw inside
    the trainer's WARNING line (its ANSI escapes and a "CRITICAL" showed in the trainer's log)."""
    result = run_code("import os, signal\nos.kill(os.getpid(), signal.SIGRTMIN + 6)\n", [], FAST)
    assert result.stopped_by == "crashed (signal SIGRTMIN+6)" and "SIGRTMIN+6" in result.text(), result.text()
    assert sandbox._report(b'{"pgid": 2}\n' + b"[" * 20000 + b"\n") == (None, [])
    seen = {"stdout": bytearray(), "stderr": bytearray(b"\x1b[31mCRITICAL forged\x1b[0m\n"), "result": bytearray(),
            "output": 0, "timed_out": False, "over": False, "exit": -signal.SIGKILL}
    result = sandbox._result(seen, {}, FAST, {})
    warned = [r.getMessage() for r in caplog.records if "without its report" in r.getMessage()]
    assert result.stopped_by == "sandbox error" and len(warned) == 1, warned
    assert "\x1b" not in warned[0] and "'\\x1b[31mCRITICAL forged\\x1b[0m'" in warned[0], warned


BUFFERS = """import fcntl, os, socket
def fill(s):
    s.setblocking(False)
    total = 0
    try:
        while True:
            total += s.send(b"x" * 65536)
    except BlockingIOError:
        return total
def grow(f):
    try:
        f()
    except OSError as e:
        return e.errno
    return 0
a, b = socket.socketpair()
r, w = os.pipe()
os.set_blocking(w, False)
print(grow(lambda: a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)),
      grow(lambda: fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)))
piped = 0
try:
    while True:
        piped += os.write(w, b"x" * 4096)
except BlockingIOError:
    pass
print(fill(a), piped)
"""


def test_16_a_calls_socket_and_pipe_buffers_stay_at_the_systems_defaults():
    """Issue 58.1: what holds memory that no rlimit counts, besides memfd (refused): a socket's buffer grown to
    net.core.wmem_max (4 MB here, x 2) and a pipe's to 1 MB, over every fd of every process of the call. Both
    resizes are refused: a socket queues at most net.core.wmem_default and one more write, a pipe 64 KB
    (docs/agents.md's bound for a trainer without a cgroup)."""
    result = run_code(BUFFERS, [], FAST)
    lines = result.stdout.split()
    wmem = int(open("/proc/sys/net/core/wmem_default").read())
    assert result.ok and lines[:2] == [str(errno.EPERM)] * 2, result.text()
    assert int(lines[2]) <= wmem + 65536 and int(lines[3]) == 65536, result.text()


def test_9_a_file_name_that_is_not_utf8_comes_back_as_text():
    """Issue 45.2: a file name that is not UTF-8 came back as a lone surrogate, which the rollout's tokenizer
    rejects (the step crashed): names reach text decoded with replacement."""
    snippet = ("from PIL import Image\nopen(b'\\xff.png', 'wb').write(b'junk')\n"
               "Image.new('RGB', (4, 4)).save(b'\\xfd.png', format='PNG')\nraise SystemExit(1)\n")
    result = run_code(snippet, [], FAST)
    text = result.text()
    assert text.encode("utf-8") and [im.size for im in result.images] == [(4, 4)], ascii(text)
    assert result.returncode == 1 and "\ufffd.png: not a readable PNG" in text, ascii(text)


COSTLY = r"""import io, struct, zlib
from PIL import Image, PngImagePlugin
buf = io.BytesIO()
Image.new('L', (2048, 2048), 128).save(buf, 'JPEG', progressive=True)
jpeg = buf.getvalue()
open('scans.jpg', 'wb').write(jpeg[:-2] + b'\xff\xda\x00\x08\x01\x01\x00\x01\x3f\x10' * 1000 + jpeg[-2:])
open('app.jpg', 'wb').write(jpeg[:2] + b'\xff\xe1\x00\x02' * 250000 + jpeg[2:])
buf = io.BytesIO()
Image.new('RGB', (8, 8), 'red').save(buf, 'PNG')
chunk = lambda kind, body: struct.pack('>I', len(body)) + kind + body + struct.pack('>I', zlib.crc32(kind + body))
texts = b''.join(chunk(b'tEXt', b'%d\x00v' % i) for i in range(100000))  # each kept in info, before
open('text.png', 'wb').write(buf.getvalue()[:33] + texts + buf.getvalue()[33:])
open('idat.png', 'wb').write(buf.getvalue()[:33] + chunk(b'IDAT', b'') * 16385 + buf.getvalue()[33:])
pixels = (b'\xff\x01' * 4 + b'\x04\x01' + b'\x00\x00') * 1024 + b'\x00\x01'  # RLE8 runs, 1024 x 1024
dib = struct.pack('<IiiHHIIiiII', 40, 1024, 1024, 1, 8, 1, len(pixels), 0, 0, 256, 0)
palette = b''.join(bytes((i, i, i, 0)) for i in range(256))
open('rle.bmp', 'wb').write(b'BM' + struct.pack('<IHHI', 1078 + len(pixels), 0, 0, 1078) + dib + palette + pixels)
info, exif = PngImagePlugin.PngInfo(), Image.Exif()
info.add_text('k', 'v' * 1000)
exif[0x010e] = 'described'
im = Image.new('RGB', (16, 16), 'blue')
im.save('ok.png', pnginfo=info)
im.save('ok.jpg', progressive=True, exif=exif, comment=b'c' * 1000)
im.save('ok.webp')
im.save('ok.bmp')
"""


def test_10_images_are_decoded_in_the_call_bounded_by_what_their_decoders_cost():
    """Issue 45.3: the trainer decoded what a snippet saved, bounded only by pixel count: a progressive JPEG of
    1000 empty scans (39 s of trainer CPU), a JPEG of APP markers and a PNG of tEXt chunks (PIL parses each in
    Python and kept them in `info`), an RLE BMP (Python's decoder). PID 1 refuses them by their bytes, decodes
    the rest under the call's limits and hands back RGB pixels only."""
    tracemalloc.start()
    start = time.process_time()  # the trainer's CPU, not the wall clock: a busy machine does not change it
    result = run_code(COSTLY, [], Limits(**{**FAST.__dict__, "max_images": 8, "file_mb": 16}))
    took, peak = time.process_time() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert result.ok and took < 5 and peak < 8 << 20, (took, peak, result.text())
    assert [im.size for im in result.images] == [(16, 16)] * 4 and all(im.info == {} for im in result.images)
    for note in ("scans.jpg: a JPEG of over 32 scans,", "app.jpg: a JPEG of over 64 markers before its first scan,",
                 "text.png: a PNG of over 64 chunks besides IDAT, or 16384 in all,", "idat.png: a PNG of over 64",
                 "rle.bmp: an RLE BMP,"):
        assert note in result.stderr, result.text()
    assert result.stderr.count("whose decoder costs more than its pixels: not decoded") == 5, result.text()
    jpeg, png = io.BytesIO(), io.BytesIO()  # the documented bounds, to the scan and chunk
    Image.new("L", (8, 8)).save(jpeg, "JPEG", progressive=True)
    Image.new("L", (8, 8)).save(png, "PNG")
    jpeg, png, scan, text = jpeg.getvalue(), png.getvalue(), b"\xff\xda\x00\x08\x01\x01\x00\x01\x3f\x10", b"tEXt"
    text = struct.pack(">I", 0) + text + struct.pack(">I", zlib.crc32(text))
    for n, refused in ((32, False), (33, True)):
        assert bool(_costly(jpeg[:-2] + scan * (n - jpeg.count(b"\xff\xda")) + jpeg[-2:])) == refused
    for n, refused in ((64, False), (65, True)):  # IHDR and n - 1 tEXt chunks
        assert bool(_costly(png[:33] + text * (n - 1) + png[33:])) == refused


# ------------------------------------------------------------------------------ non-root, and fail closed
def _as_user_command(uid: int, command: list[str]) -> list[str] | None:
    """`command` run as `uid` (no supplementary groups), in a mount namespace where the directories on the way
    to this interpreter and to the checkout that `uid` may not enter (e.g. /root, 0700) are made enterable: a
    0755 tmpfs over the first such one, with the needed subtree bound back. None where that cannot be done."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        return None
    steps = []
    for target in sorted({os.path.realpath(sys.base_prefix), REPO, os.path.realpath(sys.prefix)}):
        parts, path = target.strip("/").split("/"), ""
        for i, part in enumerate(parts[:-1]):
            path += "/" + part
            if not os.stat(path).st_mode & 0o001:
                stash = f"/tmp/.rllava-stash-{i}-{len(steps)}"
                rest = "/".join(parts[i + 1:])
                steps.append(f"mkdir -p {stash} && mount --bind {path} {stash} && "
                             f"mount -t tmpfs -o mode=755 tmpfs {path} && mkdir -p {path}/{rest} && "
                             f"mount --bind {stash}/{rest} {path}/{rest}")
                break
    inner = " && ".join(steps + [f"exec setpriv --reuid {uid} --regid {uid} --clear-groups " +
                                 " ".join(map(shlex.quote, command))])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner]


@pytest.mark.skipif(os.environ.get(NONROOT_RUN) is not None, reason="already the unprivileged run")
@pytest.mark.slow
def test_the_suite_holds_for_an_unprivileged_user():
    """Cases 8 and 9: as a non-root trainer, the same guarantees come from a user namespace (the call runs as
    65534 inside it; kill(-1) finds no process of the trainer's): this whole file, run as uid 4242."""
    uid, home = 4242, tempfile.mkdtemp(prefix="rllava-unprivileged-")
    command = _as_user_command(uid, [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                     "--basetemp", os.path.join(home, "t"), os.path.abspath(__file__)])
    if command is None:
        pytest.skip("needs root, unshare and setpriv to become an unprivileged user")
    try:
        os.chmod(home, 0o755)
        os.chown(home, uid, uid)
        env = {**os.environ, NONROOT_RUN: str(uid), "HOME": home}
        out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=home, timeout=900)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    tail = (out.stdout + out.stderr)[-3000:]
    assert out.returncode == 0 and " passed" in out.stdout, tail
    # skipped there: the two that need root (this one is slow: deselected); every other one ran as uid 4242
    assert " passed, 2 skipped, 1 deselected in " in out.stdout.splitlines()[-1], tail


DELEGATED = """import sys
from rllava.agent import sandbox
hog = ("import os, time\\nfor _ in range(4):\\n    if os.fork() == 0:\\n        x = b'x' * (150 << 20)\\n"
       "        time.sleep(3)\\n        os._exit(0)\\ntime.sleep(2)\\nprint('held')\\n")
result = sandbox.run_code(hog, [], sandbox.Limits(memory_mb=320, processes=8, wall_s=6))
print(sandbox.jail().guards["totals"], "|", result.stopped_by)
"""


@pytest.mark.skipif(os.environ.get(NONROOT_RUN) is not None, reason="needs root to delegate a cgroup")
def test_an_unprivileged_trainer_in_a_delegated_cgroup_gets_the_per_call_totals():
    """Issue 58.1: as a non-root trainer no rlimit bounds a call's memory as a whole (RLIMIT_AS is per process).
    Where the system delegates a cgroup to the user (systemd's user@.service; `systemd-run --user --scope -p
    Delegate=yes`), each call gets a cgroup of its own there: four 150 MB forks under a 320 MB call are stopped
    by its memory limit. Delegated here as systemd does: a cgroup the user owns, with memory and pids."""
    bases = sandbox._cgroup_bases()
    uid, made = 4242, []
    command = _as_user_command(uid, [sys.executable, "-c", DELEGATED])
    if bases is None or command is None:
        pytest.skip("needs root, a writable cgroup, unshare and setpriv")
    version, dirs = bases
    name = f"rllava-delegated-{os.getpid()}"
    for base in sorted(set(dirs.values())):
        made.append(os.path.join(base, name))
        os.mkdir(made[-1])
        if version == 2:  # its child holds the trainer; the calls are made beside it
            open(os.path.join(made[-1], "cgroup.subtree_control"), "w").write("+memory +pids")
            made.append(os.path.join(made[-1], "trainer"))
            os.mkdir(made[-1])
    for d in made:
        for path in [d] + [os.path.join(d, f) for f in os.listdir(d)]:
            os.chown(path, uid, uid)
    leaves = [d for d in made if not any(other.startswith(d + "/") for other in made)]

    def join():
        for leaf in leaves:
            open(os.path.join(leaf, "cgroup.procs"), "w").write(str(os.getpid()))
    try:
        out = subprocess.run(command, capture_output=True, text=True, preexec_fn=join, cwd="/", timeout=120,
                             env={**os.environ, "HOME": "/tmp"})
    finally:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(d)
    assert out.returncode == 0 and out.stdout.strip().startswith("cgroup v"), out.stdout + out.stderr[-2000:]
    assert out.stdout.strip().endswith("| memory limit"), out.stdout + out.stderr[-2000:]


def test_unprivileged_run_keeps_its_uid_outside():
    """In the unprivileged run, the call's processes are the trainer's uid outside and 65534 inside."""
    if os.environ.get(NONROOT_RUN) is None:
        pytest.skip("runs in test_the_suite_holds_for_an_unprivileged_user")
    assert os.geteuid() == int(os.environ[NONROOT_RUN])
    result = run_code("import os\nprint(os.getuid(), os.getpid())\n", [], FAST)
    assert result.stdout.split() == ["65534", "2"] and result.guards["totals"].startswith(("RLIMIT", "cgroup"))


def _fresh_jail(monkeypatch, **patches):
    monkeypatch.setattr(sandbox, "_jail", None)
    for name, value in patches.items():
        monkeypatch.setattr(sandbox, name, value)


def test_no_syscall_filter_is_a_startup_error(monkeypatch, caplog):
    """Fail closed (issue 45.5): without libseccomp or its binding the jail is not made silently weaker; with
    allow_weaker=true it runs without the filter and says so."""
    if shutil.which("bwrap") is None:
        pytest.skip("no bwrap")

    def missing():
        raise RuntimeError("Unable to find libseccomp")
    _fresh_jail(monkeypatch, _warned=set(), seccomp_program=missing)
    from rllava.agent.code import Code

    with pytest.raises(ConfigError) as e:
        Code(wall_s=5)
    assert "\n" not in str(e.value) and "apt-get install libseccomp2" in str(e.value), e.value
    with caplog.at_level("WARNING"):
        result = run_code("import ctypes\nprint(ctypes.CDLL(None).syscall(294, 0) >= 0)\n", [], FAST, allow_weaker=True)
    assert result.ok and result.guards["syscalls"] == "no filter", result.text()
    assert any("no syscall filter" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("bwrap", ["missing", "refused", "old"])
def test_no_jail_is_a_startup_error_naming_what_is_missing(bwrap, tmp_path, monkeypatch, caplog):
    """Case 10: where the jail cannot be made the code tool does not run weaker by itself: one error naming what
    is missing; allow_weaker=true runs anyway and warns once, naming what is not isolated."""
    if bwrap == "missing":
        monkeypatch.setenv("PATH", str(tmp_path))
    else:  # a bwrap that cannot make namespaces (a default container, user namespaces off), or Ubuntu 22.04's
        fake = tmp_path / "bwrap"
        version = "0.8.0" if bwrap == "refused" else "0.6.1"
        fake.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo 'bubblewrap {version}' && exit 0\n"
                        "echo 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    _fresh_jail(monkeypatch, _warned=set())
    from rllava.agent.code import Code

    with pytest.raises(ConfigError) as e:
        Code(wall_s=5)
    message = str(e.value)
    assert "\n" not in message and "allow_weaker=true" in message
    assert {"missing": "apt-get install bubblewrap", "refused": "unprivileged_userns_clone",
            "old": "bubblewrap 0.6 is too old: 0.8 or newer"}[bwrap] in message
    ours = os.path.join(tempfile.gettempdir(), "rllava_sandbox_*")  # others' files in /tmp come and go
    tool, temps = Code(wall_s=5, allow_weaker=True), glob.glob(ours)
    with caplog.at_level("WARNING"):
        first = run_code("print('weak')", [], tool.limits, allow_weaker=True)
        deep = run_code("import os\nfor i in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')\n",
                        [], tool.limits, allow_weaker=True)
    assert first.ok and first.stdout.strip() == "weak" and deep.ok, deep.text()
    assert first.guards["jail"].startswith("none") and glob.glob(ours) == temps
    warnings = [r.getMessage() for r in caplog.records if "weaker than promised" in r.getMessage()]
    assert len(warnings) == 1 and "files, network and processes" in warnings[0]
    snippet = tmp_path / "s.py"
    snippet.write_text("print('hi')\n")
    cli = subprocess.run([sys.executable, "-m", "rllava.agent.sandbox", str(snippet)], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ})
    assert cli.returncode != 0 and "allow_weaker=true" in cli.stderr and cli.stderr.count("\n") <= 1
    cli = subprocess.run([sys.executable, "-m", "rllava.agent.sandbox", str(snippet), "--allow-weaker"],
                         capture_output=True, text=True, cwd=REPO, env={**os.environ})
    assert cli.returncode == 0 and "hi" in cli.stdout and "weaker than promised" in cli.stderr


def test_root_without_cap_sys_admin_never_reaches_the_network(tmp_path):
    """Case 10's container: root without CAP_SYS_ADMIN either gets the full jail (through a user namespace) or
    the start-up error; the socket layer is never the only guard."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    snippet = tmp_path / "s.py"
    snippet.write_text(f"import _socket\ntry:\n    print('raw', _socket.socket().connect_ex(('127.0.0.1', "
                       f"{server.getsockname()[1]})))\nexcept OSError as e:\n    print('raw refused', e.errno)\n")
    out = subprocess.run(["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin", sys.executable, "-m",
                          "rllava.agent.sandbox", str(snippet)], capture_output=True, text=True, cwd=REPO)
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()
    assert "raw 0" not in out.stdout
    assert (out.returncode == 0 and "raw " in out.stdout) or "allow_weaker=true" in out.stderr, out.stderr

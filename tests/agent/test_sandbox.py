"""The code sandbox (rllava.agent.sandbox) against hostile snippets: each fails safely, the limit or guard that
stopped it is named, the trainer's process goes on, and nothing outside the sandbox changes."""

import os
import socket
import subprocess
import sys

import pytest
from PIL import Image

from rllava.agent.sandbox import Limits, run_code

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = Limits(cpu_s=2, wall_s=4.0, memory_mb=1024, file_mb=2, processes=32, output_chars=500)
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the full jail needs root (these machines run as root)")


@pytest.fixture
def outside(tmp_path):
    """A file outside the sandbox, and a check that it is exactly as it was."""
    path = tmp_path / "sentinel.txt"
    path.write_text("untouched")

    def unchanged():
        return sorted(os.listdir(tmp_path)) == ["sentinel.txt"] and path.read_text() == "untouched"
    return str(path), unchanged


def test_a_snippet_reads_its_image_and_saves_one_back():
    image = Image.new("RGB", (40, 20), (200, 10, 10))
    result = run_code("from PIL import Image\nim = Image.open('image.png')\nprint(im.size)\n"
                      "im.rotate(90, expand=True).save('out.png')\n", [image], FAST)
    assert result.ok and result.stdout.strip() == "(40, 20)" and [im.size for im in result.images] == [(20, 40)]
    assert result.guards == {"network": "namespace", "files": "chroot to the work directory", "user": "nobody"}
    assert "[1 image saved]" in result.text()


def test_network_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    snippet = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
               "    print('CONNECTED')\nexcept OSError as e:\n    print('refused', type(e).__name__)\n"
               "try:\n    socket.getaddrinfo('localhost', 80)\n    print('RESOLVED')\nexcept OSError as e:\n"
               "    print('no dns', type(e).__name__)\n"
               "import urllib.request\n")
    result = run_code(snippet, [], FAST)
    with pytest.raises(socket.timeout):
        server.accept()  # nothing ever connected
    server.close()
    assert "refused" in result.stdout and "no dns" in result.stdout and "CONNECTED" not in result.stdout
    assert "RESOLVED" not in result.stdout and "ModuleNotFoundError" in result.stderr  # no urllib to load


@pytest.mark.parametrize("path", ["/etc/passwd", os.path.expanduser("~/.bashrc"), os.path.join(REPO, "README.md"),
                                  f"/proc/{os.getpid()}/environ", "../../../../etc/passwd"])
def test_nothing_outside_can_be_read(path):
    result = run_code(f"print(open({path!r}).read()[:50])", [], FAST)
    assert not result.ok and "FileNotFoundError" in result.stderr, result.text()


def test_nothing_outside_can_be_written_or_deleted(outside):
    path, unchanged = outside
    snippet = (f"import os\nfor attempt in (lambda: open({path!r}, 'w').write('x'), lambda: os.remove({path!r}),\n"
               f"                lambda: open('../../{os.path.basename(path)}', 'w').write('x'),\n"
               f"                lambda: os.symlink({path!r}, 'link.png')):\n"
               "    try:\n        attempt()\n        print('did')\n    except OSError as e:\n"
               "        print(type(e).__name__)\n")
    result = run_code(snippet, [], FAST)
    assert result.ok and unchanged(), result.text()
    assert result.images == []  # the symlink (if made) is not followed back out


@pytest.mark.parametrize("snippet, limit", [
    ("import os\nwhile True:\n    os.fork()\n", "process limit"),
    ("import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()\n",
     "process limit"),
    ("x = bytearray(8 << 30)\n", "memory limit"),
    ("while True:\n    pass\n", "CPU time limit"),
    ("import time\ntime.sleep(60)\n", "wall-clock limit"),
    ("while True:\n    print('x' * 1000)\n", "file size limit"),
    ("open('big.bin', 'wb').write(b'0' * (64 << 20))\n", "file size limit"),
    ("fs = [open(f'f{i}', 'w') for i in range(10000)]\n", "open files limit"),
])
def test_each_limit_stops_its_bomb(snippet, limit, outside):
    _, unchanged = outside
    result = run_code(snippet, [], FAST)
    assert result.stopped_by == limit and not result.ok, result.text()
    assert len(result.stdout) < FAST.output_chars + 100 and unchanged()
    leftover = subprocess.run(["pgrep", "-u", "65534", "-f", "sandbox_child"], capture_output=True, text=True).stdout
    assert leftover == ""  # the whole process group was killed


def test_a_process_that_leaves_the_group_is_killed_too():
    snippet = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')\n")
    result = run_code(snippet, [], FAST)
    assert result.ok and "parent done" in result.stdout
    leftover = subprocess.run(["pgrep", "-u", "65534", "-f", "sandbox_child"], capture_output=True, text=True).stdout
    assert leftover == ""


def test_the_trainer_survives_kill_exit_and_crash():
    for target in (os.getpid(), 1):  # this (the trainer's) process, init: not nobody's to signal
        result = run_code(f"import os, signal\nos.kill({target}, signal.SIGKILL)\n", [], FAST)
        assert "PermissionError" in result.stderr and result.stopped_by is None
    for snippet, code in [("import sys\nsys.exit(3)\n", 3), ("import os\nos._exit(0)\n", 0),
                          ("raise SystemExit('bye')\n", 1), ("import ctypes\n", 1)]:
        result = run_code(snippet, [], FAST)
        assert result.returncode == code and result.stopped_by is None, result.text()
    assert "No module named 'ctypes'" in result.stderr  # the last: ctypes cannot be loaded to crash anything


def test_bomb_and_garbage_images_are_not_decoded():
    snippet = ("from PIL import Image\nImage.new('1', (20000, 20000)).save('bomb.png')\n"
               "Image.new('1', (5000, 5000)).save('big.png')\n"
               "open('fake.png', 'wb').write(b'not an image')\nImage.new('RGB', (8, 8)).save('fine.png')\n")
    result = run_code(snippet, [], Limits(**{**FAST.__dict__, "max_pixels": 4000 * 4000}))
    assert [im.size for im in result.images] == [(8, 8)]
    assert "bomb.png: a decompression bomb" in result.stderr and "big.png: 5000 x 5000 is over" in result.stderr
    assert "fake.png: not a readable image" in result.stderr


def test_output_is_cut_and_the_cli_prints_the_observation(tmp_path):
    result = run_code("print('y' * 10000)", [], FAST)
    assert result.ok and result.stdout.endswith("(output cut at 500 characters)")
    snippet = tmp_path / "s.py"
    snippet.write_text("import sys\nprint('hello')\nsys.exit(2)\n")
    out = subprocess.run([sys.executable, "-m", "rllava.agent.sandbox", str(snippet), "--wall-s", "5"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "hello" in out.stdout and "Error (exit status 2)" in out.stdout


def test_concurrent_snippets_keep_their_own_output_and_images():
    """The code tool's pool calls the fork server from several threads at once: each call gets its own."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i):
        return run_code(f"from PIL import Image\nprint({i})\nImage.new('RGB', ({i + 1}, 3)).save('o.png')\n", [],
                        FAST)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(16)]
    assert [r.images[0].size for r in results] == [(i + 1, 3) for i in range(16)]

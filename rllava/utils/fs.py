"""Files that appear whole or not at all."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager


@contextmanager
def atomic_directory(path: str):
    """Yield a temporary directory beside `path`; on success it replaces `path` in one rename, on any error
    (or interrupt) it is deleted, so readers never see a half-written `path`."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        replace_directory(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_directory(tmp: str, path: str) -> None:
    """Move the finished directory `tmp` to `path` by rename (atomic on one file system), replacing any old
    `path` (moved aside first, then deleted)."""
    if os.path.exists(path):
        old = tmp + ".old"
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


def write_text_atomic(path: str, text: str) -> None:
    """`path` holds the old text or the new one, never a part of it."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)

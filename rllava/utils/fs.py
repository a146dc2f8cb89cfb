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
        if os.path.exists(path):
            old = tmp + ".old"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

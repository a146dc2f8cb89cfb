"""Local path or hub id, told apart before anything loads: offline, the hub's client retries each file for ~30 s (11
lines) before it fails, and `outputs/nomodel` (a missing local folder) reads like a hub id `org/name`."""

from __future__ import annotations

import os
import re
import socket
from functools import cache
from urllib.parse import urlparse

PROXIES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def is_hub_id(path: str) -> bool:
    """`org/name`, not `./...` or `~/...`, and no folder `org` here (`outputs/nomodel` is a local path)."""
    return (re.fullmatch(r"[\w.-]+/[\w.-]+", path) is not None and not path.startswith((".", "~"))
            and not os.path.exists(path.split("/")[0]))


@cache
def hub_reachable() -> bool:
    """Not HF_HUB_OFFLINE, and the hub's host (HF_ENDPOINT) takes a connection within 3 s (behind a proxy: taken
    as reachable). Asked once a process."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        if not (constants.is_offline_mode() or any(os.environ.get(k) for k in PROXIES)):
            socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), 3).close()
    except OSError:
        return False
    return not constants.is_offline_mode()


def local_copy(path: str) -> str:
    """`path`; for a hub id while the hub is out of reach, its folder in the local hub cache (a model downloaded
    before loads from it), or "" when it was never downloaded."""
    if not is_hub_id(path) or hub_reachable():
        return path
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(path, "config.json")
    return os.path.dirname(found) if isinstance(found, str) else ""

"""Local path or Hugging Face hub id, and whether the hub can be asked: checked before anything loads, because the
hub's client retries each file for ~30 s (11 lines of messages) when the network is down, and `outputs/nomodel`
(a missing local folder) reads like a hub id `org/name`."""

from __future__ import annotations

import os
import re
import socket
from functools import cache
from urllib.parse import urlparse

PROXIES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def is_hub_id(path: str) -> bool:
    """`org/name` that is no local path: not `./...` or `~/...`, and `org` no folder here (`outputs/nomodel` with an
    `outputs/` here is a local path, missing)."""
    return (re.fullmatch(r"[\w.-]+/[\w.-]+", path) is not None and not path.startswith((".", "~"))
            and not os.path.exists(path.split("/")[0]))


@cache
def hub_reachable() -> bool:
    """Not HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), and the hub's host (HF_ENDPOINT) accepts a connection within
    3 s; through a proxy (HTTPS_PROXY, ALL_PROXY) the hub is taken as reachable. Asked once a process."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    if any(os.environ.get(k) for k in PROXIES):
        return True
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=3).close()
    except OSError:
        return False
    return True


def local_copy(path: str) -> str:
    """`path` itself; for a hub id while the hub is out of reach, its folder in the local hub cache (a model
    downloaded before loads from it, without the hub), or "" when it was never downloaded."""
    if not is_hub_id(path) or hub_reachable():
        return path
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(path, "config.json")
    return os.path.dirname(found) if isinstance(found, str) else ""

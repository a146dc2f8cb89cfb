"""docs/config.md, generated from the schema: every key, its default and the comment beside its field.

    python -m rllava.config.docgen > docs/config.md     (a test fails when the file drifts)
"""

from __future__ import annotations

import inspect
import re
import typing
from dataclasses import MISSING, fields, is_dataclass

from rllava.config.loader import ALIASES
from rllava.config.schema import PPOConfig

_FIELD = re.compile(r"^    (\w+): [^#]*?(?:#\s*(.*))?$")


def _comments(cls) -> dict[str, str]:
    """Field name -> the comment beside its line in the class's source."""
    return {m.group(1): (m.group(2) or "").strip() for m in map(_FIELD.match, inspect.getsource(cls).splitlines()) if m}


def _default(f):
    value = f.default_factory() if f.default is MISSING else f.default  # every field has a default
    return "{...}" if is_dataclass(value) else value


def _rows(cls, prefix: str):
    comments, hints = _comments(cls), typing.get_type_hints(cls)
    for f in fields(cls):
        key, tp = prefix + f.name, hints[f.name]
        sub = next((a for a in (tp, *typing.get_args(tp)) if is_dataclass(a)), None)
        yield key, _default(f), comments.get(f.name, ""), sub is not None
        if sub is not None:
            yield from _rows(sub, key + ".")


def render() -> str:
    lines = ["# Config reference", "",
             "Generated from `rllava/config/schema.py` by `python -m rllava.config.docgen`; do not edit.",
             "Keys are RLLaVA's; `rllava:` marks keys or defaults of our own. Set them in YAML (`config=FILE`)",
             "or on the command line (`key=value`).", "", "## Aliases", "", "| alias | canonical key |", "|---|---|"]
    lines += [f"| `{a}` | `{c}` |" for a, c in sorted(ALIASES.items())]
    section = None
    for key, default, comment, is_section in _rows(PPOConfig, ""):
        top = key.split(".")[0]
        if top != section:
            section = top
            lines += ["", f"## {section}", "", "| key | default | meaning |", "|---|---|---|"]
        if is_section and "." not in key:
            continue
        shown = "section" if is_section else f"`{default!r}`".replace("|", "\\|")
        lines.append(f"| `{key}` | {shown} | {comment.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")

"""The lowest versions pyproject.toml allows for rllava's direct dependencies and the extras the tests use, as pip
constraints `name==floor`, one a line: what `make test-floor` installs before its smoke subset of the tests. torch
stays the CPU wheel the Makefile installs (its declared floor is that release).

    python tests/floors.py [pyproject.toml] > floors.txt
"""

import re
import sys
import tomllib

EXTRAS = ("test", "accelerate")


def floors(path: str = "pyproject.toml") -> list[str]:
    with open(path, "rb") as f:
        project = tomllib.load(f)["project"]
    specs = project["dependencies"] + [s for e in EXTRAS for s in project["optional-dependencies"][e]]
    pins = {}
    for spec in specs:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([^,;\s]+).*", spec)
        if match is None:
            sys.exit(f"{path}: {spec!r} declares no floor (name>=version)")
        pins[match.group(1).lower()] = match.group(3)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


if __name__ == "__main__":
    print("\n".join(floors(*sys.argv[1:2])))

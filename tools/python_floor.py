"""Whether this Python meets the floor setup.cfg states (`python_requires`), said in one line before anything
is installed: the pins need that Python, and pip, given an older one, fails on the first pinned package that
has no build for it, not on the reason. The Makefile runs it first, so `make demo`, `make test` and CI stop here.

    python3 tools/python_floor.py [SETUP_CFG]

Written for any Python from 3.7 on, the old ones it refuses included.
"""

from __future__ import annotations

import configparser
import re
import sys


def main(argv: list[str]) -> str | None:
    """None where this Python meets the floor of setup.cfg (or of the file argv[1] names), else why not."""
    path = argv[1] if len(argv) > 1 else "setup.cfg"
    setup = configparser.ConfigParser()
    if not setup.read(path):
        return f"{path}: no such file"
    stated = setup.get("options", "python_requires", fallback="")
    floor = re.match(r">=(\d+)\.(\d+)$", stated)
    if not floor:
        return f"{path}: python_requires = {stated!r}: write the floor as >=MAJOR.MINOR"
    need = "{}.{}".format(*floor.groups())
    have = "{}.{}".format(*sys.version_info[:2])
    if sys.version_info[:2] < tuple(map(int, floor.groups())):
        return f"{sys.executable} is Python {have}; the pinned packages need {need} or later ({path}: {stated})"
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv))

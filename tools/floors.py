"""The floor of each of the package's requirements, as pins: `name==version` for each `name>=version` of
setup.cfg's install_requires (a pre-release tag dropped: torch>=2.8.0a0, which admits NVIDIA's 2.8.0a0+<commit>
builds, is torch==2.8.0 from the registry). The compat line of make test installs these, so the floors setup.cfg
states are the releases that line runs, and the Makefile keeps no list of its own.

    python3 tools/floors.py [SETUP_CFG]
"""

from __future__ import annotations

import configparser
import re
import sys


def floors(path: str) -> list[str]:
    setup = configparser.ConfigParser()
    if not setup.read(path):
        raise SystemExit(f"{path}: no such file")
    pins = []
    for line in setup.get("options", "install_requires").splitlines():
        floor = re.fullmatch(r"([A-Za-z0-9_.\-]+)>=([0-9.]+?)(?:a0)?", line.split("#")[0].strip())
        if floor:
            pins.append("{}=={}".format(*floor.groups()))
    return pins


if __name__ == "__main__":
    print("\n".join(floors(sys.argv[1] if len(sys.argv) > 1 else "setup.cfg")))

"""What a base (a container image, a uenv, a site's Python) already carries that installing the package on top must
keep, as pins for pip's -c: its torch, built for the site's GPUs and network, and its DeepSpeed where it has one
(the LUMI AI Factory's, its ops built for ROCm). Without them a requirement that another release satisfied better
would pull a second torch from the registry, one not built for the site. A base whose torch or DeepSpeed is below
setup.cfg's floor is refused here, in one line, before anything is installed.

    python tools/base_pins.py [SETUP_CFG] > base-pins.txt
    pip install --no-build-isolation -c base-pins.txt .

Run with the base's own Python, from the checkout. Exits 1 with one line where that Python has no torch, or a
release below the floor.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from floors import floors

KEPT = ("torch", "deepspeed")  # the base's own builds; the first is required
SETUP_CFG = Path(__file__).resolve().parents[1] / "setup.cfg"


def release(text: str) -> tuple[int, ...]:
    """A version's release numbers: 2.8.0a0+5228986c39 (an NGC build, a pre-release of 2.8.0) is (2, 8, 0)."""
    return tuple(map(int, re.match(r"\d+(?:\.\d+)*", text).group(0).split(".")))  # type: ignore[union-attr]


def pins(setup_cfg: Path = SETUP_CFG) -> list[str]:
    floor = {pin.split("==")[0]: pin.split("==")[1] for pin in floors(str(setup_cfg))}
    found = []
    for name in KEPT:
        try:
            have = version(name)
        except PackageNotFoundError:
            if name == KEPT[0]:
                raise SystemExit(f"{sys.executable} has no {name}: run this with the base's Python") from None
            continue
        if release(have) < release(floor[name]):
            raise SystemExit(
                f"the base's {name} {have} is below the floor {name}>={floor[name]} ({setup_cfg}): take a newer base "
                f"(containers/README.md)"
            )
        found.append(f"{name}=={have}")
    return found


if __name__ == "__main__":
    print("\n".join(pins(Path(sys.argv[1]) if len(sys.argv) > 1 else SETUP_CFG)))

"""Each encoder family's floor, read from the transformers wheels on PyPI: the first release whose wheel
defines the class the project loads for the family (`bert_squad.model.FAMILIES`).

    python tools/family_floors.py [--wheels DIR]

Bisects the releases `pip index versions transformers` lists (2.0.0 on, no pre-releases), fetching each
wheel it looks at with `pip download --no-deps` into DIR (kept: a second run downloads nothing), and
looks for `class <Name>(` in the wheel's Python files. A class, once shipped, stays in later releases:
that is what makes bisection valid. Prints a row per family and exits 1 where a floor differs from
FAMILIES, so the table in the code (and docs/models.md, checked against it by tests/test_docs.py) is
the wheels' word.
"""

import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional

from packaging.version import Version

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_squad.model import FAMILIES

OLDEST = Version("2.0.0")  # the first release named transformers (before it: pytorch-transformers)


def releases() -> list:
    """Every transformers release on the index from OLDEST on, oldest first."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "transformers"], capture_output=True, text=True, check=True
    ).stdout
    listed = re.search(r"Available versions: (.*)", out).group(1).split(", ")
    return sorted(v for v in map(Version, listed) if not v.is_prerelease and v >= OLDEST)


def wheel(version: Version, wheels: Path) -> Path:
    """The wheel of `version` in `wheels`, downloaded there first where it is not."""
    found = sorted(wheels.glob(f"transformers-{version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"transformers=={version}", "-d", str(wheels)],
            check=True,
        )
        found = sorted(wheels.glob(f"transformers-{version}-*.whl"))
    return found[0]


def defines(version: Version, name: str, wheels: Path) -> bool:
    """Whether the wheel of `version` defines class `name` in one of its Python files."""
    needle = f"class {name}(".encode()
    with zipfile.ZipFile(wheel(version, wheels)) as z:
        return any(needle in z.read(n) for n in z.namelist() if n.endswith(".py"))


def first_with(name: str, versions: list, wheels: Path) -> tuple:
    """(the first of `versions` whose wheel defines `name`, the release before it, whose wheel does not):
    (None, newest) where no release has it, (oldest, None) where the oldest has it."""
    lo, hi = 0, len(versions) - 1
    if not defines(versions[hi], name, wheels):
        return None, versions[hi]
    if defines(versions[lo], name, wheels):
        return versions[lo], None
    while hi - lo > 1:  # versions[lo] lacks it, versions[hi] has it
        mid = (lo + hi) // 2
        if defines(versions[mid], name, wheels):
            hi = mid
        else:
            lo = mid
    return versions[hi], versions[lo]


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheels", default="wheels-transformers", help="where the wheels are kept")
    args = p.parse_args(argv)
    wheels = Path(args.wheels)
    wheels.mkdir(parents=True, exist_ok=True)
    versions, found, wrong = releases(), {}, []
    for f in FAMILIES:
        if f.loads not in found:
            found[f.loads] = first_with(f.loads, versions, wheels)
        floor, before = found[f.loads]
        mark = "" if floor == Version(f.since) else f"  <- FAMILIES says {f.since}"
        wrong += [f.name] if mark else []
        lacking = f" ({before} lacks it)" if before else f" (the oldest, {OLDEST})" if floor else ""
        print(f"{f.name:<12} {f.loads:<32} {floor or 'in no release'}{lacking}{mark}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

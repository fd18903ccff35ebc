"""The venv is the pinned one (tests/README.md, "The pinned environment"): every distribution installed in it
is in the pins of its line (constraints.txt; constraints-compat.txt in the compat venv) at the pinned version,
and every pin is installed. A requirement added to setup.cfg without `make pins` fails here, named."""

import re
import sysconfig
from importlib import metadata

import pytest
from helpers import ROOT

pytestmark = pytest.mark.compat


def normalized(name):
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path):
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return {normalized(name): version for name, version in (line.split("==", 1) for line in lines)}


def test_the_venv_is_the_pinned_one():
    # The venv's own site-packages, not all of sys.path: setuptools, once imported, appends its vendored
    # distributions (jaraco.*, zipp, ...) to sys.path, and they were never installed.
    site_packages = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    installed = {normalized(d.metadata["Name"]): d.version for d in metadata.distributions(path=site_packages)}
    installed.pop("bert-squad")  # this checkout, installed editable
    path = ROOT / ("constraints.txt" if int(installed["transformers"].split(".")[0]) >= 5 else "constraints-compat.txt")
    pinned = pins(path)
    unpinned = sorted(set(installed) - set(pinned))
    assert not unpinned, f"installed but not in {path.name}: {unpinned} (run make pins)"
    missing = sorted(set(pinned) - set(installed))
    assert not missing, f"pinned in {path.name} but not installed: {missing}"
    moved = {name: (pinned[name], version) for name, version in installed.items() if version != pinned[name]}
    assert not moved, f"(pinned, installed) versions differ from {path.name}: {moved}"

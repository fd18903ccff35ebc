"""The venv is the pinned one (tests/README.md, "The pinned environment"): every distribution installed in it
is in the pins of its line (constraints.txt; constraints-compat.txt in the compat venv) at the pinned version,
and every pin is installed. A requirement added to setup.cfg without `make pins` fails here, named. And the
Python floor setup.cfg states is the one those pins need."""

import configparser
import re
import sys
import sysconfig
from importlib import metadata

import pytest
from helpers import ROOT, run_in_checkout
from packaging.specifiers import SpecifierSet

pytestmark = pytest.mark.compat


def normalized(name):
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path):
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return {normalized(name): version for name, version in (line.split("==", 1) for line in lines)}


def installed_distributions():
    """{normalized name: distribution} of the venv's own site-packages, not all of sys.path: setuptools, once
    imported, appends its vendored distributions (jaraco.*, zipp, ...) to sys.path, and they were never
    installed. This checkout, installed editable, is left out."""
    site_packages = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    found = {normalized(d.metadata["Name"]): d for d in metadata.distributions(path=site_packages)}
    found.pop("bert-squad")
    return found


def test_the_venv_is_the_pinned_one():
    installed = {name: d.version for name, d in installed_distributions().items()}
    path = ROOT / ("constraints.txt" if int(installed["transformers"].split(".")[0]) >= 5 else "constraints-compat.txt")
    pinned = pins(path)
    unpinned = sorted(set(installed) - set(pinned))
    assert not unpinned, f"installed but not in {path.name}: {unpinned} (run make pins)"
    missing = sorted(set(pinned) - set(installed))
    assert not missing, f"pinned in {path.name} but not installed: {missing}"
    moved = {name: (pinned[name], version) for name, version in installed.items() if version != pinned[name]}
    assert not moved, f"(pinned, installed) versions differ from {path.name}: {moved}"


def test_the_python_floor_is_the_one_the_pins_need():
    """setup.cfg's python_requires (which README states) is the oldest Python every pinned package has a build
    for: each installed distribution's Requires-Python (its METADATA, as pip reads it) takes the floor, and
    the Python before it is refused by at least one of them, so the floor says what the pins need."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    stated = setup["options"]["python_requires"]
    major, minor = map(int, re.fullmatch(r">=(\d+)\.(\d+)", stated).groups())
    requires = {
        name: SpecifierSet(d.metadata["Requires-Python"] or "") for name, d in installed_distributions().items()
    }
    refusing = sorted(name for name, spec in requires.items() if f"{major}.{minor}.0" not in spec)
    assert not refusing, f"no build for Python {major}.{minor} (setup.cfg: {stated}): {refusing}"
    older = sorted(name for name, spec in requires.items() if f"{major}.{minor - 1}.99" not in spec)
    assert older, f"every pin takes Python {major}.{minor - 1} too: setup.cfg's python_requires could say so"
    for where in ("README.md", ".ci/run"):
        assert f"Python {major}.{minor} or later" in (ROOT / where).read_text(), f"{where} states another floor"


def test_an_older_python_is_refused_in_one_line_before_any_install(tmp_path):
    """The Makefile's first step (tools/python_floor.py) against a floor above this Python: one line naming it
    and the file, exit 1; against setup.cfg's own floor, this Python passes."""
    (tmp_path / "setup.cfg").write_text("[options]\npython_requires = >=3.99\n")
    refused = run_in_checkout(sys.executable, "tools/python_floor.py", tmp_path / "setup.cfg", timeout=60)
    have = "{}.{}".format(*sys.version_info[:2])
    assert refused.returncode == 1 and refused.stderr == (
        f"{sys.executable} is Python {have}; the pinned packages need 3.99 or later ({tmp_path}/setup.cfg: >=3.99)\n"
    )
    assert run_in_checkout(sys.executable, "tools/python_floor.py", timeout=60).returncode == 0
    assert "\t@python3 tools/python_floor.py" in (ROOT / "Makefile").read_text().split("\tpython3 -m venv")[0]

#!/usr/bin/env python
"""The wheels an offline GPU host lacks for the project (CPython 3.12, manylinux x86_64), and the check that
they resolve there: what `make gpu-kit` runs.

    python bench/gpu_kit.py --out gpu-kit       # build the kit, then check it
    python bench/gpu_kit.py --check gpu-kit     # check a kit

Which wheels: the project's requirements, followed through this environment's installed metadata, less
what the host can be relied on for: a package bench/gpu_host.txt (the host's own `pip list`) gives at a version
that meets the requirement. Everything else is carried (`carried`): what the host lacks, and what it holds at
a version a requirement refuses; the kit's folder comes first on the host's path. Each is pinned to the
version installed here, the one the test suite ran against, and fetched as PyPI's wheel for the host's
platform; a package that publishes only an sdist (DeepSpeed, python-hostlist) is built here into a
pure-Python wheel (DeepSpeed with DS_BUILD_OPS=0: no compiled ops, which the shipped configs do not use). The
project's own wheel comes last, and beside the wheels BERT's uncased tokenizer (tokenizer/), for the random
BERT-base that bench/gpu_check.py measures. The kit stays within KIT_MAX_MIB, and with the checkout it
travels beside within MAX_MIB.

The check resolves the project with pip for Python 3.12 on the host's platform from the kit and stand-ins
for the host's packages only (metadata-only wheels at the versions bench/gpu_host.txt gives), with no index:
every requirement must be met by the kit or by the host.
"""

import argparse
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
HOST_FILE = ROOT / "bench" / "gpu_host.txt"
PROJECT = "bert_squad"
# The host: CPython 3.12 on manylinux x86_64 (glibc 2.28 or newer).
TARGET = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
PLATFORM = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64") for a in ("--platform", p)],
]
MAX_MIB = 64  # what the GPU host's runner takes of the working tree and the kit together
KIT_MAX_MIB = 16  # the kit alone: what the host lacks, no package it already holds at a usable version
TOKENIZER = "tokenizer"  # a folder of the kit beside the wheels


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def read_versions(text: str) -> dict:
    """{normalised name: version} from NAME==VERSION lines: bench/gpu_host.txt, or the output of `pip list
    --format=freeze`; comments and any other line (pip's warnings) are passed over."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(\S+)", line.split("#")[0].strip())
        if match:
            found[norm(match[1])] = match[2]
    return found


def host_packages(path=HOST_FILE):
    """{normalised name: version on the host} from bench/gpu_host.txt."""
    return read_versions(Path(path).read_text())


def requirements(dist, env=TARGET):
    """The requirements of an installed distribution (a name or an importlib.metadata Distribution) that apply
    on `env` (no extras asked for)."""
    reqs = [Requirement(r) for r in ((md.requires(dist) if isinstance(dist, str) else dist.requires) or [])]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def meets(req: Requirement, version: Optional[str]) -> bool:
    """Whether a distribution at `version` (None: absent) gives what `req` asks for."""
    return version is not None and req.specifier.contains(version, prereleases=True)


def unmet(site, host: dict) -> list:
    """What the distributions installed in `site` (the kit, first on the path) require and neither they nor the
    host's packages (`host`: {normalised name: version}, from its `pip list --format=freeze`) give, one line
    each: the check on the host itself, against its real versions, with the markers of the running Python."""
    kit = {norm(d.metadata["Name"]): d for d in md.distributions(path=[str(site)])}
    found = {**host, **{name: d.version for name, d in kit.items()}}
    lines = []
    for dist in kit.values():
        for req in requirements(dist, env={"extra": ""}):
            version = found.get(norm(req.name))
            if not meets(req, version):
                lines.append(f"{dist.metadata['Name']} needs {req}, finds {version or 'none'}")
    return sorted(lines)


def carried(req: Requirement, host: dict) -> bool:
    """Whether the kit must carry what `req` asks for: the host lacks it, or holds a version `req` refuses."""
    return not meets(req, host.get(norm(req.name)))


def kit_packages(host):
    """{name: version} of every package the project needs that the host cannot be relied on for, at the
    version installed here."""
    needed, todo = {}, [Requirement(PROJECT)]
    while todo:
        req = todo.pop()
        if norm(req.name) in needed or not (norm(req.name) == norm(PROJECT) or carried(req, host)):
            continue
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            sys.exit(f"gpu-kit: {req} is needed but not installed here: install the project first (make)")
        if version not in req.specifier:
            sys.exit(f"gpu-kit: {req} is needed, but {req.name} {version} is installed here")
        needed[norm(req.name)] = version
        todo += requirements(req.name)
    del needed[norm(PROJECT)]
    return needed


def pip(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pip", *args], env=env, capture_output=True, text=True)


def fetch(name, version, out):
    """PyPI's wheel for the host, or one built here from the sdist, which must come out pure Python."""
    spec = f"{name}=={version}"
    if pip("download", "-q", "--no-deps", *PLATFORM, "-d", out, spec).returncode == 0:
        return
    build = pip(
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--no-binary",
        name,
        "-w",
        out,
        spec,
        env=dict(os.environ, DS_BUILD_OPS="0"),
    )
    if build.returncode != 0:
        sys.exit(f"gpu-kit: {spec} has no wheel for the host and its sdist did not build:\n{build.stderr[-2000:]}")
    made = [w.name for w in Path(out).glob("*.whl") if norm(w.name.split("-")[0]) == norm(name)]
    if not made or not all(w.endswith("-py3-none-any.whl") for w in made):
        sys.exit(f"gpu-kit: {spec} built from its sdist as {made}, not one pure-Python wheel")


def build(out):
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    shutil.rmtree(out / TOKENIZER, ignore_errors=True)
    for name, version in sorted(kit_packages(host_packages()).items()):
        print(f"gpu-kit: {name}=={version}", flush=True)
        fetch(name, version, out)
    made = pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, ROOT)
    if made.returncode != 0:
        sys.exit(f"gpu-kit: the project's wheel did not build:\n{made.stderr[-2000:]}")
    # BERT's uncased vocabulary (MiniLM-L6's tokenizer) for the random BERT-base of bench/gpu_check.py: no hub there
    from throughput import minilm_dir
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(out / TOKENIZER)


def stub_wheel(folder, name, version):
    """A wheel of metadata only: stands for a package the host already has, at its version."""
    stem = f"{re.sub(r'[-.]+', '_', name)}-{version}"
    files = {
        f"{stem}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{stem}.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{stem}.dist-info/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{stem}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(Path(folder) / f"{stem}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def checkout_mib() -> float:
    """The checkout's tracked files, which travel to the host beside the kit."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True)
    files = (ROOT / f for f in listed.stdout.split("\0") if f)
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink()) / 2**20


def check(kit):
    """Resolve the project for the host from the kit and the host's packages only; one line per package."""
    kit, host = Path(kit), host_packages()
    wheels = {norm(w.name.split("-")[0]) for w in kit.glob("*.whl")}
    with tempfile.TemporaryDirectory() as stubs:
        for name, version in host.items():
            if name not in wheels:  # the kit's copy shadows the host's
                stub_wheel(stubs, name, version)
        cmd = [
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-index",
            "--find-links",
            str(kit),
            "--find-links",
            stubs,
            *PLATFORM,
            "--report",
            "-",
            "--quiet",
            PROJECT,
        ]
        print("$ pip", " ".join(cmd).replace(stubs, "<host stand-ins>"), flush=True)
        r = pip(*cmd)
        if r.returncode != 0:
            sys.exit(f"gpu-kit: the kit does not resolve for the host:\n{r.stderr[-3000:]}")
    chosen = {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(r.stdout)["install"]}
    for name, version in sorted(chosen.items()):
        print(f"  {name}=={version}  ({'kit' if name in wheels else 'host'})")
    unused = wheels - set(chosen)
    size, tree = sum(f.stat().st_size for f in kit.rglob("*") if f.is_file()) / 2**20, checkout_mib()
    print(
        f"gpu-kit: {len(wheels)} wheels, {size:.1f} MiB (with the checkout's {tree:.1f} MiB: {size + tree:.1f}); "
        f"resolves for CPython 3.12 manylinux x86_64{'; unused: ' + ', '.join(sorted(unused)) if unused else ''}"
    )
    if unused or size > KIT_MAX_MIB or size + tree >= MAX_MIB:
        sys.exit(
            f"gpu-kit: a kit must hold only what resolves, within {KIT_MAX_MIB} MiB, and with the checkout stay "
            f"under {MAX_MIB} MiB"
        )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, help="build the kit into this folder, then check it")
    g.add_argument("--check", type=Path, help="only check the kit in this folder")
    args = p.parse_args()
    if args.out:
        build(args.out)
    check(args.out or args.check)


if __name__ == "__main__":
    main()

"""The container test image and what the tests learn from inside it, shared by the Charliecloud and the
Container Engine tests: the machine's Debian minbase image (built once, cached outside the checkout), a
sitecustomize that makes every rank's python record where it ran, the tiny run they train, and the
one-process evaluation outside any container that its predictions are held to."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import standin_runtime
from helpers import ROOT, inference_args, run_bert_squad
from slurm_jobs import JOB_WINDOWS, job_train_args

BUILD = ROOT / "tests" / "charliecloud_image.sh"
MARKER = "/etc/bert-squad-ch-test-image"  # a file only the image has
MARKER_TEXT = "bert-squad Charliecloud test image"  # how it begins

# What the probe records of a process's environment: the stand-in runtimes' variables and the container's own.
PROBED_ENV = [
    *standin_runtime.RECORDED_ENV,
    "TMPDIR",
    "HOME",
    "USER",
    "CH_RUNNING",
    "BERT_SQUAD_IMAGE_ENV",
    "CUDA_VISIBLE_DEVICES",
    "BERT_SQUAD_EDF_ENV",
    "BERT_SQUAD_ENTRYPOINT",
    "BERT_SQUAD_UNSET",
]
PROBE = f'''\
import json, os
_argv = open("/proc/self/cmdline", "rb").read().split(b"\\0")
if b"bert_squad" in _argv and b"check-cache" not in _argv and os.environ.get("CH_PROBE_DIR"):
    try:
        _marker = open("{MARKER}").read()
    except OSError:
        _marker = None
    _root = [l.split() for l in open("/proc/self/mountinfo") if l.split()[4] == "/"][-1]
    _fstype = _root[_root.index("-") + 1]
    with open(f"/proc/{{os.getppid()}}/comm") as _f:
        _parent = _f.read().strip()
    _names = {PROBED_ENV!r}
    with open(os.path.join(os.environ["CH_PROBE_DIR"], f"{{os.getpid()}}.json"), "w") as _f:
        json.dump({{"marker": _marker, "root_fs": _fstype, "parent": _parent,
                   "env": {{k: os.environ.get(k) for k in _names}}}}, _f)
'''


def squash(root: Path, image: Path, timeout: int = 1200) -> Path:
    """`root` as one SquashFS file `image`, uncompressed and on one core (the same machine runs other tests);
    skips, saying what to install, without mksquashfs."""
    mksquashfs = shutil.which("mksquashfs") or shutil.which("mksquashfs", path="/usr/sbin:/sbin")
    if mksquashfs is None:
        pytest.skip("mksquashfs is not installed (apt-get install squashfs-tools, or `make system-deps`)")
    options = ["-noappend", "-quiet", "-no-progress", "-noI", "-noD", "-noF", "-noX", "-processors", "1"]
    subprocess.run([mksquashfs, str(root), str(image), *options], check=True, capture_output=True, timeout=timeout)
    return image


def interpreter_dirs():
    """The venv and the Python it was made from: bound into the image at their own paths."""
    return sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)})


def cached_image(*tools):
    """The machine's Debian minbase test image directory (charliecloud_image.sh builds it once), or skip;
    `tools` are what the caller runs it with."""
    if os.geteuid() != 0:
        pytest.skip("the test image is built with debootstrap, which needs root")
    for tool in ("debootstrap", *tools):
        if not shutil.which(tool) and not shutil.which(tool, path="/usr/sbin:/sbin"):
            pytest.skip(f"{tool} is not installed (`make system-deps` installs it)")
    env = {**os.environ, "PATH": f"{os.environ['PATH']}:/usr/sbin:/sbin"}
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def probe_env(scratch):
    """The variables that make every rank's python leave a record in <scratch>/probes (see PROBE)."""
    probe_code = scratch / "probe-code"
    probe_code.mkdir(exist_ok=True)
    (probe_code / "sitecustomize.py").write_text(PROBE)
    probes = scratch / "probes"
    probes.mkdir(exist_ok=True)
    (scratch / "cache").mkdir(exist_ok=True)
    return {"PYTHONPATH": str(probe_code), "CH_PROBE_DIR": str(probes)}


def probes(scratch):
    return [json.loads(p.read_text()) for p in sorted((scratch / "probes").glob("*.json"))]


DEV = "bert_squad/sample/dev-v1.1.json"  # the jobs' dev file, in the checkout


def ch_train_args(model, out, *more):
    """The containers' jobs' training of `model` on the sample (paths in the checkout, which the containers
    mount), evaluated on the sample's dev file; then `more`."""
    return job_train_args(model, "bert_squad/sample/train-v1.1.json", out, "--eval-file", DEV, *more)


def assert_predictions_of_one_process(out, tmp_path):
    """The containers' 2-rank evaluation (ch_train_args) gave the predictions that one process outside any
    container gives on the model they exported."""
    outside = tmp_path / "outside"
    r = run_bert_squad(
        *inference_args("evaluate", out, DEV, outside, cache=tmp_path / "cache-outside", windows=JOB_WINDOWS)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (outside / "predictions.json").read_bytes() == (out / "predictions.json").read_bytes()

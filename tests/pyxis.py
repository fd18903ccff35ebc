"""Enroot + Pyxis in a real local Slurm, for tests/test_pyxis.py.

`pyxis_cluster` (session fixture): a single-node Slurm like slurm_cluster.py's, whose plugstack loads Pyxis
and whose slurmd has the Enroot build first on its PATH (Pyxis runs the `enroot` it finds there). Both are
built from third_party/ by tests/pyxis_build.sh, once per machine. The node has 4 GPUs as GRES, backed
by device nodes that no driver serves, so `--gpus-per-task=1` gives each rank its own CUDA_VISIBLE_DEVICES
as on a GH200 node. Enroot keeps its containers under the session folder (XDG_* in the jobs' environment,
which Pyxis passes to Enroot), so sessions on one machine do not meet.

`pyxis_image` (session fixture): the Charliecloud tests' Debian minbase image squashed into a .sqsh.
`edf_to_pyxis`: a CSCS Container Engine EDF as the Pyxis flags that mean the same, key by key.
"""

import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT
from slurm_cluster import make_root, require_slurm, single_node, slurm_conf
from images import cached_image

BUILD = ROOT / "tests" / "pyxis_build.sh"
GPUS = 4  # a GH200 node's
NVIDIA_MAJOR = 195  # the character-device major of /dev/nvidiaN


def pyxis_prefix():
    """Enroot and Pyxis built from third_party/ (tests/pyxis_build.sh, once per machine), or skip saying why."""
    require_slurm()
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"user and mount namespaces are not permitted here, and Enroot needs them: {probe.stderr.strip()}")
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=900)
    if proc.returncode == 2:  # a build dependency is missing: its one line says which
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def _gpu_devices(root):
    """GRES for GPUS GPUs: gres.conf naming device nodes (character devices of NVIDIA's major) of our own."""
    dev = root / "dev"
    dev.mkdir()
    for i in range(GPUS):
        os.mknod(dev / f"gpu{i}", 0o600 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
    (root / "gres.conf").write_text(f"Name=gpu File={dev}/gpu[0-{GPUS - 1}]\n")


@pytest.fixture(scope="session")
def pyxis_cluster(tmp_path_factory):
    prefix = pyxis_prefix()
    root = make_root(tmp_path_factory, "pyxis-slurm")
    host, cpus = socket.gethostname(), os.cpu_count()
    (root / "spool" / host).mkdir()
    _gpu_devices(root)
    (root / "plugstack.conf").write_text(f"required {prefix}/lib/slurm/spank_pyxis.so runtime_path={root}/pyxis\n")
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, host, cpus, nodes=[f"NodeName={host} CPUs={cpus} Gres=gpu:{GPUS} State=UNKNOWN"],
                          extra=f"PlugStackConfig={root}/plugstack.conf\nGresTypes=gpu\n"))
    enroot_dirs = {var: str(root / "enroot" / name) for var, name in
                   (("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache"), ("XDG_RUNTIME_DIR", "run"))}
    env = {**os.environ, "SLURM_CONF": str(conf), **enroot_dirs}
    with single_node(root, conf, env, daemon_env={**env, "PATH": f"{prefix}/bin:{os.environ['PATH']}"}) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def pyxis_image(tmp_path_factory):
    """The Charliecloud tests' image as one SquashFS file, uncompressed (a second on one core)."""
    cached = cached_image("mksquashfs")
    image = tmp_path_factory.mktemp("pyxis-image") / "debian.sqsh"
    mksquashfs = shutil.which("mksquashfs") or shutil.which("mksquashfs", path="/usr/sbin:/sbin")
    subprocess.run([mksquashfs, str(cached), str(image), "-noappend", "-quiet", "-no-progress", "-noI", "-noD", "-noF",
                    "-noX", "-processors", "1"], check=True, capture_output=True, timeout=300)
    return image


def edf_to_pyxis(edf):
    """(srun flags, environment) meaning what a parsed EDF means (cscs-docs container-engine/edf.md), key by
    key; the CE is Enroot + Pyxis with EDF parsing. `annotations` drive the CE's own hooks (NCCL plugin,
    CXI), which upstream Pyxis does not have: they are left out. Keys with no Pyxis equivalent fail."""
    flags, env = [], {}
    for key, value in edf.items():
        if key == "image":
            flags.append(f"--container-image={value}")
        elif key == "mounts":
            flags.append(f"--container-mounts={','.join(value)}")
        elif key == "workdir":
            flags.append(f"--container-workdir={value}")
        elif key == "env":  # Pyxis sets the named variables from the task's environment, before the image's
            env.update(value)
            flags.append(f"--container-env={','.join(value)}")
        elif key == "writable":
            flags.append("--container-writable" if value else "--container-readonly")
        elif key == "entrypoint":
            flags.append("--container-entrypoint" if value else "--no-container-entrypoint")
        elif key != "annotations":
            raise ValueError(f"EDF key {key!r} has no Pyxis flag")
    return flags, env


def merged(flags):
    """srun options with each Pyxis list option once: srun keeps only the last of a repeated
    --container-mounts or --container-env, so their values are joined (the job script does the same)."""
    lists, others = {"--container-mounts": [], "--container-env": []}, []
    for flag in flags:
        name, _, value = flag.partition("=")
        if name in lists:
            lists[name].append(value)
        else:
            others.append(flag)
    return [f"{name}={','.join(values)}" for name, values in lists.items() if values] + others

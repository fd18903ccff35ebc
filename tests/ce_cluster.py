"""What the EDF contract tests (tests/test_edf_contract.py) run on: a local Slurm whose node has GPUs
as a GH200 node does, the image as one SquashFS file, and `srun` as the CE extends it (tests/ce_srun.py).

`ce_cluster` (session fixture): a single-node Slurm like slurm_cluster.py's, whose node has 4 GPUs as GRES,
backed by device nodes that no driver serves, so `--gpus-per-task=1` gives each rank its own
CUDA_VISIBLE_DEVICES as on a GH200 node.
`ce_image` (session fixture): the Charliecloud tests' Debian minbase as the shipped images are (their
environment says offline, and they have an entrypoint), squashed into a .sqsh.
`ce_srun` (session fixture): tests/ce_srun.py as a job's `srun`, and the folder where it unpacks each step's
image, checked empty after every job and removed with the session.
"""

import os
import shutil
import socket
import stat
import subprocess
import sys

import pytest
from helpers import ROOT
from images import cached_image, squash
from slurm_cluster import clear_dead_clusters, make_root, require_slurm, single_node, slurm_conf

from bert_squad.runtime import OFFLINE_VARS as IMAGE_OFFLINE

GPUS = 4  # a GH200 node's
NVIDIA_MAJOR = 195  # the character-device major of /dev/nvidiaN
# The image's own environment and entrypoint (Enroot's /etc/environment and /etc/rc), which the tests find
# in the ranks: BERT_SQUAD_EDF_ENV is set again by the tests' EDF, whose value wins.
IMAGE_ENV = {**{name: "1" for name in IMAGE_OFFLINE}, "BERT_SQUAD_IMAGE_ENV": "offline", "BERT_SQUAD_EDF_ENV": "image"}
ENTRYPOINT = 'export BERT_SQUAD_ENTRYPOINT=ran\nexec "$@"\n'


def _gpu_devices(root):
    """GRES for GPUS GPUs: gres.conf naming device nodes (character devices of NVIDIA's major) of our own."""
    dev = root / "dev"
    dev.mkdir()
    for i in range(GPUS):
        os.mknod(dev / f"gpu{i}", 0o600 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
    (root / "gres.conf").write_text(f"Name=gpu File={dev}/gpu[0-{GPUS - 1}]\n")


@pytest.fixture(scope="session")
def ce_cluster(tmp_path_factory):
    require_slurm()
    clear_dead_clusters()
    root = make_root(tmp_path_factory, "slurm")
    host, cpus = socket.gethostname(), os.cpu_count()
    (root / "spool" / host).mkdir()
    _gpu_devices(root)
    conf = root / "slurm.conf"
    conf.write_text(
        slurm_conf(
            root,
            host,
            cpus,
            nodes=[f"NodeName={host} CPUs={cpus} Gres=gpu:{GPUS} State=UNKNOWN"],
            extra="GresTypes=gpu\n",
        )
    )
    with single_node(root, conf, {**os.environ, "SLURM_CONF": str(conf)}) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def ce_image(tmp_path_factory):
    """The image as one SquashFS file, uncompressed (a second on one core); removed with the session."""
    folder = tmp_path_factory.mktemp("ce-image")
    root = folder / "root"
    subprocess.run(
        ["cp", "-al", str(cached_image("ch-run", "mksquashfs", "unsquashfs")), str(root)], check=True, timeout=600
    )
    for name, text in (("environment", "".join(f"{k}={v}\n" for k, v in IMAGE_ENV.items())), ("rc", ENTRYPOINT)):
        path = root / "etc" / name
        path.unlink(missing_ok=True)  # a hard link into the cached image: replaced, not written through
        path.write_text(text)
    try:
        image = squash(root, folder / "image.sqsh", timeout=300)
        shutil.rmtree(root)
        yield image
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class CeSrun:
    """tests/ce_srun.py as a job's `srun` (REAL_SRUN: the real one), and the folder it unpacks steps in."""

    def __init__(self, folder):
        self.bin = folder / "bin"
        self.work = folder / "work"
        for path in (self.bin, self.work):
            path.mkdir()
        srun = self.bin / "srun"
        srun.write_text(f'#!/bin/sh\nexec {sys.executable} {ROOT}/tests/ce_srun.py "$@"\n')
        srun.chmod(0o755)

    def env(self, env):
        """`env` (a job's environment) with this srun first on its PATH."""
        return {
            **env,
            "PATH": f"{self.bin}:{env['PATH']}",
            "REAL_SRUN": shutil.which("srun"),
            "CE_SRUN_WORK": str(self.work),
        }

    def leftovers(self):
        """What the steps did not remove: each removes its copy of the image once its srun has ended."""
        return sorted(p.name for p in self.work.iterdir())


@pytest.fixture(scope="session")
def ce_srun(tmp_path_factory):
    """The session's CeSrun; its folder removed at the end, whatever a killed step left there."""
    folder = tmp_path_factory.mktemp("ce-srun")
    try:
        yield CeSrun(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

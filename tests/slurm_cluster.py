"""A real single-node Slurm for the tests: munged, slurmctld and slurmd from Debian, started as root.

`slurm_cluster` (session fixture) writes a slurm.conf in a temporary folder with free ports and its own
cluster name, so parallel test sessions on one machine do not meet; commands reach it through
SLURM_CONF. It skips with the reason when not root or the daemons are not installed
(`make system-deps` installs them). munged is a machine-wide service that other Slurm instances may
share, so when the fixture has to start it, it leaves it running.
"""

import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo", "scancel")
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _which(name):
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _munge_works():
    if not shutil.which("munge") or not shutil.which("unmunge"):
        return False
    enc = subprocess.run(["munge", "-n"], capture_output=True)
    return enc.returncode == 0 and subprocess.run(["unmunge"], input=enc.stdout, capture_output=True).returncode == 0


class SlurmCluster:
    """Handle on the running cluster: its environment, submission and job state."""

    def __init__(self, root, env):
        self.root = root
        self.env = env

    def run(self, *cmd, **kw):
        return subprocess.run(list(cmd), capture_output=True, text=True, env=kw.pop("env", self.env), **kw)

    def sbatch(self, script, options=(), script_args=(), env=None, cwd=None):
        """Submit; returns the job id. `env` adds to the cluster environment (sbatch exports it all)."""
        cmd = ["sbatch", "--parsable", *map(str, options), str(script), *map(str, script_args)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**self.env, **(env or {})}, cwd=cwd)
        assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id):
        """`scontrol show job` as a dict (JobState, ExitCode, StdOut, ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, job_id, timeout=900, states=FINISHED):
        deadline = time.time() + timeout
        while time.time() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(1)
        self.run("scancel", job_id)
        raise AssertionError(f"job {job_id} did not reach {sorted(states)} in {timeout}s: {self.job(job_id)}")


def _conf(root, host, cpus):
    return f"""\
ClusterName=bsq{uuid.uuid4().hex[:8]}
SlurmctldHost={host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# How long a requeued job waits before it may start again (default 120 s): short, so a requeue test resumes.
AuthInfo=cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=3600
KillWait=30
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmdSpoolDir={root}/spool
StateSaveLocation={root}/state
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a local Slurm needs root (slurmd runs jobs as their user); run the tests as root")
    missing = [n for n in DAEMONS + CLIENTS + ("munge", "unmunge") if not _which(n)]
    if missing:
        pytest.skip(f"Slurm/MUNGE not installed (missing {', '.join(missing)}): "
                    "apt-get install slurm-wlm munge, or `make system-deps`")
    if not _munge_works():
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", _which("munged")], check=True)
        for _ in range(50):
            if _munge_works():
                break
            time.sleep(0.1)
        else:
            pytest.skip("munged did not start (see /var/log/munge/munged.log)")
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("spool", "state"):
        (root / sub).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, socket.gethostname(), os.cpu_count()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = [subprocess.Popen([_which(d), "-D", "-f", str(conf), *extra], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for d, extra in (("slurmctld", ["-c", "-i"]), ("slurmd", []))]
    cluster = SlurmCluster(root, env)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            state = cluster.run("sinfo", "-h", "-N", "-o", "%T").stdout.strip()
            if state == "idle":
                break
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.5)
        else:
            state = "timeout"
        if state != "idle":
            logs = "\n".join((root / f).read_text()[-2000:] for f in ("slurmctld.log", "slurmd.log")
                             if (root / f).exists())
            pytest.fail(f"local Slurm did not come up (node state {state!r}):\n{logs}")
        yield cluster
    finally:
        for p in reversed(procs):
            _stop(p)

"""A real single-node Slurm for the tests: munged, slurmctld and slurmd from Debian, started as root.

`slurm_cluster` (session fixture) writes a slurm.conf in a temporary folder with free ports and its own
cluster name, so parallel test sessions on one machine do not meet; commands reach it through
SLURM_CONF. It skips with the reason when not root or the daemons are not installed
(`make system-deps` installs them). munged is a machine-wide service that other Slurm instances may
share, so when the fixture has to start it, it leaves it running.
"""

import contextlib
import fcntl
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


def _conf(root, host, cpus, ctld_addr=None, nodes=None, extra=""):
    """slurm.conf text. `nodes` (NodeName lines) replaces the one local node named `host`; `ctld_addr`
    is where clients and slurmds reach slurmctld (default: `host` resolved). `%n` in the slurmd paths
    is the node name, so several slurmds share one file."""
    ctld = f"{host}({ctld_addr})" if ctld_addr else host
    nodes = nodes or [f"NodeName={host} CPUs={cpus} State=UNKNOWN"]
    return f"""\
ClusterName=bsq{uuid.uuid4().hex[:8]}
SlurmctldHost={ctld}
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
SlurmdPidFile={root}/slurmd%n.pid
SlurmdSpoolDir={root}/spool/%n
StateSaveLocation={root}/state
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd%n.log
{extra}{chr(10).join(nodes)}
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


def require_slurm():
    """Skip unless root with Slurm and MUNGE installed; start munged when none answers.

    munged is a machine-wide service that other Slurm instances may share, so it is left running."""
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


def make_root(tmp_path_factory, name="slurm"):
    root = tmp_path_factory.mktemp(name)
    for sub in ("spool", "state"):
        (root / sub).mkdir()
    return root


def start_slurmctld(conf, env):
    return subprocess.Popen([_which("slurmctld"), "-D", "-f", str(conf), "-c", "-i"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_idle(cluster, procs, count=1, timeout=60):
    """Wait until sinfo shows `count` idle nodes; fail with the daemons' log tails otherwise."""
    deadline = time.time() + timeout
    states = []
    while time.time() < deadline:
        states = cluster.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()
        if states == ["idle"] * count:
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.5)
    logs = "\n".join(f"--- {f.name}\n{f.read_text()[-2000:]}" for f in sorted(cluster.root.glob("slurm*.log")))
    pytest.fail(f"local Slurm did not come up (node states {states!r}, "
                f"exited daemons {[p.args[:3] for p in procs if p.poll() is not None]}):\n{logs}")


@contextlib.contextmanager
def single_node(root, conf, env, daemon_env=None):
    """slurmctld and one slurmd on this host for `conf`; the cluster once its node is idle, the daemons
    stopped on the way out. `daemon_env`: the daemons' environment where it differs from the clients'."""
    daemon_env = daemon_env or env
    procs = [start_slurmctld(conf, daemon_env),
             subprocess.Popen([_which("slurmd"), "-D", "-f", str(conf)], env=daemon_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    cluster = SlurmCluster(root, env)
    try:
        wait_idle(cluster, procs)
        yield cluster
    finally:
        for p in reversed(procs):
            _stop(p)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    require_slurm()
    root = make_root(tmp_path_factory)
    host = socket.gethostname()
    (root / "spool" / host).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, host, os.cpu_count()))
    with single_node(root, conf, {**os.environ, "SLURM_CONF": str(conf)}) as cluster:
        yield cluster


# ---------------------------------------------------------------------------------------------------
# A real multi-node Slurm on this one machine: every node is a network namespace of its own with an
# address on a private bridge, and its slurmd runs there under its own UTS namespace (hostname = node
# name), so `hostname`, gloo and Open MPI in a job step see distinct hosts that talk over TCP.
# ---------------------------------------------------------------------------------------------------

PREFIX = "bsqmn"  # every namespace, link and process of this fixture carries it; leftovers are found by it
BRIDGE = f"{PREFIX}br"
HOSTS_BEGIN = f"# >>> {PREFIX}: bert_squad multinode test cluster (tests/slurm_cluster.py) >>>"
HOSTS_END = f"# <<< {PREFIX}: bert_squad multinode test cluster <<<"
LOCK = Path(f"/run/{PREFIX}.lock")
DEFAULT_SUBNET = "10.213.77"  # /24; .1 is the bridge (slurmctld), .11, .12, ... the nodes


def _ip(*args, check=True):
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _netns_pids(ns):
    out = _ip("netns", "pids", ns, check=False).stdout.split()
    return [int(p) for p in out if p.isdigit()]


def _kill_pids(pids, sig=9):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _our_daemons():
    """slurmctld/slurmd processes started with a slurm.conf under one of this fixture's folders."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]).decode(errors="replace") in ("slurmctld", "slurmd", "slurmstepd") \
                and any(f"/{PREFIX}".encode() in a for a in argv):
            found.append(int(entry.name))
    return found


def _edit_hosts(lines=()):
    """Replace this fixture's block of /etc/hosts by `lines` (none: remove it). Written in place:
    /etc/hosts may be a bind mount."""
    path = Path("/etc/hosts")
    kept, inside = [], False
    for line in path.read_text().splitlines():
        if line == HOSTS_BEGIN:
            inside = True
        elif line == HOSTS_END:
            inside = False
        elif not inside:
            kept.append(line)
    if lines:
        kept += [HOSTS_BEGIN, *lines, HOSTS_END]
    with open(path, "r+") as f:
        f.write("\n".join(kept) + "\n")
        f.truncate()


def cleanup_multinode():
    """Remove everything this fixture may have created, by its prefix: daemons and any process in
    its namespaces, the namespaces, links and bridge, and the /etc/hosts block. Safe to repeat."""
    namespaces = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines()
                  if line.startswith(PREFIX)]
    for ns in namespaces:
        _kill_pids(_netns_pids(ns))
    _kill_pids(_our_daemons())
    links = [m for m in re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", "show", check=False).stdout, re.M)
             if m.startswith(PREFIX)]
    for link in sorted(links, key=lambda name: name == BRIDGE):  # veths first, the bridge last
        _ip("link", "del", link, check=False)
    for ns in namespaces:
        _ip("netns", "del", ns, check=False)
    _edit_hosts()
    # Namespace and veth removal finishes asynchronously in the kernel.
    for _ in range(50):
        if PREFIX not in _ip("-o", "link", "show", check=False).stdout + _ip("netns", "list", check=False).stdout:
            break
        time.sleep(0.1)


class Node:
    def __init__(self, index, subnet):
        self.name = f"node{index}"
        self.addr = f"{subnet}.{10 + index}"
        self.netns = f"{PREFIX}-{self.name}"
        self.veth = f"{PREFIX}v{index}"
        self.proc = None

    def __repr__(self):
        return f"Node({self.name}, {self.addr}, {self.netns})"


class MultinodeCluster(SlurmCluster):
    """A SlurmCluster whose nodes are network namespaces; `nodes` in order node1, node2, ..."""

    def __init__(self, root, env, conf, nodes, subnet):
        super().__init__(root, env)
        self.conf = conf
        self.nodes = nodes
        self.subnet = subnet
        self.ctld_addr = f"{subnet}.1"

    def node(self, name):
        return next(n for n in self.nodes if n.name == name)

    def netns_cmd(self, name, *cmd):
        """argv running `cmd` in node `name`'s network namespace (with the host's hostname).

        nsenter, not `ip netns exec`: that one remounts /sys, which hides /sys/fs/cgroup, and slurmd
        refuses to start without it."""
        return ["nsenter", f"--net=/run/netns/{self.node(name).netns}", *cmd]

    def netns_run(self, name, *cmd, **kw):
        return self.run(*self.netns_cmd(name, *cmd), **kw)

    def start_node(self, name):
        node = self.node(name)
        _ip("link", "set", node.veth, "up")  # after kill_node(cut_link=True)
        (self.root / "spool" / name).mkdir(exist_ok=True)
        # nsenter, unshare and sh all exec: the Popen's pid is slurmd's.
        node.proc = subprocess.Popen(
            self.netns_cmd(name, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$1" -D -N "$0" -f "$2"',
                           name, _which("slurmd"), str(self.conf)),
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return node.proc

    def kill_node(self, name, cut_link=False):
        """SIGKILL every process in the node's namespace (slurmd, slurmstepd, ranks): a crash, whose
        kernel still closes the TCP connections. With `cut_link` the node's cable is pulled first, so
        its peers hear nothing at all (a power loss). start_node brings it back."""
        node = self.node(name)
        if cut_link:
            _ip("link", "set", node.veth, "down")
        pids = _netns_pids(node.netns)
        _kill_pids(pids)
        if node.proc is not None:
            node.proc.wait()
        return pids

    def node_states(self):
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        return dict(zip(out[0::2], out[1::2]))

    def wait_all_idle(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            states = self.node_states()
            if set(states.values()) == {"idle"} and len(states) == len(self.nodes):
                return
            time.sleep(0.5)
        raise AssertionError(f"nodes not idle after {timeout}s: {self.node_states()}")


@contextlib.contextmanager
def multinode_slurm(root, count=2, cpus=2, subnet=DEFAULT_SUBNET):
    """Start a `count`-node cluster in `root` (a fresh folder); tear it all down on the way out.

    Skips (pytest.skip) when not root, Slurm/MUNGE/ip/unshare are missing, network namespaces are not
    permitted, or another session holds the cluster."""
    require_slurm()
    missing = [n for n in ("ip", "unshare", "nsenter") if not _which(n)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: apt-get install iproute2 util-linux")
    if not 1 <= count <= 200:
        raise ValueError(f"node count {count}: 1 to 200")
    lock = open(LOCK, "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        pytest.skip(f"another test session runs the multinode cluster (it holds {LOCK})")
    procs = []
    try:
        cleanup_multinode()  # what a crashed earlier run left (we hold the lock: nobody else's)
        probe = f"{PREFIX}-probe"
        if _ip("netns", "add", probe, check=False).returncode != 0:
            pytest.skip("`ip netns add` is not permitted here (needs CAP_SYS_ADMIN and CAP_NET_ADMIN)")
        _ip("netns", "del", probe)
        nodes = [Node(i, subnet) for i in range(1, count + 1)]
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for node in nodes:
            _ip("netns", "add", node.netns)
            _ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
            _ip("link", "set", node.veth, "master", BRIDGE, "up")
            _ip("-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", "eth0")
            _ip("-n", node.netns, "link", "set", "eth0", "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
        _edit_hosts([f"{n.addr} {n.name}" for n in nodes])

        conf = root / "slurm.conf"
        # SlurmdTimeout: a node that stops answering is DOWN (and its jobs end) in seconds, not 5 minutes.
        conf.write_text(_conf(
            root, socket.gethostname(), cpus, ctld_addr=f"{subnet}.1",
            nodes=[f"NodeName={n.name} NodeAddr={n.addr} NodeHostname={n.name} CPUs={cpus} State=UNKNOWN"
                   for n in nodes],
            extra="SlurmdTimeout=20\n"))
        # Open MPI: its TCP traffic (the orted wire-up, oob, and the ranks' messages, btl) on the bridge
        # subnet only. A node's namespace has only lo and eth0, and Open MPI skips loopback for remote
        # peers, so mpirun and mpi4py across the nodes also work without these (checked); they keep it
        # that way on a machine with more interfaces. sbatch exports them to every job (and mpirun).
        env = {**os.environ, "SLURM_CONF": str(conf),
               "OMPI_MCA_btl": "tcp,self",
               "OMPI_MCA_btl_tcp_if_include": f"{subnet}.0/24",
               "OMPI_MCA_oob_tcp_if_include": f"{subnet}.0/24"}
        cluster = MultinodeCluster(root, env, conf, nodes, subnet)
        procs.append(start_slurmctld(conf, env))
        procs += [cluster.start_node(n.name) for n in nodes]
        wait_idle(cluster, procs, count=count)
        yield cluster
    finally:
        for p in reversed(procs):
            _stop(p)
        cleanup_multinode()
        lock.close()


@pytest.fixture(scope="session")
def multinode_cluster(tmp_path_factory):
    """A real Slurm of BERT_SQUAD_TEST_NODES (default 2) namespace nodes node1, node2, ...: see multinode_slurm."""
    count = int(os.environ.get("BERT_SQUAD_TEST_NODES", "2"))
    with multinode_slurm(make_root(tmp_path_factory, PREFIX), count=count) as cluster:
        yield cluster

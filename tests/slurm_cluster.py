"""A real single-node Slurm for the tests: munged, slurmctld and slurmd from Debian, started as root.

`slurm_cluster` (session fixture) writes a slurm.conf in a temporary folder with free ports, its own
cluster name and its own munged (key and socket), so parallel test sessions on one machine do not meet;
commands reach it through SLURM_CONF. It skips with the reason when not root or the daemons are not
installed (`make system-deps` installs them; a run that must run everything fails instead, conftest.py).

Everything a cluster starts carries its SLURM_CONF in its environment: the daemons, munged, slurmstepd and
every process of every job. That is how teardown finds what is left (`leftovers`) after it has cancelled
the jobs and stopped the daemons, whatever failed on the way in, and how a later session finds the
clusters of a session that died (`clear_dead_clusters`).
"""

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo", "scancel", "squeue")
FINISHED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}
OWNER = "owner.pid"  # in a cluster's folder: the pid of the test session that runs it
MUNGE_SOCKETS = Path("/run")  # munged wants every folder above its socket searchable by all: not pytest's tmp
# Held while a cluster's munged starts (its folder made, its socket not answering yet) and while the folders
# of sockets nothing answers on are cleared, which would otherwise take a starting one's folder.
MUNGE_LOCK = MUNGE_SOCKETS / "bsq-munge.lock"
MUNGE_LOCK_WAIT = 300  # a munged starts in seconds; a clearing takes less


def _which(name):
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


class SlurmCluster:
    """Handle on the running cluster: its environment, submission and job state."""

    def __init__(self, root, env):
        self.root = root
        self.env = env
        self.conf = root / "slurm.conf"

    def run(self, *cmd, **kw):
        return subprocess.run(
            list(cmd), capture_output=True, text=True, env=kw.pop("env", self.env), timeout=kw.pop("timeout", 120), **kw
        )

    def sbatch(self, script, options=(), script_args=(), env=None, cwd=None):
        """Submit; returns the job id. `env` adds to the cluster environment (sbatch exports it all)."""
        cmd = ["sbatch", "--parsable", *map(str, options), str(script), *map(str, script_args)]
        proc = self.run(*cmd, env={**self.env, **(env or {})}, cwd=cwd)
        assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id):
        """`scontrol show job` as a dict (JobState, ExitCode, StdOut, ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, job_id, timeout=900, states=FINISHED):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(1)
        self.run("scancel", job_id)
        raise AssertionError(f"job {job_id} did not reach {sorted(states)} in {timeout}s: {self.job(job_id)}")

    def cancel_all(self, timeout=120):
        """Cancel every job of this cluster and wait until the queue is empty (their processes gone)."""
        self.run("scancel", "--user", "root")
        deadline = time.monotonic() + timeout
        while (queue := self.run("squeue", "-h", "-o", "%i %T")).returncode == 0 and queue.stdout.strip():
            if time.monotonic() > deadline:
                return f"jobs still queued after {timeout}s: {queue.stdout.strip()}"
            time.sleep(0.5)
        return None


def slurm_conf(root, host, cpus, ctld_addr=None, nodes=None, extra=""):
    """slurm.conf text. `nodes` (NodeName lines) replaces the one local node named `host`; `ctld_addr`
    is where clients and slurmds reach slurmctld (default: `host` resolved). `%n` in the slurmd paths
    is the node name, so several slurmds share one file. The cluster's own munged listens at
    munge_socket(root) (`running` starts it). Job ids start at a random number: each job's rendezvous
    port comes from its id, and another test session's cluster on this machine must not hand out the
    same ids."""
    ctld = f"{host}({ctld_addr})" if ctld_addr else host
    nodes = nodes or [f"NodeName={host} CPUs={cpus} State=UNKNOWN"]
    return f"""\
ClusterName=bsq{uuid.uuid4().hex[:8]}
SlurmctldHost={ctld}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
FirstJobId={int(uuid.uuid4().int % 900_000) + 1000}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# How long a requeued job waits before it may start again (default 120 s): short, so a requeue test resumes.
AuthInfo=cred_expire=10,socket={munge_socket(root)}
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


def require_slurm():
    """Skip unless root with Slurm and MUNGE installed."""
    if os.geteuid() != 0:
        pytest.skip("a local Slurm needs root (slurmd runs jobs as their user); run the tests as root")
    missing = [n for n in DAEMONS + CLIENTS + ("munge", "unmunge") if not _which(n)]
    if missing:
        pytest.skip(
            f"Slurm/MUNGE not installed (missing {', '.join(missing)}): "
            "apt-get install slurm-wlm munge, or `make system-deps`"
        )


def make_root(tmp_path_factory, name="slurm"):
    root = tmp_path_factory.mktemp(name)
    for sub in ("spool", "state"):
        (root / sub).mkdir()
    (root / OWNER).write_text(f"{os.getpid()}\n")
    return root


_HELD = set()  # the locks this process holds (held)


@contextlib.contextmanager
def held(lock_path, timeout):
    """Hold an flock on `lock_path`, waiting while another live session holds it. A session that died
    holds nothing (the kernel drops its flock with its last descriptor), so its lock is simply taken;
    the file names the holder, for the message when the wait runs out. This session holding it already
    (its own cluster is up) is a failure, not a wait for itself."""
    if str(lock_path) in _HELD:
        pytest.fail(f"this session holds {lock_path} already: one holder at a time")
    with open(lock_path, "a+") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.seek(0)
                    holder = lock.read().strip()
                    pytest.fail(f"{lock_path} is still held after {timeout}s by {holder or 'an unnamed process'}")
                time.sleep(2)
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n")
        lock.flush()
        _HELD.add(str(lock_path))
        try:
            yield
        finally:
            _HELD.discard(str(lock_path))


# --- what a cluster leaves, and clusters whose session died --------------------------------------------


def _processes():
    """(pid, argv, environment) of every process, skipping those that vanish while read."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            yield int(entry.name), argv, environ


def leftovers(conf):
    """pids of the processes of the cluster configured by `conf`: all carry SLURM_CONF=<conf>."""
    mark = f"SLURM_CONF={conf}".encode()
    return [pid for pid, _, environ in _processes() if mark in environ and pid != os.getpid()]


def _kill_all(pids):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _owner_alive(folder):
    """Whether the session that made a cluster's folder still runs (no folder or no owner file: it died,
    or the folder was not made by this fixture, and then it is not ours to judge: alive)."""
    if not folder.is_dir():
        return False
    try:
        pid = int((folder / OWNER).read_text())
    except (OSError, ValueError):
        return True
    return Path(f"/proc/{pid}").exists()


def clear_dead_clusters():
    """Kill the processes of test clusters whose session died (crashed, or killed before its teardown), and
    remove their munge sockets: they would hold ports, cores and munged sockets forever."""
    dead = set()
    for pid, _, environ in _processes():
        confs = [
            Path(e[len(b"SLURM_CONF=") :].decode(errors="replace")) for e in environ if e.startswith(b"SLURM_CONF=")
        ]
        # make_root's folders: tmp_path_factory.mktemp("slurm") or ("bsqmn"), wherever the basetemp is
        if confs and confs[0].name == "slurm.conf" and re.fullmatch(rf"(slurm|{PREFIX})\d+", confs[0].parent.name):
            if not _owner_alive(confs[0].parent):
                dead.add(pid)
    _kill_all(dead)
    with held(MUNGE_LOCK, timeout=MUNGE_LOCK_WAIT):
        for folder in MUNGE_SOCKETS.glob("bsq-munge-*"):  # munge_socket's folders
            if folder.is_dir() and not _answers(folder / "munge.socket"):
                shutil.rmtree(folder, ignore_errors=True)


def _answers(unix_socket):
    """Whether a daemon listens on `unix_socket`. Asked of the socket itself, not read from /proc: a process
    this one cannot see (another user namespace) must not make a live cluster's socket look abandoned."""
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(unix_socket))
        except OSError:
            return False
    return True


# --- starting and stopping a cluster -------------------------------------------------------------------


def _stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=60)


def munge_socket(root):
    """Where the munged of the cluster in `root` listens: a folder of its own under /run."""
    return MUNGE_SOCKETS / f"bsq-munge-{hashlib.sha1(str(root).encode()).hexdigest()[:12]}" / "munge.socket"


def start_munged(root, env):
    """The cluster's own munged, with a fresh key: no machine-wide daemon is started or shared."""
    key = root / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    with held(MUNGE_LOCK, timeout=MUNGE_LOCK_WAIT):  # until its socket answers, no clearing takes its folder
        munge_socket(root).parent.mkdir(mode=0o755)
        proc = subprocess.Popen(
            [
                _which("munged"),
                "--foreground",
                f"--socket={munge_socket(root)}",
                f"--key-file={key}",
                f"--pid-file={root}/munged.pid",
                f"--seed-file={root}/munged.seed",
                f"--log-file={root}/munged.log",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not _answers(munge_socket(root)) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    return proc


def start_slurmctld(conf, env):
    return subprocess.Popen(
        [_which("slurmctld"), "-D", "-f", str(conf), "-c", "-i"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_idle(cluster, procs, count=1, timeout=60):
    """Wait until sinfo shows `count` idle nodes; fail with the daemons' log tails otherwise."""
    deadline = time.monotonic() + timeout
    states = []
    while time.monotonic() < deadline:
        states = cluster.run("sinfo", "-h", "-N", "-o", "%T").stdout.split()
        if states == ["idle"] * count:
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.5)
    logs = "\n".join(f"--- {f.name}\n{f.read_text()[-2000:]}" for f in sorted(cluster.root.glob("*.log")))
    pytest.fail(
        f"local Slurm did not come up (node states {states!r}, "
        f"exited daemons {[p.args[:3] for p in procs if p.poll() is not None]}):\n{logs}"
    )


def stop_cluster(cluster, procs):
    """Cancel the jobs (while slurmctld runs), stop the daemons, kill whatever still carries the cluster's
    SLURM_CONF, remove the munge socket; then check that nothing is left."""
    ctld_runs = any(p.args[0] == _which("slurmctld") and p.poll() is None for p in procs)
    stuck = cluster.cancel_all() if ctld_runs else None
    for p in reversed(procs):
        _stop(p)
    deadline = time.monotonic() + 30
    while (left := leftovers(cluster.conf)) and time.monotonic() < deadline:
        _kill_all(left)
        time.sleep(0.2)
    shutil.rmtree(munge_socket(cluster.root).parent, ignore_errors=True)
    assert not left and not stuck, f"the test Slurm left {stuck or ''} processes {left}"


@contextlib.contextmanager
def running(cluster, start_slurmds, count=1, daemon_env=None):
    """munged, slurmctld and the slurmds `start_slurmds(cluster)` starts, until the `with` ends; stopped
    whatever happened, also when a daemon failed to start (stop_cluster). `daemon_env`: the daemons'
    environment where it differs from the clients' (it must keep SLURM_CONF)."""
    daemon_env = daemon_env or cluster.env
    procs = []
    try:
        procs.append(start_munged(cluster.root, daemon_env))
        procs.append(start_slurmctld(cluster.conf, daemon_env))
        procs += start_slurmds(cluster)
        wait_idle(cluster, procs, count=count)
        yield cluster
    finally:
        stop_cluster(cluster, procs)


@contextlib.contextmanager
def single_node(root, conf, env, daemon_env=None, slurmd_args=()):
    """munged, slurmctld and one slurmd on this host for `conf`; the cluster once its node is idle, all of it
    stopped on the way out. `slurmd_args` are added to slurmd's command line (the fixture's own test makes
    it fail with them)."""

    def slurmd(cluster):
        return [
            subprocess.Popen(
                [_which("slurmd"), "-D", "-f", str(conf), *slurmd_args],
                env=daemon_env or env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        ]

    cluster = SlurmCluster(root, env)
    cluster.conf = conf
    with running(cluster, slurmd, daemon_env=daemon_env):
        yield cluster


@contextlib.contextmanager
def local_slurm(root, slurmd_args=()):
    """A one-node cluster of this host in `root` (make_root), torn down on the way out."""
    require_slurm()
    clear_dead_clusters()
    host = socket.gethostname()
    (root / "spool" / host).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, host, os.cpu_count()))
    with single_node(root, conf, {**os.environ, "SLURM_CONF": str(conf)}, slurmd_args=slurmd_args) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    with local_slurm(make_root(tmp_path_factory)) as cluster:
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
LOCK_WAIT = 3600  # another session's multinode tests take minutes: wait for them rather than skip
DEFAULT_SUBNET = "10.213.77"  # /24; .1 is the bridge (slurmctld), .11, .12, ... the nodes


def _ip(*args, check=True):
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _netns_pids(ns):
    out = _ip("netns", "pids", ns, check=False).stdout.split()
    return [int(p) for p in out if p.isdigit()]


def multinode_processes():
    """Every process of a multinode cluster, this session's or a dead one's: its SLURM_CONF is in a folder
    of this fixture (daemons, munged, slurmstepd and the jobs' processes all carry it)."""
    mark = f"/{PREFIX}".encode()
    return [
        pid
        for pid, _, environ in _processes()
        if any(e.startswith(b"SLURM_CONF=") and mark in e for e in environ) and pid != os.getpid()
    ]


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
    namespaces = [
        line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.startswith(PREFIX)
    ]
    for ns in namespaces:
        _kill_all(_netns_pids(ns))
    _kill_all(multinode_processes())
    links = [
        m
        for m in re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", "show", check=False).stdout, re.M)
        if m.startswith(PREFIX)
    ]
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

    def start_node(self, name, slurmd_args=()):
        node = self.node(name)
        _ip("link", "set", node.veth, "up")  # after kill_node(cut_link=True)
        (self.root / "spool" / name).mkdir(exist_ok=True)
        # nsenter, unshare and sh all exec: the Popen's pid is slurmd's.
        node.proc = subprocess.Popen(
            self.netns_cmd(
                name,
                "unshare",
                "--uts",
                "sh",
                "-c",
                'hostname "$0" && slurmd=$1 conf=$2 && shift 2 && exec "$slurmd" -D -N "$0" -f "$conf" "$@"',
                name,
                _which("slurmd"),
                str(self.conf),
                *slurmd_args,
            ),
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return node.proc

    def kill_node(self, name, cut_link=False):
        """SIGKILL every process in the node's namespace (slurmd, slurmstepd, ranks): a crash, whose
        kernel still closes the TCP connections. With `cut_link` the node's cable is pulled first, so
        its peers hear nothing at all (a power loss). start_node brings it back."""
        node = self.node(name)
        if cut_link:
            _ip("link", "set", node.veth, "down")
        pids = _netns_pids(node.netns)
        _kill_all(pids)
        if node.proc is not None:
            node.proc.wait(timeout=60)
        return pids

    def node_states(self):
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        return dict(zip(out[0::2], out[1::2]))

    def wait_all_idle(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.node_states()
            if set(states.values()) == {"idle"} and len(states) == len(self.nodes):
                return
            time.sleep(0.5)
        raise AssertionError(f"nodes not idle after {timeout}s: {self.node_states()}")


def _network(nodes, subnet):
    """The bridge, each node's namespace and veth pair, and the nodes' names in /etc/hosts."""
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


@contextlib.contextmanager
def multinode_slurm(root, count=2, cpus=2, subnet=DEFAULT_SUBNET, slurmd_args=()):
    """Start a `count`-node cluster in `root` (make_root); tear it all down on the way out, also when it
    fails half-way. `slurmd_args` are added to every slurmd's command line (the fixture's own test makes
    them fail with them).

    Skips (pytest.skip) when not root, Slurm/MUNGE/ip/unshare are missing, or network namespaces are not
    permitted; waits while another session runs its cluster."""
    require_slurm()
    missing = [n for n in ("ip", "unshare", "nsenter") if not _which(n)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: apt-get install iproute2 util-linux")
    if not 1 <= count <= 200:
        raise ValueError(f"node count {count}: 1 to 200")
    with held(LOCK, timeout=LOCK_WAIT):
        try:
            cleanup_multinode()  # what a crashed earlier run left (we hold the lock: nobody else's)
            clear_dead_clusters()
            probe = f"{PREFIX}-probe"
            if _ip("netns", "add", probe, check=False).returncode != 0:
                pytest.skip("`ip netns add` is not permitted here (needs CAP_SYS_ADMIN and CAP_NET_ADMIN)")
            _ip("netns", "del", probe)
            nodes = [Node(i, subnet) for i in range(1, count + 1)]
            _network(nodes, subnet)
            conf = root / "slurm.conf"
            # SlurmdTimeout: a node that stops answering is DOWN (and its jobs end) in seconds, not 5 minutes.
            conf.write_text(
                slurm_conf(
                    root,
                    socket.gethostname(),
                    cpus,
                    ctld_addr=f"{subnet}.1",
                    extra="SlurmdTimeout=20\n",
                    nodes=[
                        f"NodeName={n.name} NodeAddr={n.addr} NodeHostname={n.name} CPUs={cpus} State=UNKNOWN"
                        for n in nodes
                    ],
                )
            )
            # Open MPI: its TCP traffic (the orted wire-up, oob, and the ranks' messages, btl) on the bridge
            # subnet only. A node's namespace has only lo and eth0, and Open MPI skips loopback for remote
            # peers, so mpirun and mpi4py across the nodes also work without these (checked); they keep it
            # that way on a machine with more interfaces. sbatch exports them to every job (and mpirun).
            env = {
                **os.environ,
                "SLURM_CONF": str(conf),
                "OMPI_MCA_btl": "tcp,self",
                "OMPI_MCA_btl_tcp_if_include": f"{subnet}.0/24",
                "OMPI_MCA_oob_tcp_if_include": f"{subnet}.0/24",
            }
            cluster = MultinodeCluster(root, env, conf, nodes, subnet)
            with running(cluster, lambda c: [c.start_node(n.name, slurmd_args) for n in nodes], count=count):
                yield cluster
        finally:
            cleanup_multinode()


def node_count():
    """BERT_SQUAD_TEST_NODES, the multinode cluster's size (default 2), or a failure naming its value."""
    value = os.environ.get("BERT_SQUAD_TEST_NODES", "2")
    if not value.isdigit() or not 1 <= int(value) <= 200:
        pytest.fail(f"BERT_SQUAD_TEST_NODES={value}: a node count from 1 to 200", pytrace=False)
    return int(value)


@pytest.fixture(scope="session")
def multinode_cluster(tmp_path_factory):
    """A real Slurm of BERT_SQUAD_TEST_NODES (default 2) namespace nodes node1, node2, ...: see multinode_slurm."""
    with multinode_slurm(make_root(tmp_path_factory, PREFIX), count=node_count()) as cluster:
        yield cluster

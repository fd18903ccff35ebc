"""The test clusters' own lifecycle (tests/slurm_cluster.py): a cluster that fails half-way leaves no
daemon, job, namespace, link, munge socket or /etc/hosts line behind; the processes of a session that
died are cleared by the next one; a lock whose holder died is taken, one held by a live process waited for.
Ranks started by hand that do not end are reported each with its output and what holds their port."""

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import slurm_cluster as sc
from helpers import PYTHON, Started, ranks_by_hand, wait_ranks


def _fails_to_start(start):
    """Run `start` (a cluster context) with a slurmd that cannot start; the failure it reports."""
    with pytest.raises(pytest.fail.Exception) as failed:
        with start:
            raise AssertionError("the cluster came up with a slurmd that cannot start")
    return str(failed.value)


@pytest.mark.slurm
def test_a_slurmd_that_fails_to_start_leaves_nothing(tmp_path_factory):
    root = sc.make_root(tmp_path_factory)
    message = _fails_to_start(sc.local_slurm(root, slurmd_args=["-N", "nosuchnode"]))
    assert 'lookup failure for node "nosuchnode"' in message, message  # slurmd's own reason, in its log
    conf = root / "slurm.conf"
    assert sc.leftovers(conf) == []  # munged and slurmctld were up; neither is left
    assert not sc.munge_socket(root).parent.exists()


@pytest.mark.slurm
@pytest.mark.multinode
def test_a_multinode_cluster_that_fails_half_way_leaves_nothing(tmp_path_factory):
    root = sc.make_root(tmp_path_factory, sc.PREFIX)
    message = _fails_to_start(sc.multinode_slurm(root, slurmd_args=["-N", "nosuchnode"]))
    assert 'lookup failure for node "nosuchnode"' in message, message
    conf = root / "slurm.conf"
    assert sc.leftovers(conf) == [] and sc.multinode_processes() == []
    assert not sc.munge_socket(root).parent.exists()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=60).stdout
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=60).stdout
    assert sc.PREFIX not in links and sc.PREFIX not in namespaces, (links, namespaces)
    assert sc.HOSTS_BEGIN not in Path("/etc/hosts").read_text()


def _cluster_process(tmp_path_factory, owner_pid):
    """A stand-in for a cluster's daemon: a process carrying the SLURM_CONF of a cluster folder (as
    make_root makes them) owned by the session `owner_pid`."""
    folder = tmp_path_factory.mktemp("slurm")
    (folder / sc.OWNER).write_text(f"{owner_pid}\n")
    (folder / "slurm.conf").write_text("")
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={"SLURM_CONF": str(folder / "slurm.conf")}
    )


def _exited_pid():
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=60)
    return proc.pid


def test_processes_of_a_dead_session_are_cleared_and_a_live_ones_kept(tmp_path_factory):
    """What a crashed session's cluster left (its owner pid is gone) is killed by the next session; the
    cluster of a session that still runs (here: this one) is not touched."""
    dead = _cluster_process(tmp_path_factory, _exited_pid())
    alive = _cluster_process(tmp_path_factory, os.getpid())
    try:
        sc.clear_dead_clusters()
        assert dead.wait(timeout=30) == -9
        assert alive.poll() is None
    finally:
        for proc in (dead, alive):
            proc.kill()
            proc.wait(timeout=60)


def test_a_munge_socket_is_removed_only_when_nothing_answers_on_it():
    """A dead cluster's munge socket folder under /run goes; a live one stays, even where its munged is not
    visible in /proc (it is asked on the socket itself)."""
    import socket

    live, dead = (sc.MUNGE_SOCKETS / f"bsq-munge-fixture-test-{kind}-{os.getpid()}" for kind in ("live", "dead"))
    listening, gone = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    try:
        for folder, sock in ((live, listening), (dead, gone)):
            folder.mkdir()
            sock.bind(str(folder / "munge.socket"))
        listening.listen()
        gone.close()  # its socket file stays, with nothing behind it
        sc.clear_dead_clusters()
        assert live.exists() and not dead.exists()
    finally:
        listening.close()
        for folder in (live, dead):
            shutil.rmtree(folder, ignore_errors=True)


def test_clearing_waits_for_a_munged_that_is_starting(tmp_path):
    """A cluster's munge folder exists before its munged answers: a clearing (another session's) waits while
    the start holds the munge lock, so it cannot take a starting munged's folder; once the start is over
    (here: given up, nothing answers) the folder is a dead one's and goes."""
    folder = sc.MUNGE_SOCKETS / f"bsq-munge-fixture-test-starting-{os.getpid()}"
    hold = (
        f"import fcntl, time; f = open({str(sc.MUNGE_LOCK)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(600)"
    )
    clearing = threading.Thread(target=sc.clear_dead_clusters)
    try:
        with Started([sys.executable, "-c", hold], tmp_path / "starting") as starting:
            starting.wait_for("held", timeout=60)
            folder.mkdir()
            clearing.start()
            clearing.join(timeout=3)
            assert clearing.is_alive() and folder.exists()
        clearing.join(timeout=120)
        assert not clearing.is_alive() and not folder.exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_lock_whose_holder_died_is_taken(tmp_path):
    """A live holder is waited for (here 1 s) and named when the wait runs out; once it dies (killed, as a
    crash), the lock is taken at once."""
    lock = tmp_path / "cluster.lock"
    hold = (
        f"import fcntl, time; f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "f.write('pid 1234: another session'); f.flush(); print('held', flush=True); time.sleep(600)"
    )
    with Started([sys.executable, "-c", hold], tmp_path / "holder") as holder:
        holder.wait_for("held", timeout=60)
        with pytest.raises(pytest.fail.Exception, match="still held after 1s by pid 1234: another session"):
            with sc.held(lock, timeout=1):
                pass
    with sc.held(lock, timeout=30):
        assert lock.read_text().startswith(f"pid {os.getpid()}: ")


def test_every_subprocess_a_test_runs_has_a_deadline():
    """subprocess.run and its kin without `timeout=` would wait forever on a hung child;
    so would a bare Popen.wait()/communicate(). Started (conftest.py) is how a test runs a process it
    watches, killed by group on the way out."""
    import ast

    missing = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or any(k.arg == "timeout" for k in node.keywords):
                continue
            name = ast.unparse(node.func)
            waits = name.endswith((".wait", ".communicate")) and not node.args and name != "self.wait"
            if (
                name in ("subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output")
                or waits
            ):
                missing.append(f"{path.name}:{node.lineno} {name}")
    assert not missing, missing


def test_ranks_that_do_not_end_are_reported_each_with_their_port(tmp_path):
    """Rank 0 listens on the port and never ends, rank 1 ends: the report names each rank's state and output,
    and shows rank 0's socket listening on the port, with its process."""
    script = (
        "import os, socket, sys, time\n"
        "if os.environ['RANK'] == '0':\n"
        "    s = socket.socket(); s.bind(('127.0.0.1', int(os.environ['MASTER_PORT']))); s.listen()\n"
        "    print('rank 0 listening', flush=True); time.sleep(600)\n"
        "print('rank 1 done', file=sys.stderr)\n"
    )
    with ranks_by_hand([PYTHON, "-c", script], tmp_path) as (first, second):
        first.wait_for("rank 0 listening", timeout=60)
        with pytest.raises(AssertionError) as hung:
            wait_ranks([first, second], timeout=5)
        report = str(hung.value)
    assert "=== rank 0: running" in report and "rank 0 listening" in report, report
    assert "=== rank 1: exit 0" in report and "rank 1 done" in report, report
    listening = [line for line in report.splitlines() if line.startswith("LISTEN")]
    assert len(listening) == 1 and f"127.0.0.1:{first.port}" in listening[0] and "python" in listening[0], report

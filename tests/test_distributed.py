"""Rank layout from each launcher's variables; the process group's life under a real mpirun."""

import dataclasses
import json
import os
import subprocess
import textwrap
import threading
import time
from datetime import timedelta

import pytest
from helpers import MPIRUN, PYTHON, free_port, launcher_env

from bert_squad import distributed
from bert_squad.distributed import detect, job_port, mpirun_port, rendezvous, started_by_launcher
from bert_squad.errors import UserError


def test_single_process_defaults():
    d = detect({})
    assert (d.rank, d.world_size, d.local_rank, d.launcher, d.master_addr) == (0, 1, 0, "single", "127.0.0.1")


def test_open_mpi_single_node():
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "3",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    }
    d = detect(env)
    assert (d.rank, d.world_size, d.local_rank, d.launcher, d.master_addr, d.master_port) == (
        3,
        4,
        3,
        "mpirun",
        "127.0.0.1",
        29500,
    )


def test_open_mpi_multi_node_takes_first_slurm_host_and_job_port():
    env = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "SLURM_JOB_NODELIST": "nid[001234-001235]",
        "SLURM_JOB_ID": "4242",
    }
    d = detect(env)
    assert (d.rank, d.local_rank, d.master_addr, d.master_port) == (5, 1, "nid001234", job_port(4242))


def srun_task(rank, size, **step):
    """What srun gives task `rank` of a `size`-task step of job 4242, whose allocation is nid[001-002]."""
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_STEP_NUM_TASKS": str(size),
        "SLURM_LOCALID": str(rank),
        "SLURM_JOB_NODELIST": "nid[001-002]",
        "SLURM_JOB_ID": "4242",
        **step,
    }


def test_a_step_on_part_of_the_allocation_meets_on_its_own_first_node():
    """`srun -N1 -w nid002` inside a nid[001-002] job: the ranks meet on nid002, a host of their step, also
    behind the job template's RANK/WORLD_SIZE; without the step's node list (an older Slurm), on the job's."""
    step = {"SLURM_STEP_NODELIST": "nid002", "SLURM_STEP_ID": "1"}
    for env in (srun_task(1, 2, **step), {**srun_task(1, 2, **step), "RANK": "1", "WORLD_SIZE": "2"}):
        assert (detect(env).master_addr, detect(env).master_port) == ("nid002", job_port(4242, step=1))
    assert detect(srun_task(1, 2, SLURM_STEP_ID="1")).master_addr == "nid001"


def test_two_steps_of_one_job_meet_on_different_ports():
    """Steps 0 and 1 of job 4242 (a sweep packed into one allocation, or two sruns after salloc) on the same
    nodes, and the ranks of a launcher in the batch step (MPICH's mpiexec: no srun step, no PMIx namespace),
    meet apart."""
    ports = [detect(srun_task(0, 2, SLURM_STEP_ID=str(step))).master_port for step in (0, 1)]
    batch = {"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "nid[001-002]"}
    assert ports == [job_port(4242, step=0), job_port(4242, step=1)]
    assert detect(batch).master_port == job_port(4242) == 20000 + 8 * 4242 % 8000 not in ports


def test_a_jobs_runs_never_share_a_port_and_jobs_a_thousand_ids_apart_meet_apart():
    """The rule job_port documents, run by run: one job's batch step and steps 0-7998 each on a port of its own;
    over every job of a window of 1000 ids (a node's jobs at once), their batch steps and steps 0-6 too (8000
    runs); none on an ephemeral port nor on an mpirun's. Beyond its 8 keys a job's steps reach its neighbours':
    job j's step 7 is job j + 1's batch step, its step 8 job j + 1's step 0."""
    for job in (0, 4242, 852754433):
        ports = {job_port(job), *(job_port(job, step) for step in range(7999))}
        assert len(ports) == 8000 and min(ports) >= 20000 and max(ports) < 28000
        window = [(j, s) for j in range(job, job + 1000) for s in (None, *range(7))]
        assert len({job_port(j, s) for j, s in window}) == len(window) == 8000
    assert job_port(4242, 7999) == job_port(4242) and job_port(4242, 8000) == job_port(4242, 0)
    assert job_port(4242, 7) == job_port(4243) and job_port(4242, 8) == job_port(4243, 0)


def orte_namespace(host_hash, pid, job=1):
    """An Open MPI 4 mpirun's PMIx namespace as its plm_base_jobid.c forms it: the hash of its host name XOR
    its PID, folded to 16 bits, then the job's number in that mpirun (1 for the ranks it starts)."""
    folded = ((host_hash ^ pid) >> 16 ^ host_hash ^ pid) & 0xFFFF
    return str(folded << 16 | job)


# Four mpiruns started one after another on one host (Open MPI 4.1.4): (mpirun's PID, its ranks' PMIX_NAMESPACE).
SEEN = [(11731, "1093468161"), (11736, "1093009409"), (11741, "1092812801"), (11746, "1092354049")]


def test_the_mpiruns_of_one_host_meet_apart():
    """mpirun_port over namespaces as Open MPI forms them (the rule reproduces the four seen): the mpiruns of
    one host (of one job or of several) whose PIDs lie within 4096 of each other, each on a port of its own,
    above the jobs' steps and below the ephemeral ports; Open MPI 5's names (PRRTE's `prterun-<host>-<pid>@1`)
    likewise. Two PIDs equal in their low 12 bits share one."""
    assert [orte_namespace(27902, pid) for pid, _ in SEEN] == [namespace for _, namespace in SEEN]
    assert len({mpirun_port(namespace) for _, namespace in SEEN}) == 4
    for host_hash in (27902, 0x9E3779B9, 0xFFFFFFFF):
        for first in (300, 32768 - 2048, 65536 * 63):
            ports = {mpirun_port(orte_namespace(host_hash, pid)) for pid in range(first, first + 4096)}
            assert len(ports) == 4096 and min(ports) >= 28000 and max(ports) < 32768
    assert len({mpirun_port(f"prterun-nid-001-{pid}@1") for pid in range(40000, 44096)}) == 4096
    assert mpirun_port(orte_namespace(27902, 300)) == mpirun_port(orte_namespace(27902, 300 + 4096))


def test_mpiruns_ranks_agree_though_their_steps_differ():
    """As seen on the multinode test cluster: under mpirun the ranks on mpirun's node are in no step, those on
    the other nodes in its daemons' step (step 0, one task a node). Every rank takes the job's first node and
    the port of mpirun's namespace, so two mpiruns of one job meet apart; also where the
    daemons' step has as many tasks as the world (3 nodes, 2 ranks)."""
    ompi = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "SLURM_JOB_ID": "4242"}
    namespace, other = orte_namespace(0x9E3779B9, 5001), orte_namespace(0x9E3779B9, 5002)
    local = {**ompi, "OMPI_COMM_WORLD_RANK": "0", "SLURM_JOB_NODELIST": "nid[001-003]", "PMIX_NAMESPACE": namespace}
    remote = {
        **local,
        "OMPI_COMM_WORLD_RANK": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "nid[002-003]",
        "SLURM_STEP_NUM_TASKS": "2",
    }
    met = {(detect(env).master_addr, detect(env).master_port) for env in (local, remote)}
    assert met == {("nid001", mpirun_port(namespace))}
    assert detect({**local, "PMIX_NAMESPACE": other}).master_port not in {port for _, port in met}


def test_a_step_with_reserved_ports_meets_at_the_last_of_them():
    """Where the site has Slurm reserve ports (MpiParams=ports=), every task of a step has the step's in
    SLURM_STEP_RESV_PORTS (values as a Slurm 22.05 gave them); Cray's PMI takes the first, the ranks the last.
    mpirun's ranks keep their namespace's port: the ports of its daemons' step are Open MPI's."""
    for reserved, port in (("15007-15009", 15009), ("15001,15004-15005", 15005), ("15020", 15020)):
        assert detect({**srun_task(1, 2, SLURM_STEP_ID="3"), "SLURM_STEP_RESV_PORTS": reserved}).master_port == port
    mpirun = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_NAMESPACE": SEEN[0][1]}
    env = {**srun_task(1, 2, SLURM_STEP_ID="0", SLURM_STEP_RESV_PORTS="15001-15003"), **mpirun}
    assert detect(env).master_port == mpirun_port(SEEN[0][1])


def test_every_rank_names_its_run_alike():
    """What the rendezvous compares: the job and step under srun, the job and namespace under mpirun (whose
    ranks are in different steps), the namespace outside Slurm; and the world size."""
    step = {**srun_task(0, 2, SLURM_STEP_ID="3"), "SLURM_STEP_NODELIST": "nid001"}
    assert {detect({**step, "SLURM_PROCID": str(r)}).run for r in (0, 1)} == {"job 4242 step 3 (2 ranks)"}
    ompi = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "1093468161"}
    local, remote = {**ompi, "OMPI_COMM_WORLD_RANK": "0"}, {**ompi, "OMPI_COMM_WORLD_RANK": "1", "SLURM_STEP_ID": "0"}
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "nid001"}
    assert {detect({**env, **slurm}).run for env in (local, remote)} == {"job 4242 mpirun 1093468161 (2 ranks)"}
    assert detect(local).run == "mpirun 1093468161 (2 ranks)"
    assert detect({"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "nid001"}).run == "a run (3 ranks)"


def test_a_rank_that_reaches_another_runs_store_refuses_it(monkeypatch):
    """Two steps forced onto one port: the first's rank 0 serves its store; the second's rank 1 finds it and
    names both runs, the second's rank 0 cannot listen, each in one line; a store of no bert-squad run (no
    name in it) is refused too, once the name's short wait is over; the first's own rank 1 joins."""
    monkeypatch.setattr(distributed, "RUN_KEY_WAIT", timedelta(seconds=1))
    forced = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    first, second = ({**srun_task(rank, 2, SLURM_STEP_ID=step), **forced} for rank, step in ((0, "0"), (1, "8")))
    held = rendezvous(detect(first), timedelta(seconds=60))
    where = f"127.0.0.1:{forced['MASTER_PORT']}"
    with pytest.raises(UserError) as refused:
        rendezvous(detect(second), timedelta(seconds=60))
    assert str(refused.value).startswith(
        f"rank 1 of job 4242 step 8 (2 ranks) met job 4242 step 0 (2 ranks) at {where}, two runs on one port: "
    )
    with pytest.raises(
        UserError, match=rf"^rank 0 of job 4242 step 8 \(2 ranks\) found no rendezvous at {where}: its port"
    ):
        rendezvous(detect({**second, "SLURM_PROCID": "0"}), timedelta(seconds=60))
    with pytest.raises(UserError, match="met a store that is no bert-squad run's"):
        foreign = distributed.td.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
        rendezvous(dataclasses.replace(detect(second), master_port=foreign.port), timedelta(seconds=60))
    own = rendezvous(detect({**first, "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}), timedelta(seconds=60))
    own.set("rank 1", "here")
    assert held.get("rank 1") == b"here"


def test_a_derived_port_has_retries_every_rank_derives_alike():
    """A port derived by a rule (a job's step or batch step, an mpirun's, the default) comes with RETRIES more,
    the same on every rank, among the rendezvous ports: so job 4242's step 7, whose own port is job 4243's batch
    step's, has others to go to. An exported MASTER_PORT, or one Slurm reserved for the step, has none."""
    step7 = [detect(srun_task(rank, 2, SLURM_STEP_ID="7")) for rank in (0, 1)]
    assert step7[0].ports == step7[1].ports and step7[0].master_port == job_port(4242, 7) == job_port(4243)
    assert len(set(step7[0].ports)) == 1 + distributed.RETRIES
    assert all(20000 <= port < 32096 for port in step7[0].ports)  # no ephemeral port (from 32768)
    batch = detect({"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_JOB_ID": "4243", "SLURM_JOB_NODELIST": "nid001"})
    assert batch.master_port == step7[0].master_port and batch.retries == step7[0].retries
    mpirun = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert len(detect({**mpirun, "PMIX_NAMESPACE": SEEN[0][1]}).retries) == distributed.RETRIES
    assert len(detect(mpirun).retries) == distributed.RETRIES  # the default port, 29500
    assert detect({**srun_task(0, 2, SLURM_STEP_ID="7"), "MASTER_PORT": "12345"}).ports == (12345,)
    assert detect({**srun_task(0, 2, SLURM_STEP_ID="7"), "SLURM_STEP_RESV_PORTS": "15001-15003"}).ports == (15003,)


def test_a_port_another_run_holds_costs_a_retry(capsys):
    """Job 4243's batch step holds the port job 4242's step 7 derives too: the step's rank 0 listens on its
    next port and says so; its rank 1, started before it, passes the other run's store and keeps looking until
    it meets its own; the batch step's ranks meet theirs."""
    addr = {"MASTER_ADDR": "127.0.0.1"}  # (the ports: this session's, in place of the rule's)
    shared, own_next, batch_next = free_port(), free_port(), free_port()
    batch_env = {"PMI_SIZE": "2", "SLURM_JOB_ID": "4243", "SLURM_JOB_NODELIST": "nid001", **addr}
    batch = [
        dataclasses.replace(detect({**batch_env, "PMI_RANK": str(r)}), master_port=shared, retries=(batch_next,))
        for r in (0, 1)
    ]
    step = [
        dataclasses.replace(
            detect({**srun_task(r, 2, SLURM_STEP_ID="7"), **addr}), master_port=shared, retries=(own_next, free_port())
        )
        for r in (0, 1)
    ]
    held = rendezvous(batch[0], timedelta(seconds=60))
    joined = {}
    late = threading.Thread(target=lambda: joined.update(store=rendezvous(step[1], timedelta(seconds=60))))
    late.start()  # rank 1 before its rank 0: it looks at each port in turn, and again
    time.sleep(3)
    mine = rendezvous(step[0], timedelta(seconds=60))
    late.join(60)
    assert joined["store"].port == mine.port == own_next
    assert capsys.readouterr().out == (
        f"rank 0 of job 4242 step 7 (2 ranks): 127.0.0.1:{shared} taken, meeting at 127.0.0.1:{own_next}\n"
    )
    joined["store"].set("from rank 1", "step 7")
    assert mine.get("from rank 1") == b"step 7"
    theirs = rendezvous(batch[1], timedelta(seconds=60))
    theirs.set("from rank 1", "batch")
    assert held.get("from rank 1") == b"batch" and theirs.port == shared


def test_two_runs_of_one_name_on_one_port_do_not_mix(monkeypatch):
    """Under torchrun each run is named by its rendezvous id, so a rank of a second run on the first's port
    names both; ranks started by hand, with no launcher naming their run, find their number taken: each in one
    line, where they joined the first run before."""
    monkeypatch.setattr(distributed, "RUN_KEY_WAIT", timedelta(seconds=1))
    port = str(free_port())

    def env(rank, run_id=None):
        given = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        return {**given, "TORCHELASTIC_RUN_ID": run_id} if run_id else given

    assert {detect(env(r, "b1e4")).run for r in (0, 1)} == {"torchrun b1e4 (2 ranks)"}
    held = [rendezvous(detect(env(r, "b1e4")), timedelta(seconds=60)) for r in (0, 1)]
    with pytest.raises(UserError, match=r"^rank 1 of torchrun 77aa \(2 ranks\) met torchrun b1e4 \(2 ranks\) at "):
        rendezvous(detect(env(1, "77aa")), timedelta(seconds=60))
    del held
    port = str(free_port())
    held = [rendezvous(detect(env(r)), timedelta(seconds=60)) for r in (0, 1)]
    with pytest.raises(
        UserError, match=rf"^rank 1 of a run \(2 ranks\) met another rank 1 of its name at 127.0.0.1:{port}: export"
    ):
        rendezvous(detect(env(1)), timedelta(seconds=60))
    assert held[0].get(f"{distributed.RUN_KEY}/rank/0/1") != b""  # the first run's rank 1 keeps its number


def test_a_launcher_is_seen_behind_the_job_templates_rank():
    """The job template sets RANK from the launcher's variables; the ranks still know mpirun started them
    (so no progress bar goes into the batch log through Open MPI's pty); torchrun's RANK alone is no launcher."""
    template = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    assert started_by_launcher({**template, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"})
    assert started_by_launcher({**template, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4"})
    assert not started_by_launcher(template)
    assert not started_by_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})  # the batch shell: no step


def test_multi_node_without_any_address_is_a_clear_error():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    with pytest.raises(UserError, match="MASTER_ADDR"):
        detect(env)


def test_mpich_pmi():
    d = detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert (d.rank, d.world_size, d.local_rank, d.launcher) == (1, 2, 1, "pmi")


def test_srun_step_but_not_batch_shell():
    step = {
        "SLURM_PROCID": "2",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "daint[10,12]",
        "SLURM_JOB_ID": "7",
    }
    d = detect(step)
    assert (d.rank, d.world_size, d.local_rank, d.launcher, d.master_addr) == (2, 4, 0, "srun", "daint10")
    # The batch shell itself has SLURM_PROCID=0 and the job's SLURM_NTASKS, but is one process.
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "daint[10,12]", "SLURM_JOB_ID": "7"}
    assert detect(batch).world_size == 1


def test_explicit_env_wins_over_launcher_variables():
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "10.1.1.1",
        "MASTER_PORT": "1234",
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "2",
        "SLURM_JOB_ID": "9",
    }
    d = detect(env)
    assert (d.rank, d.launcher, d.master_addr, d.master_port) == (1, "env", "10.1.1.1", 1234)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "0", "WORLD_SIZE": "abc"}, "WORLD_SIZE=abc: not a whole number"),
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE=abc is set without RANK: set both, or neither"),
        ({"RANK": "1"}, "RANK=1 is set without WORLD_SIZE"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK=x: not a whole number"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2: must be from 0 to 1 (with WORLD_SIZE=2)"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1: must be from 0 to 1"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0: must be 1 or more"),
        ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "first"}, "LOCAL_RANK=first: not a whole number"),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "-2"}, "OMPI_COMM_WORLD_SIZE=-2: must be 1 or more"),
        (
            {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "two"},
            "OMPI_COMM_WORLD_LOCAL_SIZE=two: not a whole number",
        ),
        ({"PMI_RANK": "1", "PMI_SIZE": "1"}, "PMI_RANK=1: must be from 0 to 0 (with PMI_SIZE=1)"),
        (
            {
                "SLURM_PROCID": "0",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_LOCALID": "0",
                "SLURM_JOB_NODELIST": "nid[1-",
                "SLURM_JOB_ID": "7",
            },
            "SLURM_JOB_NODELIST=nid[1-: not a Slurm node list",
        ),
        (
            {**srun_task(0, 2), "SLURM_STEP_ID": "1", "SLURM_STEP_NODELIST": "nid[2"},
            "SLURM_STEP_NODELIST=nid[2: not a Slurm node list",
        ),
        ({**srun_task(0, 2), "SLURM_STEP_ID": "batch"}, "SLURM_STEP_ID=batch: not a whole number"),
        (
            {**srun_task(0, 2), "SLURM_STEP_ID": "1", "SLURM_STEP_RESV_PORTS": "any"},
            "SLURM_STEP_RESV_PORTS=any: not Slurm's list of reserved ports",
        ),
        (
            {**srun_task(0, 2), "SLURM_STEP_ID": "1", "SLURM_STEP_RESV_PORTS": "65530-65536"},
            "SLURM_STEP_RESV_PORTS=65530-65536: not Slurm's list of reserved ports",
        ),
        (
            {
                "SLURM_PROCID": "0",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_LOCALID": "0",
                "SLURM_JOB_NODELIST": "n1",
                "SLURM_JOB_ID": "7.1",
            },
            "SLURM_JOB_ID=7.1: not a whole number",
        ),
        ({"MASTER_PORT": "http"}, "MASTER_PORT=http: not a whole number"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000: must be from 1 to 65535"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": " "}, "MASTER_ADDR is set but empty"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_a_launcher_variable_that_cannot_be_is_named_with_its_value(env, message):
    """Every variable detect reads is checked where it is read (WORLD_SIZE=abc was a ValueError traceback)."""
    with pytest.raises(UserError) as refused:
        detect(env)
    assert str(refused.value).startswith(message), str(refused.value)


def test_job_ports_differ_between_jobs():
    assert job_port(1001) != job_port(1002)
    assert all(20000 <= job_port(j) < 32768 for j in (0, 1, 99999, 12345678))  # not ephemeral
    assert all(20000 <= mpirun_port(n) < 32768 for n in ("prterun-vm-4021@1", "4294967295", "slurm.pmix.7.0"))


def test_two_mpiruns_outside_slurm_rendezvous_on_their_own_ports():
    """Each mpirun gives its ranks one PMIx namespace: two 2-rank jobs on one machine must not share port 29500
    (their ranks would mix: gloo's 'Received data size doesn't match expected size', seen in this suite)."""
    runs = [
        {
            "OMPI_COMM_WORLD_RANK": "0",
            "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "PMIX_NAMESPACE": namespace,
        }
        for namespace in ("852754433", "852033537")
    ]
    ports = [detect(env).master_port for env in runs]
    assert ports[0] != ports[1] and ports == [mpirun_port("852754433"), mpirun_port("852033537")]


@pytest.mark.mpi
def test_ranks_leave_the_process_group_together(tmp_path):
    """Rank 1 finishes first; it must not leave (and tear gloo down under rank 0) before rank 0 is done.
    Exiting early aborted rank 1 with `terminate called without an active exception` in about 1 run in 5.
    Rank 0 finishes only once rank 1 has written that it reached the end of its body (an event, no sleep)."""
    marker, leaving = tmp_path / "rank0-done", tmp_path / "rank1-leaving"
    script = tmp_path / "leave.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, time
        from bert_squad import distributed, runtime
        runtime.prepare(deepspeed=True)
        dist = distributed.detect()
        with distributed.process_group(dist):
            distributed.gather_to_rank0(dist.rank, dist)
            if dist.rank == 1:
                open({str(leaving)!r}, "w").close()
            else:
                deadline = time.monotonic() + 120
                while not os.path.exists({str(leaving)!r}):
                    assert time.monotonic() < deadline, "rank 1 never reached the end of its body"
                    time.sleep(0.05)
                open({str(marker)!r}, "w").close()
        with open(os.path.join({str(tmp_path)!r}, f"rank{{dist.rank}}.txt"), "w") as f:  # not stdout: ranks interleave
            f.write(f"rank 0 done: {{os.path.exists({str(marker)!r})}} group alive: {{distributed.is_initialized()}}")
    """)
    )
    r = subprocess.run(
        [*MPIRUN, PYTHON, script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **launcher_env(MPIRUN)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "rank 0 done: True group alive: False", rank


@pytest.mark.mpi
def test_padded_gather_gives_rank_0_each_ranks_tensor_at_its_own_width(tmp_path):
    """Rank r sends 2 rows of widths[r] numbers (rank 1 none at all); rank 0 gets each as sent, the others
    nothing."""
    script = tmp_path / "gather.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os, torch
        from bert_squad import distributed, runtime
        runtime.prepare(deepspeed=True)
        dist = distributed.detect()
        widths = [3, 0, 5]
        with distributed.process_group(dist):
            mine = torch.arange(2 * widths[dist.rank], dtype=torch.float32).reshape(2, -1) + 100 * dist.rank
            parts = distributed.gather_padded_to_rank0(mine, widths, dist)
        got = None if parts is None else [p.tolist() for p in parts]
        with open(os.path.join({str(tmp_path)!r}, f"rank{{dist.rank}}.json"), "w") as f:
            json.dump(got, f)
    """)
    )
    launcher = [*MPIRUN[:-1], "3"]
    env = {**os.environ, **launcher_env(launcher)}
    r = subprocess.run([*launcher, PYTHON, script], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    got = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(3)]
    assert got[0] == [
        [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]],
        [[], []],
        [[200.0 + i for i in range(5)], [205.0 + i for i in range(5)]],
    ]
    assert got[1] is None and got[2] is None


def test_leaving_the_group_ends_gloos_threads(tmp_path):
    """Once a command leaves its process group, no gloo thread is left: one still running at interpreter
    shutdown aborted a rank of `evaluate` with exit 134 in about 1 run in 12 under transformers 4.40, whose
    first forward imports torch._dynamo, which keeps references to a group that lives while it is imported."""
    script = tmp_path / "threads.py"
    script.write_text(
        textwrap.dedent("""
        import os
        from bert_squad import distributed, runtime
        runtime.prepare(deepspeed=True)
        def gloo_threads():
            names = (open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
            return sorted(n for n in names if "gloo" in n)
        dist = distributed.detect()
        with distributed.process_group(dist):
            distributed.gather_to_rank0(dist.rank, dist)
            inside = gloo_threads()
            import torch._dynamo  # as a library's first forward does
        print(inside, gloo_threads())
    """)
    )
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    r = subprocess.run(
        [PYTHON, script], capture_output=True, text=True, timeout=300, env={**env, "MASTER_PORT": str(free_port())}
    )
    assert r.returncode == 0, r.stderr[-2000:]
    inside, after = r.stdout.strip().splitlines()[-1].split("] [")
    assert "gloo" in inside and after == "]", r.stdout  # threads while the group lives, none after it

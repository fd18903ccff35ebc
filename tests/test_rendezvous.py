"""The runs of one job that share a host at once meet their own ranks only, on the test Slurm: many srun steps
and two mpiruns at once, each at a port of its own (`distributed.job_port`, `mpirun_port`); and of two runs
forced onto one port, the second fails in one line (`distributed.rendezvous`). The ranks only meet
(tests/rendezvous_only.py): nothing trains."""

import collections
import json
import re
import socket
import sys

import pytest
from helpers import ROOT, free_port
from slurm_jobs import finished, job_env, submit

from bert_squad.distributed import job_port, mpirun_port, retries

pytestmark = pytest.mark.slurm

MEET = f"{sys.executable} {ROOT / 'tests' / 'rendezvous_only.py'}"
STEPS, MPIRUNS = 9, 2  # srun steps 0-8 and two mpiruns, of 2 ranks each, all at once in one job


def meeting(cluster, tmp_path, body):
    """A 2-task job whose batch script is `body`, where `{meet}` starts tests/rendezvous_only.py on the job's
    records folder and `{folder}` is that folder: (its id, its final state, its log, the records)."""
    folder = tmp_path / "met"
    folder.mkdir()
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n" + body.format(meet=f"{MEET} {folder}", folder=folder))
    job, log = submit(cluster, tmp_path, [], job_env(tmp_path), ["--ntasks=2"], script=script)
    info, text = finished(cluster, job, log, timeout=600)
    return job, info, text, [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


@pytest.mark.mpi
def test_co_running_steps_and_mpiruns_of_a_job_meet_their_own_ranks(slurm_cluster, tmp_path):
    """Every rank's store holds its own run's ranks only (as each rank's launcher names its run), every run
    holds its port while all the others hold theirs, and no two runs share one."""
    count = 2 * (STEPS + MPIRUNS)
    job, info, text, met = meeting(
        slurm_cluster,
        tmp_path,
        f"for i in $(seq {STEPS}); do srun --overlap --ntasks=2 {{meet}} {count} & done\n"
        f"for i in $(seq {MPIRUNS}); do mpirun -np 2 --bind-to none {{meet}} {count} & done\nwait\n",
    )
    assert info["JobState"] == "COMPLETED" and len(met) == count, text[-3000:]
    runs = collections.defaultdict(dict)
    for record in met:
        assert record["seen"] == [record["run"]] * 2, record  # both ranks of its store are of its own run
        runs[record["run"]][record["rank"]] = record["port"]
    steps = sorted(run for run in runs if run.startswith("step-"))
    assert steps == sorted(f"step-{step}" for step in range(STEPS)) and len(runs) == STEPS + MPIRUNS, sorted(runs)
    ports = {run: set(by_rank.values()) for run, by_rank in runs.items()}
    assert all(len(port) == 1 for port in ports.values()), ports  # each run's ranks met at one port
    assert len(set.union(*ports.values())) == len(runs), ports  # and no two runs at the same
    expected = {
        run: job_port(int(job), int(run[5:])) if run.startswith("step-") else mpirun_port(run[7:]) for run in runs
    }
    assert {run: port.pop() for run, port in ports.items()} == expected


def test_a_second_run_on_the_first_ones_port_fails_in_one_line(slurm_cluster, tmp_path):
    """Two steps of one job forced onto one port (MASTER_PORT exported): while the first holds its store, the
    second's rank 0 cannot listen and its rank 1, which reaches the first's store, names both runs; each exits
    with 2 instead of waiting, and the first still meets its own ranks."""
    port = free_port()
    job, info, text, met = meeting(
        slurm_cluster,
        tmp_path,
        f"export MASTER_PORT={port}\nsrun --overlap --ntasks=2 {{meet}} 3 &\n"
        "for i in $(seq 600); do [ $(ls {folder} | grep -c json) -ge 2 ] && break; sleep 0.5; done\n"
        "srun --overlap --ntasks=2 {meet} 3\necho second step: exit $?\necho {{}} > {folder}/release.json\nwait\n",
    )
    where, first, second = f"{socket.gethostname()}:{port}", f"job {job} step 0 (2 ranks)", f"job {job} step 1"
    errors = sorted(re.findall(r"^rendezvous_only: error: (.*)$", text, re.M))
    assert errors == [
        f"rank 0 of {second} (2 ranks) found no rendezvous at {where}: its port is another run's or program's: "
        "export MASTER_PORT with a free port (docs/clusters.md, 'How the ranks start')",
        f"rank 1 of {second} (2 ranks) met {first} at {where}, two runs on one port: export MASTER_PORT with a "
        "free port (docs/clusters.md, 'How the ranks start')",
    ], text[-3000:]
    assert "second step: exit 2" in text, text[-3000:]
    assert [(r["run"], r["seen"]) for r in met if r] == [("step-0", ["step-0"] * 2)] * 2
    assert info["ExitCode"] == "0:0", info


def test_a_step_whose_port_another_run_holds_meets_at_its_next(slurm_cluster, tmp_path):
    """Step 7 of a job derives a later job's port (`job_port`: job j's step 7 is job j + 1's batch step); here a
    step of the same job holds that port first (MASTER_PORT exported). Step 7's rank 0 listens on the next of
    its ports and says so, its rank 1 passes the holder's store to meet it there: the clash costs a retry, and
    every rank still meets its own run's ranks only."""
    held = '$(python -c "from bert_squad.distributed import job_port; print(job_port($SLURM_JOB_ID, 7))")'
    job, info, text, met = meeting(
        slurm_cluster,
        tmp_path,
        f"MASTER_PORT={held} srun --overlap --ntasks=2 {{meet}} 4 &\n"
        "for i in $(seq 600); do [ $(ls {folder} | grep -c json) -ge 2 ] && break; sleep 0.5; done\n"
        "for step in 1 2 3 4 5 6; do srun --overlap --ntasks=1 true; done\n"
        "srun --overlap --ntasks=2 {meet} 4\nwait\n",
    )
    assert info["JobState"] == "COMPLETED" and len(met) == 4, text[-3000:]
    port = job_port(int(job), 7)
    ports = {record["run"]: {record["port"]} for record in met}
    for record in met:
        assert record["seen"] == [record["run"]] * 2, record
        ports[record["run"]].add(record["port"])
    assert ports == {"step-0": {port}, "step-7": {retries(port)[0]}}, ports
    host = socket.gethostname()
    line = f"rank 0 of job {job} step 7 (2 ranks): {host}:{port} taken, meeting at {host}:{retries(port)[0]}"
    assert line in text.splitlines(), text[-3000:]

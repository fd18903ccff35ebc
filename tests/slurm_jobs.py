"""What the Slurm tests (single-node and multi-node, bare and in containers) submit and wait for: one job
environment, one submission of a job script, one wait on a job's log, and the job script that resumes to a
number of steps the stop decided. Every wait is for an event (a line in the log, a state) with a generous
deadline, and fails with what it saw."""

import contextlib
import os
import re
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, train_args, window_args

from bert_squad.checkpoint import checkpoint_root
from bert_squad.distributed import job_port

GENERIC = ROOT / "slurm" / "generic.sbatch"
# A job that is queued or runs, as `scontrol` shows it: a flag in place of the base state where one is set, such
# as SIGNALING for a running job while its --signal is being sent (Slurm's job_state_codes page).
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "SIGNALING")
# The two launchers of the job script; the mpirun case needs Open MPI (the `mpi` tier).
LAUNCHERS = pytest.mark.parametrize("launcher", [pytest.param("mpirun", marks=pytest.mark.mpi), "srun"])
# Printed once every rank's stop handler is installed, before the first step.
TRAINING = r"training \d+ steps"
# The jobs' windows: 128 tokens, 48 apart (the question's share the CLI's default); their DeepSpeed config, by its
# path in the checkout, which the job runs in.
JOB_WINDOWS = window_args(128, 48, None)
FP32 = "configs/ds_fp32.json"


def job_train_args(model, train, out, *more, steps=4, config=FP32, cache=None, windows=JOB_WINDOWS):
    """A job's training arguments: `steps` steps of `model` (None: no --max-steps, for a run a signal ends or
    whose resuming script sets them) under `config`, then `more`; the output dir and the cache where given (a
    sweep chooses its own)."""
    limit = ["--max-steps", steps] if steps is not None else []
    return train_args(model, train, out, *limit, "--deepspeed_config", config, *more, cache=cache, windows=windows)


def assert_one_master(text, job, launcher, host, size=2):
    """Every rank of the job's log names the same master, `host`; under srun at the port of the job's step 0
    (the job script's ranks are its first step), under mpirun at a port of its own (mpirun's namespace's)."""
    masters = re.findall(rf"^rank \d+/{size} .* launcher \S+ master (\S+):(\d+)$", text, re.M)
    assert len(masters) == size and len(set(masters)) == 1 and masters[0][0] == host, text[-3000:]
    if launcher == "srun":
        assert masters[0][1] == str(job_port(int(job), step=0)), text[-3000:]


def job_env(scratch, **extra):
    """What a user's shell holds at sbatch time (sbatch exports it all to the job): the venv on PATH, no
    container, caches on a scratch. The tests run as root, which a user's Open MPI needs no permission for."""
    return {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PYTHONUNBUFFERED": "1",
        "BERT_SQUAD_RUNTIME": "none",
        "BERT_SQUAD_SCRATCH": str(scratch),
        "BERT_SQUAD_CACHE": str(Path(scratch) / "cache"),
        **extra,
    }


def submit(cluster, tmp_path, args, env, options=(), script=GENERIC):
    """sbatch `script` (the checked-in generic one by default) from the checkout; (job id, its log's path)."""
    log = tmp_path / "job-%j.out"
    job = cluster.sbatch(script, [f"--output={log}", *options], args, env=env, cwd=ROOT)
    return job, Path(str(log).replace("%j", job))


def submitting_env(monkeypatch, cluster, scratch, **extra):
    """This process's environment as a user's shell at sbatch time (job_env), pointed at `cluster`, for the
    in-process `bert-squad launch|sweep --submit`: their sbatch inherits it. Job logs go to `scratch`."""
    env = {
        **job_env(scratch, **extra),
        "SLURM_CONF": str(cluster.conf),
        "SBATCH_OUTPUT": str(Path(scratch) / "job-%j.out"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)


@contextlib.contextmanager
def paused(cluster):
    """The cluster's partition down while the `with` runs: what is submitted meanwhile stays queued, to be
    looked at, and is cancelled on the way out without having run."""
    assert cluster.run("scontrol", "update", "PartitionName=debug", "State=DOWN").returncode == 0
    try:
        yield
    finally:
        cluster.cancel_all()
        cluster.run("scontrol", "update", "PartitionName=debug", "State=UP")


def stored_script(cluster, job):
    """The batch script Slurm holds for `job`: what sbatch really received."""
    proc = cluster.run("scontrol", "write", "batch_script", job, "-")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def log_text(log):
    return log.read_text(errors="replace") if log.exists() else ""


def finished(cluster, job, log, timeout=900):
    """The job's final `scontrol` record and its log, once it has ended."""
    info = cluster.wait(job, timeout=timeout)
    return info, log_text(log) or "(no log)"


def wait_for_log(cluster, job, log, pattern, timeout=600, states=ACTIVE):
    """Until the job's log matches `pattern`; fails with the log if the job leaves `states` first or the
    deadline passes."""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, text := log_text(log)):
        state = cluster.job(job).get("JobState")
        assert state in states, f"job {job} is {state} before its log showed {pattern!r}:\n{text[-3000:]}"
        assert time.monotonic() < deadline, f"job {job} ({state}) showed no {pattern!r} in {timeout}s:\n{text[-3000:]}"
        time.sleep(0.5)
    return text


def wait_for_requeue(cluster, job, log, timeout=600):
    """Until Slurm has requeued the job once (its Restarts count) and its first run has finished
    completing: Restarts counts the requeue while the job still shows COMPLETING for a moment, and the
    job is back in the queue only after that. Fails with the log otherwise."""
    deadline = time.monotonic() + timeout
    while int((info := cluster.job(job)).get("Restarts", 0)) < 1 or info.get("JobState") == "COMPLETING":
        assert info.get("JobState") in (*ACTIVE, "REQUEUED", "COMPLETING"), (
            f"job {job} ended without a requeue: {info}\n{log_text(log)[-3000:]}"
        )
        assert time.monotonic() < deadline, f"job {job} not requeued in {timeout}s: {info}\n{log_text(log)[-3000:]}"
        time.sleep(0.5)
    return info


def warn_when_training(cluster, job, log):
    """Once the ranks train, USR1 to the batch shell only (what --signal=B:USR1 does); the job's end."""
    wait_for_log(cluster, job, log, TRAINING)
    cluster.run("scancel", "--batch", "--signal=USR1", job)
    return finished(cluster, job, log, timeout=300)


def resuming_script(tmp_path, out, more_steps):
    """A job script around slurm/generic.sbatch that trains until it is stopped, and once requeued trains
    `more_steps` past the checkpoint the stop left in `out`: how far the first run got decides the total,
    so no test has to guess how many steps a run makes before its signal arrives. (`exec`: the batch shell
    that Slurm signals is the job script's own, as with sbatch generic.sbatch.)"""
    latest = checkpoint_root(out) / "latest"
    script = tmp_path / "resuming.sbatch"
    script.write_text(f"""#!/bin/bash
steps=100000
if [ -f {latest} ]; then
  tag=$(cat {latest})
  steps=$((10#${{tag#step}} + {more_steps}))
fi
exec bash {GENERIC} "$@" --max-steps "$steps"
""")
    return script

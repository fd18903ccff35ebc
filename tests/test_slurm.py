"""The checked-in slurm/generic.sbatch submitted to a real local Slurm (see slurm_cluster.py).

sbatch -> batch shell -> mpirun or srun -> (stand-in) container runtime -> python -m bert_squad, with
2 ranks training the tiny model on CPU.
"""

import json
import os
import re
import socket
import sys
from pathlib import Path

import pytest
from helpers import ROOT, window_args
from slurm_jobs import (
    ACTIVE,
    GENERIC,
    LAUNCHERS,
    TRAINING,
    assert_one_master,
    finished,
    job_env,
    job_train_args,
    resuming_script,
    submit,
    wait_for_log,
    wait_for_requeue,
    warn_when_training,
)
from standin_runtime import RANK_ENV

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SARUS_IMAGE = "load/library/bert-squad:cuda"


def job_args(model, train_file, out, *more, steps=4):
    """These jobs' training arguments: the job's, without evaluation, windows 32 tokens apart; then `more`."""
    return job_train_args(model, train_file, out, "--no-eval", *more, steps=steps, windows=window_args(128, 32, None))


ENDLESS = 100000  # the steps of a run that only a signal ends


def two_ranks(cluster, tmp_path, args, env, options=(), script=GENERIC):
    """The job script, 2 ranks on the one node."""
    return submit(cluster, tmp_path, args, env, ["--ntasks-per-node=2", *options], script)


def assert_trained(info, text, out):
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text[-4000:]}"
    assert "rank 0/2" in text and "rank 1/2" in text, text[-4000:]
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 4


@pytest.mark.mpi
def test_generic_sbatch_trains_two_ranks_with_mpirun(slurm_cluster, tiny_model, sample_train, tmp_path):
    out = tmp_path / "model"
    job, log = two_ranks(slurm_cluster, tmp_path, job_args(tiny_model, sample_train, out), job_env(tmp_path))
    info, text = finished(slurm_cluster, job, log)
    assert_trained(info, text, out)
    assert re.search(r"bert-squad: running: mpirun -np 2 --bind-to none bash -c", text), text[:3000]


def _standin_bin(tmp_path):
    """A PATH folder where sarus, singularity and apptainer are the recording stand-in, and `module` (LUMI's
    Lmod) does nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    source = (Path(__file__).parent / "standin_runtime.py").read_text()
    script = f"#!{sys.executable}\n{source}"
    for name in ("sarus", "singularity", "apptainer"):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "module").write_text("#!/bin/sh\n")
    (bin_dir / "module").chmod(0o755)
    return bin_dir


def lumi_here(tmp_path):
    """slurm/lumi.sbatch as the batch script's body, under this node's #SBATCH needs (no GPUs, no 60G per GPU):
    its settings and slurm/job.sh run as checked in."""
    script = tmp_path / "lumi-here.sbatch"
    script.write_text(f'#!/bin/bash\nexec bash {ROOT}/slurm/lumi.sbatch "$@"\n')
    return script


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _bind_sources(options, flag):
    """Host paths of the bind mounts, in the runtime's own syntax."""
    if flag == "--mount":
        found = []
        for opt in options:
            assert opt.startswith("--mount="), opt
            fields = dict(kv.split("=", 1) for kv in opt[len("--mount=") :].split(","))
            assert fields["type"] == "bind" and set(fields) == {"type", "source", "destination"}, opt
            assert fields["source"] == fields["destination"] and os.path.isabs(fields["source"]), opt
            found.append(fields["source"])
        return found
    pairs = options[1::2]
    assert options[0::2] == ["-B"] * len(pairs), options
    found = []
    for pair in pairs:
        src, dst = pair.split(":")
        assert src == dst and os.path.isabs(src), pair
        found.append(src)
    return found


@pytest.mark.parametrize(
    "runtime,launcher", [pytest.param("sarus", "mpirun", marks=pytest.mark.mpi), ("singularity", "srun")]
)
def test_container_path_with_standin_runtimes(slurm_cluster, tiny_model, sample_train, tmp_path, runtime, launcher):
    """Sarus through slurm/generic.sbatch; Singularity through slurm/lumi.sbatch, its own runtime, launcher and
    runtime flags (the package's venv as a SquashFS at /user-software)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = scratch / "model"
    sif = scratch / "bert-squad-rocm.sif"
    sif.write_text("stand-in image")
    image = SARUS_IMAGE if runtime == "sarus" else str(sif)
    record_log = tmp_path / "runtime.jsonl"
    env = job_env(
        scratch,
        BERT_SQUAD_RUNTIME=runtime,
        BERT_SQUAD_LAUNCHER=launcher,
        BERT_SQUAD_IMAGE=image,
        STANDIN_LOG=str(record_log),
        STANDIN_SARUS_IMAGE=SARUS_IMAGE,
    )
    env["PATH"] = f"{_standin_bin(tmp_path)}:{env['PATH']}"
    script, site_flags = GENERIC, []
    if runtime == "singularity":
        script, site_flags = (
            lumi_here(tmp_path),
            ["-B", f"{scratch}/bert-squad/bert-squad-env.sqsh:/user-software:image-src=/"],
        )
        del env["BERT_SQUAD_RUNTIME"], env["BERT_SQUAD_LAUNCHER"]
    job, log = two_ranks(slurm_cluster, tmp_path, job_args(tiny_model, sample_train, out), env, script=script)
    info, text = finished(slurm_cluster, job, log)
    assert_trained(info, text, out)
    assert_one_master(text, job, launcher, socket.gethostname())

    records = _records(record_log)
    checks = [c for c in records if "check-cache" in c["command"]]
    calls = [c for c in records if c not in checks]
    assert len(checks) == 1, records  # the cache check runs once, inside the image
    assert len(calls) == 2, calls  # one container per rank
    ranks = sorted(c["env"]["OMPI_COMM_WORLD_RANK" if launcher == "mpirun" else "SLURM_PROCID"] for c in calls)
    assert ranks == ["0", "1"]
    for call in calls:
        assert call["sub"] == ("run" if runtime == "sarus" else "exec")
        assert call["image"] == image
        assert call["options"][len(call["options"]) - len(site_flags) :] == site_flags
        sources = _bind_sources(
            call["options"][: len(call["options"]) - len(site_flags)], "--mount" if runtime == "sarus" else "-B"
        )
        # The scratch (model, data, cache, output) and the checkout (configs/) are visible inside.
        assert str(scratch) in sources and str(ROOT) in sources, sources
        assert call["command"][:2] == ["bash", "-c"] and "python -m bert_squad" in call["command"][2]
        assert call["command"][4:] == job_args(str(tiny_model), str(sample_train), str(out))
        # The environment the ranks need passes through the runtime (its default; no --cleanenv): each
        # rank derives the rendezvous from the job's id and node list.
        assert call["env"]["SLURM_JOB_ID"] == job and call["env"]["SLURM_JOB_NODELIST"]
        assert call["env"]["BERT_SQUAD_REPO"] == str(ROOT) and call["env"]["HF_HUB_OFFLINE"] == "1"
        # All that the ranks need, as tests/test_charliecloud.py checks inside a real container.
        missing = [k for k in RANK_ENV["job"] + RANK_ENV[launcher] if call["env"][k] is None]
        assert not missing, f"not passed to the runtime: {missing}"


def test_missing_cache_fails_fast(slurm_cluster, tmp_path):
    job, log = two_ranks(
        slurm_cluster, tmp_path, ["--model", "bert-base-uncased", "--max-steps", "1"], job_env(tmp_path)
    )
    info, text = finished(slurm_cluster, job, log, timeout=120)
    assert info["ExitCode"] == "2:0", info
    assert "model 'bert-base-uncased' is not in the cache" in text and "--download-only" in text
    assert "running:" not in text


def test_missing_image_fails_fast(slurm_cluster, tiny_model, sample_train, tmp_path):
    env = job_env(tmp_path, BERT_SQUAD_RUNTIME="singularity", BERT_SQUAD_IMAGE=str(tmp_path / "absent.sif"))
    env["PATH"] = f"{_standin_bin(tmp_path)}:{env['PATH']}"
    job, log = two_ranks(slurm_cluster, tmp_path, job_args(tiny_model, sample_train, tmp_path / "o"), env)
    info, text = finished(slurm_cluster, job, log, timeout=120)
    assert info["ExitCode"] == "2:0" and "absent.sif is absent" in text, text


@LAUNCHERS
def test_end_of_job_signal_checkpoints_and_exits_75(slurm_cluster, tiny_model, sample_train, tmp_path, launcher):
    """USR1 to the batch shell only (what --signal=B:USR1 does) reaches both ranks through the launcher."""
    out = tmp_path / "model"
    args = job_args(tiny_model, sample_train, out, "--log-every", "1", steps=ENDLESS)
    job, log = two_ranks(slurm_cluster, tmp_path, args, job_env(tmp_path, BERT_SQUAD_LAUNCHER=launcher))
    info, text = warn_when_training(slurm_cluster, job, log)
    assert info["ExitCode"] == "75:0", f"{info}\n{text[-3000:]}"
    assert "USR1 received" in text and "stopped at a checkpoint" in text
    assert list((out / "checkpoints").glob("step*")), sorted(p.name for p in out.rglob("*"))


@pytest.mark.mpi
def test_same_script_runs_inside_salloc(slurm_cluster, tiny_model, sample_train, tmp_path):
    """Interactive use: inside an allocation the script runs as a plain bash script (no #SBATCH)."""
    out = tmp_path / "model"
    proc = slurm_cluster.run(
        "salloc",
        "--ntasks-per-node=2",
        "bash",
        str(GENERIC),
        *job_args(tiny_model, sample_train, out),
        env={**slurm_cluster.env, **job_env(tmp_path)},
        cwd=ROOT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "train_metrics.json").read_text())["world_size"] == 2


def test_checkpointed_stop_requeues_the_job(slurm_cluster, tiny_model, sample_train, tmp_path):
    out = tmp_path / "model"
    args = job_args(tiny_model, sample_train, out, "--resume", "auto", steps=ENDLESS)
    env = job_env(tmp_path, BERT_SQUAD_LAUNCHER="srun", BERT_SQUAD_REQUEUE="1")
    job, log = two_ranks(slurm_cluster, tmp_path, args, env, options=["--requeue", "--open-mode=append"])
    try:
        wait_for_log(slurm_cluster, job, log, TRAINING)
        slurm_cluster.run("scancel", "--batch", "--signal=USR1", job)
        wait_for_requeue(slurm_cluster, job, log)
        assert f"requeueing job {job}" in log.read_text()
        # Back in the queue under the same id (so the same default --output-dir and --resume auto); that
        # it resumes and finishes is test_time_limit_checkpoints_and_the_requeued_job_finishes.
        assert slurm_cluster.job(job)["JobState"] in (*ACTIVE, "REQUEUED")
    finally:
        slurm_cluster.run("scancel", job)


def minutes_run(info):
    """A job's RunTime ([D-]HH:MM:SS) in whole minutes, rounded up."""
    days, _, clock = info["RunTime"].rpartition("-")
    hours, minutes, seconds = map(int, clock.split(":"))
    return (int(days or 0) * 24 + hours) * 60 + minutes + (seconds > 0)


def test_time_limit_checkpoints_and_the_requeued_job_finishes(slurm_cluster, tiny_model, sample_train, tmp_path):
    """A time limit expires mid-training: Slurm's warning (B:USR1@60) stops the run at a checkpoint (exit
    75), the job requeues itself, and the requeued run resumes from that checkpoint and completes.

    Events, not timings: the job is submitted with room to spare, and once its ranks train (the stop
    handler installed) the test cuts its limit to the next minute, as an operator would, so the warning
    comes within Slurm's next limit check; once it is requeued the test raises the limit again. The first
    run trains until the warning stops it; the requeued one resumes and trains 5 steps past the checkpoint
    (slurm_jobs.resuming_script), however far the first run got."""
    out = tmp_path / "model"
    args = job_args(tiny_model, sample_train, out, "--resume", "auto", "--log-every", "100", steps=None)
    env = job_env(tmp_path, BERT_SQUAD_LAUNCHER="srun", BERT_SQUAD_REQUEUE="1")
    job, log = submit(
        slurm_cluster,
        tmp_path,
        args,
        env,
        script=resuming_script(tmp_path, out, 5),
        options=["--ntasks-per-node=1", "--time=15", "--signal=B:USR1@60", "--requeue", "--open-mode=append"],
    )
    try:
        wait_for_log(slurm_cluster, job, log, TRAINING)
        limit = minutes_run(slurm_cluster.job(job)) + 1
        assert slurm_cluster.run("scontrol", "update", f"JobId={job}", f"TimeLimit={limit}").returncode == 0
        wait_for_requeue(slurm_cluster, job, log)
        assert slurm_cluster.run("scontrol", "update", f"JobId={job}", "TimeLimit=15").returncode == 0
        text = log.read_text()
        assert "USR1 received" in text and f"requeueing job {job}" in text, text[-3000:]
        stopped_at = int(re.search(r"checkpoint at step (\d+) saved; exiting with 75", text).group(1))
        info, text = finished(slurm_cluster, job, log, timeout=600)
    finally:
        slurm_cluster.run("scancel", job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0" and info["Restarts"] == "1", (
        f"{info}\n{text[-3000:]}"
    )
    assert re.search(rf"resumed from \S+/checkpoints/step0*{stopped_at} at step {stopped_at}\b", text), text[-3000:]
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["steps"] == stopped_at + 5 and metrics["world_size"] == 1

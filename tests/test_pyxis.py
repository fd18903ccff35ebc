"""The job scripts with real Enroot + Pyxis containers on a local Slurm (tests/pyxis.py): the `pyxis` runtime
(srun --container-image=... --container-mounts=...) and the Daint job's CSCS Container Engine EDF, run through
the Pyxis flags it translates to.

The image is the Charliecloud tests' Debian minbase as a .sqsh: no Python in it, so the test interpreter and
its venv are mounted in and found on the host's PATH (--container-env=PATH) through BERT_SQUAD_RUNTIME_FLAGS;
the job mounts the scratch, the checkout and the cache itself. Every rank's python leaves a record from
inside the container (test_charliecloud.PROBE): a file only the image has, and the rank's environment.
"""

import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bert_squad.checkpoint import checkpoint_root, complete_tags
from bert_squad.runtime import OFFLINE_VARS as IMAGE_OFFLINE
from helpers import PYTHON, ROOT, run_bert_squad
from hub_server import hub
from images import MARKER_TEXT, cached_image, ch_train_args, interpreter_dirs, probe_env, probes
from pyxis import pyxis_cluster, pyxis_image  # noqa: F401  (fixtures)
from slurm_jobs import finished, job_env, warn_when_training

pytestmark = [pytest.mark.container, pytest.mark.slurm, pytest.mark.slow]
DEV = "bert_squad/sample/dev-v1.1.json"


def container_flags(model):
    """srun options that bring the test's Python (the image has none) and the tiny model into the container."""
    return " ".join([f"--container-mounts={d}:{d}" for d in [*interpreter_dirs(), str(model)]] +
                    ["--container-env=PATH"])


def pyxis_env(scratch, image, model, **extra):
    return job_env(scratch, BERT_SQUAD_RUNTIME="pyxis", BERT_SQUAD_LAUNCHER="srun", BERT_SQUAD_IMAGE=str(image),
                   BERT_SQUAD_RUNTIME_FLAGS=container_flags(model), **probe_env(scratch), **extra)


def submit(cluster, tmp_path, script, args, env, options=()):
    log = tmp_path / "job-%j.out"
    job = cluster.sbatch(script, ["--ntasks-per-node=2", f"--output={log}", *options], args, env=env, cwd=ROOT)
    return job, tmp_path / f"job-{job}.out"


def assert_ranks_ran_in_the_image(records, job):
    assert sorted(r["env"]["SLURM_PROCID"] for r in records) == ["0", "1"], records
    for rec in records:
        assert rec["marker"] and rec["marker"].startswith(MARKER_TEXT), rec  # the host has no such file
        assert rec["env"]["SLURM_JOB_ID"] == job and rec["env"]["HF_HUB_OFFLINE"] == "1", rec
        assert rec["env"]["BERT_SQUAD_REPO"] == str(ROOT), rec


def assert_same_weights_on_both_ranks(out):
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["world_size"] == 2 and len(set(metrics["weights_sha256_per_rank"])) == 1, metrics
    return metrics


def test_two_ranks_train_and_evaluate_in_pyxis_containers(pyxis_cluster, pyxis_image, tiny_model, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = scratch / "model"
    job, log = submit(pyxis_cluster, tmp_path, ROOT / "slurm" / "generic.sbatch", ch_train_args(tiny_model, out),
                      pyxis_env(scratch, pyxis_image, tiny_model))
    info, text = finished(pyxis_cluster, job, log)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text[-4000:]}"
    assert re.search(r"bert-squad: running: srun .*--container-image=\S+debian\.sqsh", text), text[:3000]
    assert_ranks_ran_in_the_image(probes(scratch), job)
    assert_same_weights_on_both_ranks(out)
    # The containers' 2-rank evaluation, against one process outside any container on the exported model.
    outside = tmp_path / "outside"
    r = run_bert_squad("evaluate", "--model-dir", out, "--eval-file", "bert_squad/sample/dev-v1.1.json",
                       "--output-dir", outside, "--cache-dir", tmp_path / "cache-outside", "--max-seq-length", "128",
                       "--doc-stride", "48")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (outside / "predictions.json").read_bytes() == (out / "predictions.json").read_bytes()


def test_end_of_job_signal_in_pyxis_containers_requeues_and_resumes(pyxis_cluster, pyxis_image, tiny_model, tmp_path):
    """USR1 to the batch shell -> srun -> the ranks inside their containers: one checkpoint, exit 75, the job
    requeues itself and the requeued run resumes from that checkpoint and finishes."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = scratch / "model"
    steps = 30
    args = [a for a in ch_train_args(tiny_model, out, "--log-every", "1", "--no-eval", "--resume", "auto")
            if a not in ("--eval-file", "bert_squad/sample/dev-v1.1.json")]
    args[args.index("--max-steps") + 1] = str(steps)
    job, log = submit(pyxis_cluster, tmp_path, ROOT / "slurm" / "generic.sbatch", args,
                      pyxis_env(scratch, pyxis_image, tiny_model, BERT_SQUAD_REQUEUE="1"), ["--requeue", "--open-mode=append"])
    try:
        info, text = warn_when_training(pyxis_cluster, job, log)
    finally:
        pyxis_cluster.run("scancel", job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", f"{info}\n{text[-4000:]}"
    assert "USR1 received" in text and f"requeueing job {job}" in text, text[-4000:]
    stopped_at = int(re.search(r"checkpoint at step (\d+) saved; exiting with 75", text).group(1))
    assert 0 < stopped_at < steps, text[-4000:]
    assert re.search(rf"resumed from \S+/step0*{stopped_at} at step {stopped_at}\b", text), text[-4000:]
    assert len(complete_tags(checkpoint_root(out))) == 1
    assert assert_same_weights_on_both_ranks(out)["steps"] == steps


@pytest.mark.parametrize("case", ["image", "mount", "output"])
def test_what_a_pyxis_job_cannot_start_without_is_one_line(pyxis_cluster, pyxis_image, tiny_model, tmp_path, case):
    """A missing image, a missing mount source and an output dir the container cannot write: one line, exit
    2, before any rank starts (the last one from the cache check, run once inside the image)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    image = tmp_path / "absent.sqsh" if case == "image" else pyxis_image
    extra = {"BERT_SQUAD_CACHE": str(tmp_path / "no-cache")} if case == "mount" else {}
    # The image's root file system is read-only (Enroot's default): the container cannot write there.
    out = "/opt/bert-squad-out" if case == "output" else scratch / "out"
    job, log = submit(pyxis_cluster, tmp_path, ROOT / "slurm" / "generic.sbatch", ch_train_args(tiny_model, out),
                      pyxis_env(scratch, image, tiny_model, **extra))
    info, text = finished(pyxis_cluster, job, log, timeout=300)
    errors = [line for line in text.splitlines() if "error" in line.lower()]
    assert info["ExitCode"] == "2:0" and len(errors) == 1 and "running:" not in text, f"{info}\n{text}"
    assert {"image": f"image {image} is absent", "mount": f"mount source {tmp_path}/no-cache does not exist",
            "output": "/opt/bert-squad-out: output dir cannot be written (Read-only file system)"}[case] in errors[0]
    assert not probes(scratch)  # no rank's python started


def ce_srun_bin(tmp_path):
    """A PATH folder whose `srun` is tests/ce_srun.py: the CE's --environment=EDF as Pyxis flags."""
    bin_dir = tmp_path / "ce-bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT}/tests/ce_srun.py \"$@\"\n")
    (bin_dir / "srun").chmod(0o755)
    return bin_dir


@pytest.fixture(scope="session")
def offline_image(tmp_path_factory):
    """The test image as the shipped ones are (containers/Dockerfile, bert-squad.def): its environment sets the
    Hugging Face offline switches (Enroot takes an image's environment from its /etc/environment)."""
    root = tmp_path_factory.mktemp("offline-image") / "root"
    subprocess.run(["cp", "-al", str(cached_image("mksquashfs")), str(root)], check=True, timeout=600)
    environment = root / "etc" / "environment"
    text = environment.read_text() if environment.exists() else ""
    environment.unlink(missing_ok=True)  # a hard link into the cached image: replaced, not written through
    environment.write_text(text + "".join(f"{v}=1\n" for v in IMAGE_OFFLINE) + "BERT_SQUAD_IMAGE_ENV=offline\n")
    image = root.parent / "offline.sqsh"
    subprocess.run([shutil.which("mksquashfs") or "/usr/sbin/mksquashfs", str(root), str(image), "-noappend", "-quiet",
                    "-no-progress", "-noI", "-noD", "-noF", "-noX", "-processors", "1"], check=True, timeout=300)
    return image


def daint_env(tmp_path, scratch, image, model):
    """What a Daint user's shell holds at sbatch time here: the site script's defaults but the image, the
    CE as tests/ce_srun.py (the EDF as Pyxis flags), this machine's architecture for the image check, and
    the test's Python and model brought into the container."""
    env = job_env(scratch, BERT_SQUAD_IMAGE=str(image), BERT_SQUAD_RUNTIME_FLAGS=container_flags(model),
                  BERT_SQUAD_ARCH=platform.machine(), REAL_SRUN=shutil.which("srun"), **probe_env(scratch))
    del env["BERT_SQUAD_RUNTIME"]  # the site's: ce
    env["PATH"] = f"{ce_srun_bin(tmp_path)}:{env['PATH']}"
    return env


def test_the_first_day_on_daint(pyxis_cluster, offline_image, tiny_model, tmp_path):
    """docs/clusters.md's Daint steps, with slurm/daint.sbatch and slurm/daint.toml as checked in, on the test
    node ('normal' is 'debug' here; 1 core a rank): `download` inside an image whose environment says offline
    fills the cache on the scratch from a hub (tests/hub_server.py); 2 ranks train offline from that cache in
    the EDF's containers, one GPU each through --gpus-per-task; bert-squad-test reads the trained model."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env, daint, options = daint_env(tmp_path, scratch, offline_image, tiny_model), ROOT / "slurm" / "daint.sbatch", [
        "--partition=debug", "--cpus-per-task=1"]
    # The shipped images have CA certificates, which this machine's environment names (SSL_CERT_FILE): the
    # test image has none of its own.
    certs = " --container-mounts=/etc/ssl/certs:/etc/ssl/certs" if Path("/etc/ssl/certs").is_dir() else ""
    with hub({"org/tiny-bert": tiny_model}) as (url, requests):
        job, log = submit(pyxis_cluster, tmp_path, daint, ["download", "--model", "org/tiny-bert", "--train-file",
                                                           "bert_squad/sample/train-v1.1.json"],
                          {**env, "HF_ENDPOINT": url, "BERT_SQUAD_RUNTIME_FLAGS": env["BERT_SQUAD_RUNTIME_FLAGS"] + certs},
                          options)
        info, text = finished(pyxis_cluster, job, log)
    assert info["JobState"] == "COMPLETED", f"{info}\n{text[-4000:]}"
    assert re.search(rf"^model -> {scratch}/cache/hub/models--org--tiny-bert/snapshots/\w+$", text, re.M), text
    assert any(r.startswith("GET /org/tiny-bert/resolve/") for r in requests), requests
    [record] = probes(scratch)  # the download, in the image, whose offline switches it overrides for itself
    assert record["env"]["BERT_SQUAD_IMAGE_ENV"] == "offline" and record["env"]["HF_HUB_OFFLINE"] == "1", record
    for p in (scratch / "probes").iterdir():
        p.unlink()

    out = scratch / "model"
    train = [a for a in ch_train_args("org/tiny-bert", out, "--no-eval") if a not in ("--eval-file", DEV)]
    job, log = submit(pyxis_cluster, tmp_path, daint, train, env, options)
    info, text = finished(pyxis_cluster, job, log)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text[-4000:]}"
    assert f"runtime ce image {offline_image} environment {ROOT}/slurm/daint.toml, launcher srun" in text, text[:3000]
    records = probes(scratch)
    assert_ranks_ran_in_the_image(records, job)
    assert {r["env"]["BERT_SQUAD_IMAGE_ENV"] for r in records} == {"offline"}
    assert {r["env"]["SLURM_PROCID"]: r["env"]["CUDA_VISIBLE_DEVICES"] for r in records} == {"0": "0", "1": "1"}
    assert {r["env"]["HF_HOME"] for r in records} == {f"{scratch}/cache/hf"}
    assert_same_weights_on_both_ranks(out)

    # The console script a user runs, on the login node (this process's environment: offline).
    r = subprocess.run([str(Path(PYTHON).parent / "bert-squad-test"), "--model-file", str(out), "--eval-file", DEV,
                        "--num-test-samples", "2", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(json.loads(r.stdout)) == 2

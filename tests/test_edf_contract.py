"""The contract of the job scripts' CSCS Container Engine path (`BERT_SQUAD_RUNTIME=ce`: srun
--environment=EDF) and of the Daint EDFs with the CE as cscs-docs' edf.md documents it, held on a real runtime
on a local Slurm. The CE itself (Enroot, Pyxis, CSCS's hooks) exists only at CSCS and is not run: srun is
tests/ce_srun.py, the test's own reading of edf.md (its docstring says what it carries, and how), which starts
each task in Charliecloud's ch-run. What this proves is that slurm/job.sh and the EDFs do what edf.md says
the CE needs, and that the job then works in real containers; a CE that reads edf.md otherwise than
tests/ce_srun.py does, or fails by itself, would pass here.

The image (tests/ce_cluster.py) is the Charliecloud tests' Debian minbase as a .sqsh whose environment says
offline and which has an entrypoint; Python is not in it, so the test's interpreter is mounted in: by the
tests' own EDF for slurm/generic.sbatch, and through CE_SRUN_MOUNTS beside slurm/daint.toml as checked in.
Every rank's python leaves a record from inside its container (images.PROBE): a file only the image has, and
the rank's environment.
"""

import json
import platform
import re
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT, run_in_checkout
from hub_server import hub
from images import (
    DEV,
    MARKER_TEXT,
    assert_predictions_of_one_process,
    ch_train_args,
    interpreter_dirs,
    probe_env,
    probes,
)
from slurm_jobs import finished, job_env, submit, warn_when_training

from bert_squad.checkpoint import checkpoint_root, complete_tags

pytestmark = [pytest.mark.container, pytest.mark.slurm, pytest.mark.slow]
# The Daint job as checked in, on the test node: its 'normal' partition is 'debug' here, 1 core a rank.
DAINT, DAINT_OPTIONS = ROOT / "slurm" / "daint.sbatch", ["--partition=debug", "--cpus-per-task=1"]


def edf_of_the_test(tmp_path, model):
    """An EDF as a user of slurm/generic.sbatch writes one: the job's paths from its environment, the test's
    Python and model mounted, a read-only image without its entrypoint, and [env] entries that show which
    environment wins (a value from the image's, one unset)."""
    mounts = [
        "${BERT_SQUAD_SCRATCH}:${BERT_SQUAD_SCRATCH}",
        "${BERT_SQUAD_REPO}:${BERT_SQUAD_REPO}",
        *(f"{d}:{d}" for d in [*interpreter_dirs(), str(model)]),
    ]
    edf = tmp_path / "test.toml"
    edf.write_text(
        f'image = "${{BERT_SQUAD_IMAGE}}"\nmounts = {json.dumps(mounts)}\nworkdir = "${{BERT_SQUAD_REPO}}"\n'
        "writable = false\nentrypoint = false\n\n[env]\n"
        'BERT_SQUAD_EDF_ENV = "edf saw ${BERT_SQUAD_IMAGE_ENV}"\nBERT_SQUAD_UNSET = ""\n'
    )
    return edf


def ce_env(ce_srun, tmp_path, scratch, image, model, **extra):
    """A slurm/generic.sbatch job in the CE: srun is tests/ce_srun.py, the EDF the test's. The host says
    BERT_SQUAD_IMAGE_ENV=host and BERT_SQUAD_UNSET=host: the image's value and the EDF's unset win."""
    env = job_env(
        scratch,
        BERT_SQUAD_RUNTIME="ce",
        BERT_SQUAD_LAUNCHER="srun",
        BERT_SQUAD_IMAGE=str(image),
        BERT_SQUAD_EDF=str(edf_of_the_test(tmp_path, model)),
        BERT_SQUAD_IMAGE_ENV="host",
        BERT_SQUAD_UNSET="host",
        **probe_env(scratch),
        **extra,
    )
    return ce_srun.env(env)


def two_ranks(cluster, tmp_path, args, env, script=ROOT / "slurm" / "generic.sbatch", options=()):
    return submit(cluster, tmp_path, args, env, ["--ntasks-per-node=2", *options], script=script)


def assert_ranks_ran_in_the_image(records, job):
    assert sorted(r["env"]["SLURM_PROCID"] for r in records) == ["0", "1"], records
    for rec in records:
        assert rec["marker"] and rec["marker"].startswith(MARKER_TEXT), rec  # the host has no such file
        assert rec["env"]["SLURM_JOB_ID"] == job and rec["env"]["HF_HUB_OFFLINE"] == "1", rec
        assert rec["env"]["BERT_SQUAD_REPO"] == str(ROOT) and rec["env"]["CH_RUNNING"], rec


def assert_same_weights_on_both_ranks(out):
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["world_size"] == 2 and len(set(metrics["weights_sha256_per_rank"])) == 1, metrics
    return metrics


def test_two_ranks_train_and_evaluate_in_edf_containers(ce_cluster, ce_image, ce_srun, tiny_model, tmp_path):
    """2 ranks train and evaluate in the EDF's containers: equal weights on both, the predictions those of one
    process outside any container; each rank saw the host's environment under the image's under the EDF's."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = scratch / "model"
    job, log = two_ranks(
        ce_cluster, tmp_path, ch_train_args(tiny_model, out), ce_env(ce_srun, tmp_path, scratch, ce_image, tiny_model)
    )
    info, text = finished(ce_cluster, job, log)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text[-4000:]}"
    assert re.search(rf"bert-squad: running: srun \S+ \S+ --environment={tmp_path}/test\.toml bash", text), text[:3000]
    records = probes(scratch)
    assert_ranks_ran_in_the_image(records, job)
    for rec in records:
        assert rec["env"]["BERT_SQUAD_IMAGE_ENV"] == "offline" and rec["env"]["BERT_SQUAD_EDF_ENV"] == "edf saw offline"
        assert rec["env"]["BERT_SQUAD_UNSET"] is None and rec["env"]["BERT_SQUAD_ENTRYPOINT"] is None, rec
    assert_same_weights_on_both_ranks(out)
    assert_predictions_of_one_process(out, tmp_path)
    assert ce_srun.leftovers() == []


def test_end_of_job_signal_in_edf_containers_requeues_and_resumes(ce_cluster, ce_image, ce_srun, tiny_model, tmp_path):
    """USR1 to the batch shell -> srun -> the ranks inside their containers: one checkpoint, exit 75, the job
    requeues itself and the requeued run resumes from that checkpoint and finishes."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = scratch / "model"
    steps = 30
    args = [
        a
        for a in ch_train_args(tiny_model, out, "--log-every", "1", "--no-eval", "--resume", "auto")
        if a not in ("--eval-file", DEV)
    ]
    args[args.index("--max-steps") + 1] = str(steps)
    env = ce_env(ce_srun, tmp_path, scratch, ce_image, tiny_model, BERT_SQUAD_REQUEUE="1")
    job, log = two_ranks(ce_cluster, tmp_path, args, env, options=["--requeue", "--open-mode=append"])
    try:
        info, text = warn_when_training(ce_cluster, job, log)
    finally:
        ce_cluster.run("scancel", job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", f"{info}\n{text[-4000:]}"
    assert "USR1 received" in text and f"requeueing job {job}" in text, text[-4000:]
    stopped_at = int(re.search(r"checkpoint at step (\d+) saved; exiting with 75", text).group(1))
    assert 0 < stopped_at < steps, text[-4000:]
    assert re.search(rf"resumed from \S+/step0*{stopped_at} at step {stopped_at}\b", text), text[-4000:]
    assert len(complete_tags(checkpoint_root(out))) == 1
    assert assert_same_weights_on_both_ranks(out)["steps"] == steps
    assert ce_srun.leftovers() == []


@pytest.mark.parametrize("case", ["image", "mount", "unmounted", "output"])
def test_what_an_edf_job_cannot_start_without_is_one_line(ce_cluster, ce_image, ce_srun, tiny_model, tmp_path, case):
    """A missing image, a missing mount source, a cache the EDF does not mount (elsewhere than the scratch)
    and an output dir the container cannot write: one line, exit 2, before any rank starts (the last two from
    the task run once inside the image)."""
    scratch, store = tmp_path / "scratch", tmp_path / "store" / "cache"
    scratch.mkdir()
    store.mkdir(parents=True)
    image = tmp_path / "absent.sqsh" if case == "image" else ce_image
    cache = {"mount": tmp_path / "no-cache", "unmounted": store}.get(case)
    extra = {"BERT_SQUAD_CACHE": str(cache)} if cache else {}
    # The EDF says writable = false: the image's root file system is read-only to the container.
    out = "/opt/bert-squad-out" if case == "output" else scratch / "out"
    job, log = two_ranks(
        ce_cluster,
        tmp_path,
        ch_train_args(tiny_model, out),
        ce_env(ce_srun, tmp_path, scratch, image, tiny_model, **extra),
    )
    info, text = finished(ce_cluster, job, log, timeout=300)
    errors = [line for line in text.splitlines() if "error" in line.lower()]
    assert info["ExitCode"] == "2:0" and len(errors) == 1 and "running:" not in text, f"{info}\n{text}"
    assert {
        "image": f"image {image} is absent",
        "mount": f"mount source {tmp_path}/no-cache does not exist",
        "unmounted": f"bert-squad: error: {store} is not inside the container: add it to the mounts of "
        f"{tmp_path}/test.toml",
        "output": "/opt/bert-squad-out: output dir cannot be written (Read-only file system)",
    }[case] in errors[0]
    assert not probes(scratch)  # no rank's python started
    assert ce_srun.leftovers() == []


def daint_env(ce_srun, scratch, image, *mounts):
    """What a Daint user's shell holds at sbatch time here: the site script's defaults but the image, the
    CE as tests/ce_srun.py, this machine's architecture for the image check, and the test's Python (and
    `mounts`) mounted beside the EDF's own."""
    env = job_env(
        scratch,
        BERT_SQUAD_IMAGE=str(image),
        BERT_SQUAD_ARCH=platform.machine(),
        CE_SRUN_MOUNTS=",".join(f"{d}:{d}" for d in [*interpreter_dirs(), *mounts]),
        **probe_env(scratch),
    )
    del env["BERT_SQUAD_RUNTIME"]  # the site's: ce
    return ce_srun.env(env)


def daint_download(ce_cluster, ce_image, ce_srun, tiny_model, tmp_path, scratch, **extra):
    """`sbatch slurm/daint.sbatch download --model org/tiny-bert` from a hub serving the tiny model (the test
    node's partition, 1 core a rank); returns (job info, log text) once it ended, having asserted that the
    model came from the hub."""
    # The shipped images have CA certificates, which this machine's environment names (SSL_CERT_FILE): the
    # test image has none of its own.
    certs = ["/etc/ssl/certs"] if Path("/etc/ssl/certs").is_dir() else []
    with hub({"org/tiny-bert": tiny_model}) as (url, requests):
        job, log = two_ranks(
            ce_cluster,
            tmp_path,
            ["download", "--model", "org/tiny-bert", "--train-file", "bert_squad/sample/train-v1.1.json"],
            {**daint_env(ce_srun, scratch, ce_image, *certs), "HF_ENDPOINT": url, **extra},
            DAINT,
            DAINT_OPTIONS,
        )
        info, text = finished(ce_cluster, job, log)
    assert info["JobState"] == "COMPLETED", f"{info}\n{text[-4000:]}"
    assert any(r.startswith("GET /org/tiny-bert/resolve/") for r in requests), requests
    return info, text


def test_the_first_day_on_daint(ce_cluster, ce_image, ce_srun, tiny_model, tmp_path):
    """docs/clusters.md's Daint steps, with slurm/daint.sbatch and slurm/daint.toml as checked in, on the test
    node ('normal' is 'debug' here; 1 core a rank): `download` inside an image whose environment says offline
    fills the cache on the scratch from a hub (tests/hub_server.py); 2 ranks train offline from that cache in
    the EDF's containers (writable, the image's entrypoint run), one GPU each through --gpus-per-task;
    bert-squad-test reads the trained model."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    _, text = daint_download(ce_cluster, ce_image, ce_srun, tiny_model, tmp_path, scratch)
    assert re.search(rf"^model -> {scratch}/cache/hub/models--org--tiny-bert/snapshots/\w+$", text, re.M), text
    [record] = probes(scratch)  # the download, in the image, whose offline switches it overrides for itself
    assert record["env"]["BERT_SQUAD_IMAGE_ENV"] == "offline" and record["env"]["HF_HUB_OFFLINE"] == "1", record
    for p in (scratch / "probes").iterdir():
        p.unlink()

    out = scratch / "model"
    train = [a for a in ch_train_args("org/tiny-bert", out, "--no-eval") if a not in ("--eval-file", DEV)]
    job, log = two_ranks(ce_cluster, tmp_path, train, daint_env(ce_srun, scratch, ce_image), DAINT, DAINT_OPTIONS)
    info, text = finished(ce_cluster, job, log)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text[-4000:]}"
    assert f"runtime ce image {ce_image} environment {ROOT}/slurm/daint.toml, launcher srun" in text, text[:3000]
    records = probes(scratch)
    assert_ranks_ran_in_the_image(records, job)
    assert {(r["env"]["BERT_SQUAD_IMAGE_ENV"], r["env"]["BERT_SQUAD_ENTRYPOINT"]) for r in records} == {
        ("offline", "ran")
    }
    assert {r["env"]["SLURM_PROCID"]: r["env"]["CUDA_VISIBLE_DEVICES"] for r in records} == {"0": "0", "1": "1"}
    assert {r["env"]["HF_HOME"] for r in records} == {f"{scratch}/cache/hf"}
    assert_same_weights_on_both_ranks(out)
    assert ce_srun.leftovers() == []

    # The console script a user runs, on the login node (this process's environment: offline).
    shown = ["--model-file", out, "--eval-file", DEV, "--num-test-samples", 2, "--json"]
    r = run_in_checkout(Path(PYTHON).parent / "bert-squad-test", *shown)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(json.loads(r.stdout)) == 2


def test_daint_mounts_a_cache_outside_the_scratch(ce_cluster, ce_image, ce_srun, tiny_model, tmp_path):
    """A cache on another file system than the scratch (/store, say): slurm/daint.toml mounts it too, so
    `download` in the container fills the host's cache, not the container's own file system."""
    scratch, store = tmp_path / "scratch", tmp_path / "store" / "cache"
    scratch.mkdir()
    store.mkdir(parents=True)
    _, text = daint_download(ce_cluster, ce_image, ce_srun, tiny_model, tmp_path, scratch, BERT_SQUAD_CACHE=str(store))
    found = re.search(rf"^model -> ({store}/hub/models--org--tiny-bert/snapshots/\w+)$", text, re.M)
    assert found and (Path(found.group(1)) / "config.json").is_file(), text
    assert ce_srun.leftovers() == []

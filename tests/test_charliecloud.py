"""slurm/generic.sbatch with a real container runtime: Charliecloud's ch-run, on the local Slurm.

The image is Debian 12 minbase built by tests/charliecloud_image.sh (once per machine, cached outside the
checkout; `make ch-image`). Python is not installed in it: the test's interpreter prefix and venv are bound
in read-only through BERT_SQUAD_RUNTIME_FLAGS, the job binds the scratch and the checkout itself.
A sitecustomize on PYTHONPATH (which ch-run passes through) records, from inside every rank, a file only
the image has, the rank environment and the process that started python; the tests read those records.

The other runtimes are stand-ins (standin_runtime.py); the last tests hold them to what the real one
needed: the same binds from the same MOUNTS, and the same rank environment.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import standin_runtime
from helpers import ROOT, Started
from images import (
    MARKER_TEXT,
    assert_predictions_of_one_process,
    cached_image,
    ch_train_args,
    interpreter_dirs,
    probe_env,
    probes,
    squash,
)
from slurm_jobs import LAUNCHERS, finished, job_env, submit, warn_when_training

pytestmark = [pytest.mark.container, pytest.mark.slurm, pytest.mark.slow]

TEMPLATE = ROOT / "slurm" / "job.sh"


@pytest.fixture(scope="session")
def ch_image(tmp_path_factory):
    """The cached test image, hard-linked into a session folder with this session's mount points."""
    cached = cached_image("ch-run")
    image = tmp_path_factory.mktemp("ch") / "image"
    # ch-run binds only onto directories the image has; a user does the same mkdir before ch-convert.
    subprocess.run(["cp", "-al", str(cached), str(image)], check=True, timeout=600)
    for path in [*interpreter_dirs(), str(ROOT)]:
        (image / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    # The image's ENV as ch-image writes it: the job applies it (ch-run --set-env), as Sarus/Singularity do.
    (image / "ch").mkdir()
    (image / "ch" / "environment").write_text("BERT_SQUAD_IMAGE_ENV=from-image\n")
    return image


@pytest.fixture(scope="session")
def ch_squashfs(ch_image):
    """The same image as one SquashFS file (ch-run mounts it itself, with FUSE)."""
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        pytest.skip("no /dev/fuse or fusermount3 (apt-get install fuse3): ch-run cannot mount a SquashFS")
    return squash(ch_image, ch_image.parent / "image.sqfs")


def ch_env(scratch, image, **extra):
    flags = " ".join(f"-b {d}:{d}" for d in interpreter_dirs())
    return job_env(
        scratch,
        BERT_SQUAD_RUNTIME="charliecloud",
        BERT_SQUAD_IMAGE=str(image),
        BERT_SQUAD_RUNTIME_FLAGS=flags,
        **probe_env(scratch),
        # ch-run unsets it inside (the host's /tmp is the container's /tmp): shown in the records.
        TMPDIR="/tmp",
        **extra,
    )


def assert_ranks_ran_inside(records, launcher, image_kind, job):
    assert len(records) == 2, records  # one python per rank, nothing else started python -m bert_squad
    rank_var = "OMPI_COMM_WORLD_RANK" if launcher == "mpirun" else "SLURM_PROCID"
    assert sorted(r["env"][rank_var] for r in records) == ["0", "1"]
    for rec in records:
        # The host has no such file: a bypassed runtime fails here.
        assert rec["marker"] and rec["marker"].startswith(MARKER_TEXT), rec
        assert rec["env"]["CH_RUNNING"] == "Weird Al Yankovic", rec
        missing = [
            k for k in standin_runtime.RANK_ENV["job"] + standin_runtime.RANK_ENV[launcher] if rec["env"][k] is None
        ]
        assert not missing, f"not visible inside the container: {missing}"
        assert rec["env"]["SLURM_JOB_ID"] == job and rec["env"]["HF_HUB_OFFLINE"] == "1"  # the rendezvous' source
        assert rec["env"]["BERT_SQUAD_REPO"] == str(ROOT) and rec["env"]["TMPDIR"] is None
        assert rec["env"]["BERT_SQUAD_IMAGE_ENV"] == "from-image", rec
        # A directory image: ch-run execs into the rank command, python is the launcher's child.
        # A SquashFS image: ch-run stays as the FUSE server, python is its child.
        if image_kind == "squashfs":
            assert rec["parent"] == "ch-run" and rec["root_fs"].startswith("fuse"), rec
        else:
            assert rec["parent"] != "ch-run" and not rec["root_fs"].startswith("fuse"), rec


def two_ranks(cluster, tmp_path, args, env):
    return submit(cluster, tmp_path, args, env, ["--ntasks-per-node=2"])


@LAUNCHERS
def test_two_ranks_train_inside_charliecloud(slurm_cluster, tiny_model, ch_image, tmp_path, launcher):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = scratch / "model"
    env = ch_env(scratch, ch_image, BERT_SQUAD_LAUNCHER=launcher)
    job, log = two_ranks(slurm_cluster, tmp_path, ch_train_args(tiny_model, out), env)
    info, text = finished(slurm_cluster, job, log)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text[-4000:]}"
    assert "rank 0/2" in text and "rank 1/2" in text, text[-4000:]
    assert f"runtime charliecloud image {ch_image}, launcher {launcher}" in text
    assert re.search(r"bert-squad: running: .*ch-run -b ", text), text[:3000]
    # Written inside the containers, found on the host through the bound scratch.
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 4
    # The 2-rank evaluation in the containers, against one process outside any container on the exported model.
    assert_predictions_of_one_process(out, tmp_path)
    assert_ranks_ran_inside(probes(scratch), launcher, "directory", job)


@LAUNCHERS
def test_end_of_job_signal_reaches_the_ranks_in_squashfs_containers(
    slurm_cluster, tiny_model, ch_squashfs, tmp_path, launcher
):
    """USR1 to the batch shell -> launcher -> the ranks' process groups: python checkpoints and exits 75,
    while ch-run, which stays as the FUSE server of a SquashFS image, ignores it (else it dies of it)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = scratch / "model"
    args = ch_train_args(tiny_model, out, "--log-every", "1", "--no-eval")
    args = [a for a in args if a not in ("--eval-file", "bert_squad/sample/dev-v1.1.json")]
    args[args.index("--max-steps") + 1] = "100000"
    job, log = two_ranks(slurm_cluster, tmp_path, args, ch_env(scratch, ch_squashfs, BERT_SQUAD_LAUNCHER=launcher))
    info, text = warn_when_training(slurm_cluster, job, log)
    assert info["ExitCode"] == "75:0", f"{info}\n{text[-3000:]}"
    assert "USR1 received" in text and "stopped at a checkpoint" in text
    assert re.search(r"checkpoint at step \d+ saved; exiting with 75", text), text[-3000:]
    assert list((out / "checkpoints").glob("step*")), sorted(p.name for p in out.rglob("*"))
    assert_ranks_ran_inside(probes(scratch), launcher, "squashfs", job)


def test_a_squashfs_mount_never_reaches_the_host(ch_squashfs, tmp_path):
    """ch-run serves a SquashFS image itself (FUSE) inside a mount namespace of its own: the image is
    mounted there and never in the host's table, so a container killed with its process group (a cancelled
    job, a test's teardown) cannot leave a mount behind."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    env = {"PATH": f"{os.environ['PATH']}:/usr/sbin:/sbin", "USER": "root"}
    with Started(
        ["ch-run", f"--mount={mount}", str(ch_squashfs), "--", "sh", "-c", "echo inside; sleep 600"],
        tmp_path / "ch-run",
        env=env,
    ) as container:
        container.wait_for("^inside$", timeout=120)
        assert f" {mount} " in Path(f"/proc/{container.proc.pid}/mounts").read_text()
        assert f" {mount} " not in Path("/proc/self/mounts").read_text()
    assert f" {mount} " not in Path("/proc/self/mounts").read_text()


def _fails_fast(cluster, tmp_path, env, args):
    job, log = two_ranks(cluster, tmp_path, args, env)
    info, text = finished(cluster, job, log, timeout=120)
    errors = [line for line in text.splitlines() if line.startswith("bert-squad: error:")]
    assert info["ExitCode"] == "2:0" and len(errors) == 1 and "running:" not in text, f"{info}\n{text}"
    return errors[0]


def test_missing_image_fails_fast(slurm_cluster, tiny_model, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = ch_env(scratch, tmp_path / "absent-image")
    error = _fails_fast(slurm_cluster, tmp_path, env, ch_train_args(tiny_model, scratch / "o"))
    assert f"image {tmp_path / 'absent-image'} is absent" in error


def test_missing_mount_source_fails_fast(slurm_cluster, tiny_model, ch_image, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = ch_env(scratch, ch_image, BERT_SQUAD_CACHE=str(tmp_path / "no-such-cache"))
    error = _fails_fast(slurm_cluster, tmp_path, env, ch_train_args(tiny_model, scratch / "o"))
    assert f"mount source {tmp_path / 'no-such-cache'} does not exist" in error


def test_mount_point_missing_in_the_image_fails_fast(slurm_cluster, tiny_model, ch_image, tmp_path):
    """A bind destination the image lacks (outside /tmp, which is the host's): one line from the batch shell."""
    scratch = Path("/var/tmp") / f"bert-squad-ch-{os.getpid()}-{tmp_path.name}"
    scratch.mkdir()
    try:
        env = ch_env(scratch, ch_image)
        error = _fails_fast(slurm_cluster, tmp_path, env, ch_train_args(tiny_model, scratch / "o"))
    finally:
        shutil.rmtree(scratch)
    assert "ch-run cannot start" in error and f"{ch_image}{scratch}" in error, error


def test_image_without_etc_hosts_fails_fast(slurm_cluster, tiny_model, ch_image, tmp_path):
    """ch-run binds the host's /etc/hosts only onto an existing file: without it MASTER_ADDR does not
    resolve in the ranks and torch's rendezvous retries forever. The batch shell says so instead."""
    image = tmp_path / "image"
    subprocess.run(["cp", "-al", str(ch_image), str(image)], check=True, timeout=600)
    (image / "etc" / "hosts").unlink()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    error = _fails_fast(slurm_cluster, tmp_path, ch_env(scratch, image), ch_train_args(tiny_model, scratch / "o"))
    assert "does not resolve inside" in error and "/etc/hosts" in error, error


# The stand-ins against what the real runtime needed.


def _runtime_case():
    text = TEMPLATE.read_text()
    return re.search(r'^case "\$RUNTIME" in\n.*?^esac$', text, re.M | re.S).group(0)


def _run_array(runtime, tmp_path, mounts, flags=()):
    """RUN and then CONTAINER (srun's options: pyxis) as the template's runtime case builds them, with each
    runtime's CLI a stub that accepts all and `flags` as BERT_SQUAD_RUNTIME_FLAGS."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("sarus", "singularity", "apptainer", "ch-run", "scontrol"):
        stub = bin_dir / name
        stub.write_text(
            "#!/bin/sh\n[ \"$1\" = images ] && printf 'REPOSITORY TAG\\nload/library/img cuda\\n'\nexit 0\n"
        )
        stub.chmod(0o755)
    image = {"sarus": "load/library/img:cuda", "charliecloud": str(tmp_path)}.get(runtime, str(tmp_path / "i.sif"))
    (tmp_path / "i.sif").write_text("")
    script = (
        'die() { echo "$*" >&2; exit 2; }\nset -euo pipefail\nCONTAINER=() CONTAINER_ENV=(HF_HOME HF_HUB_OFFLINE)\n'
        f"RUNTIME={runtime}; IMAGE='{image}'; RUNTIME_FLAGS=({' '.join(flags)}); "
        f"MOUNTS=({' '.join(map(str, mounts))})\n"
        f'{_runtime_case()}\nprintf \'%s\\0\' "${{RUN[@]}}" "${{CONTAINER[@]}}"'
    )
    proc = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "USER": "u", "SLURM_JOB_NODELIST": "n1", "BERT_SQUAD_REPO": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\0")[:-1], image


def _binds(runtime, run):
    """(source, destination) pairs, each in its runtime's own syntax."""
    if runtime == "sarus":
        opts = [w for w in run if w.startswith("--mount=")]
        pairs = [
            (f["source"], f["destination"])
            for f in (dict(kv.split("=", 1) for kv in o[len("--mount=") :].split(",")) for o in opts)
        ]
    elif runtime == "pyxis":  # srun options; srun keeps only the last --container-mounts: one, all of them
        [opt] = [w for w in run if w.startswith("--container-mounts=")]
        pairs = [tuple(m.split(":")) for m in opt[len("--container-mounts=") :].split(",")]
    else:
        flag = "-b" if runtime == "charliecloud" else "-B"
        pairs = [tuple(run[i + 1].split(":")) for i, w in enumerate(run) if w == flag]
    return sorted(pairs)


def test_every_runtime_binds_the_same_mounts_and_keeps_the_environment(tmp_path):
    mounts = [tmp_path / "scratch", tmp_path / "repo"]
    for m in mounts:
        m.mkdir()
    seen = {}
    for runtime in ("sarus", "singularity", "apptainer", "charliecloud", "pyxis"):
        run, image = _run_array(runtime, tmp_path, mounts)
        seen[runtime] = _binds(runtime, run)
        assert image in run or f"--container-image={image}" in run, run
        # Nothing that empties or rewrites the environment the ranks need (see standin_runtime.RANK_ENV).
        clearing = {"--cleanenv", "-e", "--containall", "-C", "--unset-env"}
        assert not clearing & set(run) and not any(w.startswith("--unset-env") for w in run), run
    assert seen["charliecloud"] == sorted((str(m), str(m)) for m in mounts), seen
    assert seen["sarus"] == seen["singularity"] == seen["apptainer"] == seen["charliecloud"] == seen["pyxis"], seen


def test_pyxis_gets_one_list_of_mounts_and_of_names(tmp_path):
    """Pyxis (not run here: it is built from source, and the test machines install only registry packages)
    takes its container from srun's options, of which srun keeps only the last --container-mounts and
    --container-env: the job joins the runtime flags' lists with its own, and the checkout is the workdir."""
    run, image = _run_array("pyxis", tmp_path, [tmp_path], ["--container-mounts=/a:/b", "--container-env=PATH", "--x"])
    assert run == [
        f"--container-image={image}",
        f"--container-workdir={ROOT}",
        f"--container-mounts={tmp_path}:{tmp_path},/a:/b",
        "--container-env=HF_HOME,HF_HUB_OFFLINE,PATH",
        "--x",
    ]


def test_stand_ins_record_what_the_ranks_need():
    """Every variable the job script exports or the rank command reads is in the stand-ins' record and
    checked inside the real container (assert_ranks_ran_inside), so a new one cannot go unchecked."""
    text = TEMPLATE.read_text()
    rank_sh = re.search(r"^RANK_SH='(.*?)'$", text, re.M | re.S).group(1)
    outside = text.replace(rank_sh, "").replace(_runtime_case(), "")
    exported = set()
    for line in re.findall(r"^\s*export (.*)$", outside, re.M):
        exported |= set(re.findall(r"(?:^|\s)([A-Z_][A-Z0-9_]*)=", line))
    read = set(re.findall(r"\$\{?!?([A-Z_][A-Z0-9_]*)", rank_sh)) - {"RANK", "LOCAL_RANK", "WORLD_SIZE"}
    recorded = set(standin_runtime.RECORDED_ENV)
    assert exported - recorded == set(), f"exported by the job script, not checked: {exported - recorded}"
    assert read - recorded == set(), f"read by the ranks, not checked: {read - recorded}"
    assert {"HF_HUB_OFFLINE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"} <= exported | read
    # The rendezvous comes from Slurm's own variables (bert_squad.distributed.detect): they must pass too.
    assert {"SLURM_JOB_ID", "SLURM_JOB_NODELIST"} <= recorded

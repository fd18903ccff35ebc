"""`bert-squad launch`: the site scripts and their shared part, the sbatch command it runs, input errors,
shellcheck."""

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
from ce_srun import expanded, problems
from helpers import PYTHON, ROOT, put_in_hub_cache, train_args, window_args
from images import squash
from slurm_jobs import finished, stored_script, submitting_env

from bert_squad import cache, cli, preemption
from bert_squad.cluster import launch

SITES = ("daint", "daint-uenv", "lumi", "generic")
JOB_SH = ROOT / "slurm" / "job.sh"


def dry_run(capsys, *argv):
    """(the sbatch command's words, its environment, every option the job gets, the files it uses)."""
    assert cli.main(["launch", *argv]) == 0
    out = capsys.readouterr().out
    files = re.search(r"^# files: (.*)$", out, re.M).group(1).split()
    asks = dict(re.findall(r"--([\w-]+)(?:=(\S*))?", re.search(r"^# asks for: (.*)$", out, re.M).group(1)))
    words = shlex.split(out.strip().splitlines()[-1])
    env = dict(w.split("=", 1) for w in words[: words.index("sbatch")])
    return words[words.index("sbatch") :], env, asks, files


@pytest.mark.parametrize("site", SITES)
def test_site_scripts_are_short_and_hand_over_to_the_shared_part(site):
    """A site script is what a person reads and edits: its #SBATCH lines and settings, then one line that
    sources slurm/job.sh, which the job finds in the checkout it was submitted from."""
    lines = (ROOT / "slurm" / f"{site}.sbatch").read_text().splitlines()
    assert len(lines) <= 60, f"slurm/{site}.sbatch has {len(lines)} lines"
    assert lines[-1] == 'source "${BERT_SQUAD_REPO:-$SLURM_SUBMIT_DIR}/slurm/job.sh"'
    # Daint's and LUMI's settings name the documentation (and its commit) they come from.
    cited = {
        "daint": ["cscs-docs 80abed1"],
        "daint-uenv": ["cscs-docs 80abed1"],
        "lumi": ["lumi-userguide 6c3a26c", "LUMI-AI-Guide a7e3387"],
    }
    assert all(source in "\n".join(lines) for source in cited.get(site, []))


def test_the_stopped_exit_code_has_one_definition():
    """The job requeues on the package's own exit code for a checkpointed stop."""
    assert re.search(r"^STOPPED=(\d+)\b", JOB_SH.read_text(), re.M).group(1) == str(preemption.EXIT_STOPPED)


@pytest.mark.parametrize("nodes", [1, 8])
def test_daint_dry_run(capsys, nodes):
    """Daint on Alps (cscs-docs running/slurm.md, clusters/daint.md): 4 ranks a GH200 node, one GPU each through
    --gpus-per-task, 72 Grace cores each, srun with the Container Engine's --environment, bf16."""
    argv, env, opts, files = dry_run(capsys, "--site", "daint", "--nodes", str(nodes), "--dry-run")
    script = ROOT / "slurm" / "daint.sbatch"
    assert argv == ["sbatch", *([f"--nodes={nodes}"] if nodes > 1 else []), str(script)] and env == {}
    assert files == [str(script), str(ROOT / "slurm" / "daint.toml"), str(JOB_SH)]
    assert opts["nodes"] == str(nodes) and opts["ntasks-per-node"] == "4" and opts["gpus-per-task"] == "1"
    assert opts["cpus-per-task"] == "72" and opts["partition"] == "normal" and "gpus-per-node" not in opts
    assert opts["signal"] == "B:USR1@300"
    text = script.read_text()
    assert not re.search(r"^module ", text, re.M)  # no Cray modules: the CE brings the software stack
    assert "ulimit -c 0" in text and "BERT_SQUAD_RUNTIME=${BERT_SQUAD_RUNTIME:-ce}" in text
    assert launch.load_site("daint").default_args[:2] == ["--deepspeed-config", "ds_bf16"]


@pytest.mark.parametrize("name", ["daint.toml", "daint-ngc.toml"])
def test_daint_edfs_are_toml_with_the_reference_keys(name, tmp_path):
    """The EDFs beside the Daint script parse as TOML, use only the EDF reference's keys with their types
    (cscs-docs software/container-engine/edf.md), and mount what slurm/job.sh binds for the other runtimes
    (the scratch, the checkout, the cache), named from the job's environment. The Alps Extended Image shape
    (alps-extended-images.md): entrypoint on, the CXI hook off, no AWS OFI NCCL hook; the plain NGC one:
    that hook (resource-hook.md). Both: CSCS's PyTorch settings (ml/pytorch.md)."""
    doc = tomllib.loads((ROOT / "slurm" / name).read_text())
    assert problems(doc) == []
    # Under the CE only the EDF's mounts are inside: every folder slurm/job.sh binds for the other runtimes.
    bound = re.search(r"^for dir in ((?:\"\$\w+\" ?)+); do$", JOB_SH.read_text(), re.M).group(1)
    names = re.findall(r"\$(\w+)", bound)
    assert names == ["BERT_SQUAD_SCRATCH", "BERT_SQUAD_REPO", "BERT_SQUAD_CACHE"]
    assert doc["mounts"] == [f"${{{n}}}:${{{n}}}" for n in names]
    env = {"BERT_SQUAD_IMAGE": "/i.sqsh", "BERT_SQUAD_SCRATCH": "/s", "BERT_SQUAD_REPO": "/r", "BERT_SQUAD_CACHE": "/c"}
    doc = expanded(doc, env)
    assert doc["image"] == "/i.sqsh" and doc["workdir"] == "/r" and doc["mounts"] == ["/s:/s", "/r:/r", "/c:/c"]
    assert doc["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert all(doc["env"][v] == "1" for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))
    hooks = doc["annotations"]["com"]["hooks"]
    if name == "daint.toml":
        assert doc["entrypoint"] is True and hooks == {"cxi": {"enabled": "false"}}
        assert doc["env"]["PMIX_MCA_psec"] == "native"
    else:
        assert "entrypoint" not in doc and hooks == {"aws_ofi_nccl": {"enabled": "true", "variant": "cuda-dl"}}


@pytest.mark.parametrize("nodes", [1, 8])
def test_lumi_whole_nodes(capsys, nodes):
    _argv, _env, opts, files = dry_run(capsys, "--site", "lumi", "--nodes", str(nodes))
    assert files == [str(ROOT / "slurm" / "lumi.sbatch"), str(JOB_SH)]
    # One rank per GCD, 7 of the 56 usable cores each, whole nodes on standard-g, a requeued log appended to.
    assert opts["nodes"] == str(nodes) and opts["ntasks-per-node"] == "8" and opts["gpus-per-node"] == "8"
    assert opts["cpus-per-task"] == "7" and opts["partition"] == "standard-g" and opts["open-mode"] == "append"
    text = (ROOT / "slurm" / "lumi.sbatch").read_text()
    masks = [int(m, 16) for m in re.search(r"mask_cpu:([\w,]+)", text).group(1).split(",")]
    assert len(masks) == 8 and all(bin(m).count("1") == 7 for m in masks)
    assert not any(m & (1 << (8 * i)) for m in masks for i in range(8))  # the first core of each CCD is the OS's
    assert "module load lumi-aif-singularity-bindings\n" in text and "BERT_SQUAD_GPU_ENV=ROCR_VISIBLE_DEVICES" in text
    assert re.search(r"BERT_SQUAD_IMAGE:-/appl/local/laifs/containers/\S+/lumi-multitorch-full-\S+\.sif\}", text)


def test_part_of_a_lumi_node_goes_to_small_g(capsys):
    """Fewer than 8 GCDs: small-g, which bills what the job asks for (lumi-userguide partitions.md)."""
    argv, _env, opts, _ = dry_run(capsys, "--site", "lumi", "--nodes", "1", "--gpus-per-node", "4", "--dry-run")
    assert argv[1:-1] == ["--ntasks-per-node=4", "--gpus-per-node=4", "--partition=small-g"]
    assert opts["partition"] == "small-g" and opts["open-mode"] == "append"
    _, _, opts, _ = dry_run(capsys, "--site", "lumi", "--gpus-per-node", "4", "--partition", "dev-g")
    assert opts["partition"] == "dev-g"


def test_the_partial_node_partition_is_the_site_scripts(tmp_path, monkeypatch):
    """A site's partition for part of a node is the setting in its script a person edits: changed there, it
    changes what launch asks for; a script without it asks for none (its own #SBATCH partition stays)."""
    (tmp_path / "bert_squad").mkdir()
    (tmp_path / "bert_squad" / "__init__.py").write_text("")
    (tmp_path / "slurm").mkdir()
    lumi = (ROOT / "slurm" / "lumi.sbatch").read_text()
    assert re.search(r"^PARTIAL_NODE_PARTITION=small-g$", lumi, re.M)
    (tmp_path / "slurm" / "edited.sbatch").write_text(
        lumi.replace("PARTIAL_NODE_PARTITION=small-g", "PARTIAL_NODE_PARTITION=dev-g  # for a test")
    )
    (tmp_path / "slurm" / "none.sbatch").write_text(re.sub(r"^PARTIAL_NODE_PARTITION=.*$", "", lumi, flags=re.M))
    monkeypatch.setenv("BERT_SQUAD_REPO", str(tmp_path))
    part = launch.JobSpec(site="edited", gpus_per_node=4)
    assert launch.requested(part, launch.load_site("edited"))["partition"] == "dev-g"
    assert "partition" not in launch.requested(launch.JobSpec(site="edited"), launch.load_site("edited"))
    assert "partition" not in launch.requested(launch.JobSpec(site="none", gpus_per_node=4), launch.load_site("none"))


@pytest.mark.parametrize("ranks,bound", [("8", True), ("4", False)])
def test_cpu_masks_only_on_whole_nodes(ranks, bound):
    """slurm/job.sh's CPU masks map local rank i to the cores next to GPU i: only true on a whole node
    (lumi-userguide lumig-job.md)."""
    block = re.search(r"^# CPU masks.*?^\[ .*CPU_BIND=\$BERT_SQUAD_CPU_BIND$", JOB_SH.read_text(), re.M | re.S).group(0)
    masks = re.search(r"(mask_cpu:\S+)", (ROOT / "slurm" / "lumi.sbatch").read_text()).group(1)
    proc = subprocess.run(
        ["bash", "-c", f'set -eu\n{block}\necho "$CPU_BIND"'],
        capture_output=True,
        text=True,
        env={"BERT_SQUAD_CPU_BIND": masks, "SLURM_NTASKS_PER_NODE": ranks},
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == (masks if bound else ""), proc.stderr


def test_options_and_training_arguments(capsys):
    argv, env, opts, _ = dry_run(
        capsys,
        "--site",
        "generic",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--time",
        "1-00:00:00",
        "--account",
        "proj_1",
        "--partition",
        "gpu",
        "--requeue",
        "--",
        "--epochs",
        "3",
        "--output-dir",
        "runs/a b",
        "--seed",
        "$HOME",
    )
    assert (opts["nodes"], opts["ntasks-per-node"], opts["gpus-per-node"]) == ("2", "4", "4")
    assert (opts["time"], opts["account"], opts["partition"]) == ("1-00:00:00", "proj_1", "gpu")
    assert "requeue" in opts and opts["open-mode"] == "append" and env == {"BERT_SQUAD_REQUEUE": "1"}
    # Training arguments are the script's own arguments: literal words, never expanded.
    script = argv.index(str(ROOT / "slurm" / "generic.sbatch"))
    assert argv[script + 1 :] == ["--epochs", "3", "--output-dir", "runs/a b", "--seed", "$HOME"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--site", "daint", "--nodes", "0"], "--nodes 0"),
        (["--site", "lumi", "--gpus-per-node", "9"], "has 8 GPU(s)"),
        (["--site", "daint", "--gpus-per-node", "5"], "a daint node has 4 GPU(s)"),
        (["--site", "lumi", "--time", "1 hour"], "--time"),
        (["--site", "lumi", "--account", "x;rm"], "--account"),
        (["--site", "mars"], "--site mars: no"),
        (["--site", "lumi", "--cpus-per-node", "4"], "--cpus-per-node 4: fewer cores than the node's 8 rank(s)"),
        (["--site", "generic", "--cpus-per-node", "0"], "--cpus-per-node 0: fewer cores than the node's 1 rank(s)"),
    ],
)
def test_bad_options_are_one_line_errors(capsys, argv, message):
    assert cli.main(["launch", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bert-squad launch: error:") and message in err


@pytest.mark.parametrize(
    "site,argv,cpus",
    [
        ("daint", [], "72"),  # a GH200 node's 4 x 72 Grace cores (docs/clusters.md) over its 4 ranks
        ("daint", ["--gpus-per-node", "2"], "144"),  # a Daint job has whole nodes: 288 cores over 2 ranks
        ("lumi", [], "7"),  # a LUMI-G node's 56 usable cores over its 8 GCDs
        ("lumi", ["--gpus-per-node", "4"], "7"),  # small-g bills what a job asks for: 4 GCDs' share, 28 cores
        ("lumi", ["--cpus-per-node", "64"], "8"),
        ("generic", ["--nodes", "2", "--gpus-per-node", "8", "--cpus-per-node", "64"], "8"),
        ("generic", ["--cpus-per-node", "16"], "16"),  # one rank, no GPUs: the node's cores
        ("generic", ["--nodes", "2", "--gpus-per-node", "8"], None),  # a node's cores unknown: Slurm's defaults
    ],
)
def test_each_rank_asks_for_its_share_of_a_nodes_cores(capsys, site, argv, cpus):
    """sbatch --cpus-per-task: the node's cores (the site script's ranks x cores, or --cpus-per-node) divided
    among the node's ranks, so feature building and each rank's threads have the cores the node has."""
    _argv, _env, opts, _ = dry_run(capsys, "--site", site, *argv)
    assert opts.get("cpus-per-task") == cpus


@pytest.mark.parametrize(
    "env,threads",
    [
        ({"SLURM_CPUS_PER_TASK": "7", "SLURM_CPUS_ON_NODE": "56", "SLURM_NTASKS_PER_NODE": "4"}, "7"),
        ({"SLURM_CPUS_ON_NODE": "64", "SLURM_NTASKS_PER_NODE": "8"}, "8"),  # Slurm's defaults gave the node 64
        ({"SLURM_CPUS_ON_NODE": "2", "SLURM_NTASKS_PER_NODE": "4"}, "1"),
        ({}, "1"),
    ],
)
def test_each_rank_runs_on_the_cores_slurm_gave_it(env, threads):
    """slurm/job.sh: a rank's threads (and srun's --cpus-per-task) are --cpus-per-task where the job asked
    for it, else the cores Slurm gave the node divided among its ranks."""
    block = re.search(r"^CPUS_PER_RANK=.*?^export OMP_NUM_THREADS=.*?$", JOB_SH.read_text(), re.M | re.S).group(0)
    proc = subprocess.run(
        ["bash", "-c", f'set -eu\n{block}\necho "$OMP_NUM_THREADS $CPUS_PER_RANK"'],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.stdout.split() == [threads, threads], proc.stderr
    assert '--cpus-per-task="$CPUS_PER_RANK"' in JOB_SH.read_text()


@pytest.mark.slurm
@pytest.mark.slow
def test_submit_runs_the_site_script_on_the_test_slurm(slurm_cluster, tiny_model, tmp_path, monkeypatch, capsys):
    """`launch --submit` from the checkout runs the sbatch command --dry-run prints: the real sbatch gets the
    site script as it is (Slurm keeps it), with the command's options, and the job trains."""
    out = tmp_path / "model"
    steps = ["--max-steps", 1, "--no-eval"]
    train = train_args(
        tiny_model,
        "bert_squad/sample/train-v1.1.json",
        out,
        *steps,
        cache=tmp_path / "cache",
        windows=window_args(96, 16, None),
    )
    submitting_env(monkeypatch, slurm_cluster, tmp_path)
    monkeypatch.chdir(ROOT)
    own = ["--site", "generic", "--time", "00:10:00"]
    argv, _, _, _ = dry_run(capsys, *own, "--dry-run", "--", *train)
    assert argv[1] == "--time=00:10:00"
    assert cli.main(["launch", *own, "--submit", "--", *train]) == 0
    job = re.search(r"^Submitted batch job (\d+)$", capsys.readouterr().out, re.M).group(1)
    assert stored_script(slurm_cluster, job) == (ROOT / "slurm" / "generic.sbatch").read_text()
    info, text = finished(slurm_cluster, job, tmp_path / f"job-{job}.out", timeout=600)
    assert info["JobState"] == "COMPLETED" and info["TimeLimit"] == "00:10:00", f"{info}\n{text[-3000:]}"
    assert json.loads((out / "train_metrics.json").read_text())["steps"] == 1


def job_script(name, tmp_path, **env):
    """slurm/`name` run with bash as a job's shell would run it (job 1, the checkout as its repository), with
    `env` beside the system's PATH alone: what its checks before the ranks say."""
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "1", "BERT_SQUAD_REPO": str(ROOT), **env}
    cmd = ["bash", str(ROOT / "slurm" / name)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)


def test_a_requeue_switch_that_is_no_switch_is_refused_by_the_job(tmp_path):
    """BERT_SQUAD_REQUEUE=yes was read as 0 (no requeue) without a word; the job script says so and stops."""
    proc = job_script("generic.sbatch", tmp_path, BERT_SQUAD_REQUEUE="yes")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "bert-squad: error: BERT_SQUAD_REQUEUE=yes: use 1 (requeue after a checkpointed stop) or 0"
    ], proc.stderr


def test_the_uenv_job_without_its_uenv_is_one_line(tmp_path):
    """slurm/daint-uenv.sbatch runs the ranks natively in CSCS's PyTorch uenv, which its #SBATCH --uenv mounts."""
    proc = job_script("daint-uenv.sbatch", tmp_path, HOME=str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "bert-squad: error: no uenv at /user-environment: add #SBATCH --uenv=<image>:/user-environment and --view"
    ]


def fake_sbatch(tmp_path, monkeypatch):
    """sbatch as a script that keeps what it was given; PATH keeps bash, od and unsquashfs."""
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/argv\necho 'Submitted batch job 42'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin:/usr/sbin:/sbin")
    return tmp_path / "argv"


def daint_inputs(tmp_path, monkeypatch, image_from="/bin"):
    """A Daint submission's world: a scratch with a cache, and a SquashFS image whose /usr/bin/env is this
    machine's (x86_64) or a copy whose ELF header says aarch64."""
    scratch = tmp_path / "scratch"
    (scratch / "bert-squad" / "cache").mkdir(parents=True)
    root = tmp_path / "rootfs" / "usr" / "bin"
    root.mkdir(parents=True)
    env = bytearray(Path(shutil.which("env")).read_bytes())
    if image_from == "aarch64":
        env[18:20] = (183).to_bytes(2, "little")  # e_machine EM_AARCH64
    (root / "env").write_bytes(bytes(env))
    image = squash(tmp_path / "rootfs", scratch / "bert-squad" / "bert-squad-alps.sqsh", timeout=120)
    monkeypatch.setenv("BERT_SQUAD_SCRATCH", str(scratch))
    for var in (
        "BERT_SQUAD_IMAGE",
        "BERT_SQUAD_EDF",
        "BERT_SQUAD_CACHE",
        "BERT_SQUAD_WORK",
        "BERT_SQUAD_RUNTIME",
        "BERT_SQUAD_LAUNCHER",
    ):
        monkeypatch.delenv(var, raising=False)
    return image


def test_daint_submission_with_its_inputs_reaches_sbatch(tmp_path, monkeypatch, capsys):
    daint_inputs(tmp_path, monkeypatch, image_from="aarch64")
    sent = fake_sbatch(tmp_path, monkeypatch)
    assert cli.main(["launch", "--site", "daint", "--submit"]) == 0
    assert capsys.readouterr().out == "Submitted batch job 42\n"
    assert sent.read_text().splitlines() == dry_run(capsys, "--site", "daint")[0][1:]


@pytest.mark.parametrize("case", ["edf", "image", "arch", "mount", "launcher"])
def test_what_a_daint_job_cannot_start_without_is_refused_at_submit(tmp_path, monkeypatch, capsys, case):
    """One line naming the file, exit 2, and nothing sent to sbatch: the job script's own checks, run on the
    submit host (the same lines refuse it when the job starts)."""
    image = daint_inputs(tmp_path, monkeypatch, image_from="aarch64" if case != "arch" else "/bin")
    sent = fake_sbatch(tmp_path, monkeypatch)
    expected = {
        "edf": f"BERT_SQUAD_EDF={tmp_path}/no.toml: no such file",
        "image": f"image {tmp_path}/absent.sqsh is absent",
        "arch": f"image {image} is built for x86_64, the nodes run aarch64",
        "mount": f"mount source {tmp_path}/no-cache does not exist",
        "launcher": "BERT_SQUAD_RUNTIME=ce starts the containers through srun",
    }[case]
    monkeypatch.setenv(
        *{
            "edf": ("BERT_SQUAD_EDF", f"{tmp_path}/no.toml"),
            "image": ("BERT_SQUAD_IMAGE", f"{tmp_path}/absent.sqsh"),
            "arch": ("BERT_SQUAD_RUNTIME", "ce"),
            "mount": ("BERT_SQUAD_CACHE", f"{tmp_path}/no-cache"),
            "launcher": ("BERT_SQUAD_LAUNCHER", "mpirun"),
        }[case]
    )
    assert cli.main(["launch", "--site", "daint", "--submit"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bert-squad launch: error: ") and expected in err, err
    assert not sent.exists()


def test_cache_check_follows_the_python_layout(tmp_path, capsys):
    """The job's fail-fast check is `bert-squad check-cache`: it looks where bert_squad.cache puts things."""

    def check(*args):
        code = cli.main(["check-cache", "--cache-dir", str(tmp_path), "--output-dir", str(tmp_path / "out"), *args])
        return code, capsys.readouterr().err

    assert check("--model", "org/bert")[0] == 2
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    put_in_hub_cache(cache.hub_dir(tmp_path), "org/bert", model)
    code, err = check("--model=org/bert", "--dataset", "squad_v2")
    assert code == 2 and "dataset 'squad_v2'" in err
    cache.dataset_dir(tmp_path, "squad_v2").mkdir(parents=True)
    (cache.dataset_dir(tmp_path, "squad_v2") / "dataset_dict.json").write_text("{}")
    assert check("--model=org/bert", "--dataset", "squad_v2")[0] == 0
    assert (
        check("--model", "org/other", "--train-file", str(ROOT / "bert_squad" / "sample" / "train-v1.1.json"))[0] == 2
    )
    assert check("--download-only")[0] == 2
    assert "check-cache" in JOB_SH.read_text()


def test_cache_check_refuses_an_output_dir_it_cannot_write(tmp_path, capsys):
    """Run inside the job's image before the ranks start, so a read-only place there fails in one line."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    train = str(ROOT / "bert_squad" / "sample" / "train-v1.1.json")
    code = cli.main(["check-cache", "--model", str(model), "--train-file", train, "--output-dir", "/proc/1/out"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "/proc/1/out: output dir cannot be written" in err, err


@pytest.mark.parametrize("var", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_model_in_the_users_hugging_face_cache_is_found_by_name(var, tiny_model, tmp_path):
    hf_home = tmp_path / "hf"
    snapshot = put_in_hub_cache(hf_home / "hub", "org/tiny", tiny_model)
    env = dict(os.environ, **{var: str(hf_home if var == "HF_HOME" else hf_home / "hub")})
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "bert_squad",
            "check-cache",
            "--model",
            "org/tiny",
            "--train-file",
            str(ROOT / "bert_squad" / "sample" / "train-v1.1.json"),
            "--cache-dir",
            str(tmp_path / "empty"),
            "--output-dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"model: {snapshot}"


def test_scripts_pass_shellcheck():
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (apt-get install shellcheck, or `make system-deps`)")
    # The job scripts, and the suite's own (tests/run.sh runs the sessions, .ci/run is CI's entry).
    paths = [
        *sorted((ROOT / "slurm").glob("*.sbatch")),
        JOB_SH,
        *sorted((ROOT / "tests").glob("*.sh")),
        ROOT / ".ci" / "run",
    ]
    proc = subprocess.run(
        ["shellcheck", "-S", "error", "-s", "bash", *map(str, paths)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout
    for path in paths:
        assert subprocess.run(["bash", "-n", str(path)], timeout=60).returncode == 0, path


@pytest.mark.parametrize(
    "extra, refused",
    [
        (["--train-file", "nowhere.json", "--resume", "auto"], f"nowhere.json: no such file in {ROOT}, where the job"),
        (
            ["--train-file", "bert_squad/sample/train-v1.1.json", "--deepspeed-config", "ds_fp33", "--resume", "auto"],
            f"ds_fp33: no such file in {ROOT}, where the job resolves it",
        ),
        (
            ["--train-file", "bert_squad/sample/train-v1.1.json", "--requeue-job"],
            "--requeue: the requeued job trains again into its --output-dir; add --resume auto",
        ),
    ],
    ids=["train file", "config name", "requeue without resume"],
)
def test_a_dry_run_says_what_submit_would_refuse(extra, refused, tmp_path, monkeypatch, capsys):
    """The dry run prints its command and, in one line on stderr, what --submit would refuse (exit 0: it may run
    where the job's inputs are not); --submit refuses it in that line, before sbatch."""
    monkeypatch.setenv("BERT_SQUAD_REPO", str(ROOT))
    monkeypatch.setenv("BERT_SQUAD_RUNTIME", "none")
    monkeypatch.setenv("BERT_SQUAD_SCRATCH", str(tmp_path))
    sent = fake_sbatch(tmp_path, monkeypatch)
    requeue = ["--requeue"] if "--requeue-job" in extra else []
    argv = ["launch", "--site", "generic", *requeue, "--", "--model", "m", *[w for w in extra if w != "--requeue-job"]]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith("# files: ") and "sbatch " in out.splitlines()[-1]
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"note: --submit would refuse this here: {refused}")
    assert cli.main([*argv[:3], "--submit", *argv[3:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bert-squad launch: error: {refused}"), err
    assert not sent.exists()

"""`bert-squad launch`: the site renders, the checked-in slurm/ scripts, input errors, shellcheck."""

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from bert_squad import cache, cli
from bert_squad.cluster import edf, launch
from helpers import PYTHON, ROOT, put_in_hub_cache, tomllib
from slurm_jobs import finished, sbatch_lines, stored_script, submitting_env

SITES = ("daint", "lumi", "generic")


def render(capsys, *argv):
    assert cli.main(["launch", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("site", SITES)
def test_checked_in_scripts_are_the_site_renders(capsys, site):
    rendered = render(capsys, "--site", site, "--dry-run")
    assert (ROOT / "slurm" / f"{site}.sbatch").read_text() == rendered, (
        f"slurm/{site}.sbatch is stale: regenerate with `make slurm-renders`")


@pytest.mark.parametrize("nodes", [1, 8])
def test_daint_render(capsys, nodes):
    """Daint on Alps (cscs-docs running/slurm.md, clusters/daint.md): 4 ranks a GH200 node, one GPU each through
    --gpus-per-task, 72 Grace cores each, srun with the Container Engine's --environment, bf16."""
    script = render(capsys, "--site", "daint", "--nodes", str(nodes), "--dry-run")
    opts = sbatch_lines(script)
    assert opts["nodes"] == str(nodes) and opts["ntasks-per-node"] == "4" and opts["gpus-per-task"] == "1"
    assert opts["cpus-per-task"] == "72" and opts["partition"] == "normal" and "gpus-per-node" not in opts
    assert "constraint" not in opts and opts["signal"] == "B:USR1@300"
    assert not re.search(r"^module ", script, re.M)  # no Cray modules: the CE brings the software stack
    assert "RUNTIME=${BERT_SQUAD_RUNTIME:-ce}" in script and "LAUNCHER=${BERT_SQUAD_LAUNCHER:-srun}" in script
    assert 'SCRATCH_DIR=${BERT_SQUAD_SCRATCH:-"/capstor/scratch/cscs/$USER"}' in script
    assert 'IMAGE=${BERT_SQUAD_IMAGE:-"$BERT_SQUAD_WORK/bert-squad-cuda.sqsh"}' in script
    # Slurm binds one GPU to each task; the ranks narrow nothing themselves.
    assert "export BERT_SQUAD_GPU_ENV=\n" in script and 'BERT_SQUAD_NETWORK="ofi"' in script
    assert 'CONTAINER=("--environment=$EDF"' in script
    assert 'com.hooks.aws_ofi_nccl.enabled = "true"' in script
    assert '"configs/ds_bf16.json"' in script and '"--resume" "auto"' in script
    assert f"bert-squad launch --site daint --nodes {nodes} --dry-run" in script


def edf_of(script, tmp_path, image, mounts, repo):
    """The EDF that `script`'s write_edf writes for these values (the job's own function, run here)."""
    functions = re.search(r"^toml\(\).*?^}$", script, re.M | re.S).group(0)
    env_line = re.search(r"^export HF_HOME=.*$", script, re.M).group(0)
    names = re.search(r"^CONTAINER_ENV=.*$", script, re.M).group(0)
    path = tmp_path / "edf" / "job.toml"
    body = (f"set -euo pipefail\nBERT_SQUAD_CACHE={shlex.quote(str(tmp_path))}/cache\n{env_line}\n{names}\n"
            f"IMAGE={shlex.quote(str(image))}; BERT_SQUAD_REPO={shlex.quote(str(repo))}; SLURM_JOB_ID=7\n"
            f"MOUNTS=({' '.join(shlex.quote(str(m)) for m in mounts)})\n{functions}\nwrite_edf {shlex.quote(str(path))}")
    proc = subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in path.parent.iterdir()] == ["job.toml"]  # no temporary file left beside it
    return path


def test_daint_edf_is_toml_with_the_reference_keys(capsys, tmp_path):
    """The EDF the Daint job writes parses as TOML and uses only the EDF reference's keys, with their types
    (cscs-docs software/container-engine/edf.md), with the AWS OFI NCCL hook (resource-hook.md)."""
    odd = tmp_path / 'a "quoted" \\ dir'
    path = edf_of(render(capsys, "--site", "daint"), tmp_path, "/img/x.sqsh", [tmp_path / "scratch", odd], ROOT)
    doc = tomllib.loads(path.read_text())
    assert edf.problems(doc) == []
    assert doc["image"] == "/img/x.sqsh" and doc["workdir"] == str(ROOT)
    assert doc["mounts"] == [f"{tmp_path}/scratch:{tmp_path}/scratch", f"{odd}:{odd}"]
    assert doc["env"] == {"HF_HOME": f"{tmp_path}/cache/hf", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                          "TRANSFORMERS_OFFLINE": "1"}
    assert doc["annotations"] == {"com": {"hooks": {"aws_ofi_nccl": {"enabled": "true", "variant": "cuda-dl"}}}}


def test_edf_problems_name_what_the_reference_does_not_have():
    doc = {"image": 3, "mount": [], "mounts": ["/a"], "env": {"A": 1}, "annotations": {"x": {"y": True}}, "writable": True}
    assert edf.problems(doc) == [
        "image: a int, the reference says str", "mount: not an EDF entry (the reference has base_environment, image, "
        "workdir, entrypoint, writable, mounts, env, annotations)", "mounts[0]: '/a' is not SOURCE:DESTINATION[:FLAGS]",
        "env.A: values are strings in the reference, not int", "annotations.x.y: values are strings in the reference, "
        "not bool"]


@pytest.mark.parametrize("nodes", [1, 8])
def test_lumi_render(capsys, nodes):
    script = render(capsys, "--site", "lumi", "--nodes", str(nodes))
    opts = sbatch_lines(script)
    assert opts["nodes"] == str(nodes)
    # One rank per GCD, 7 of the 56 usable cores each, the CPU masks that sit next to each GCD.
    assert opts["ntasks-per-node"] == "8" and opts["gpus-per-node"] == "8" and opts["cpus-per-task"] == "7"
    assert opts["partition"] == "standard-g" and opts["signal"] == "B:USR1@300"
    assert ('CPU_BIND="mask_cpu:fe000000000000,fe00000000000000,fe0000,fe000000,fe,fe00,fe00000000,fe0000000000"'
            in script)
    masks = [int(m, 16) for m in re.search(r"mask_cpu:([\w,]+)", script).group(1).split(",")]
    assert all(bin(m).count("1") == 7 for m in masks) and not any(m & (1 << (8 * i)) for m in masks for i in range(8))
    assert "RUNTIME=${BERT_SQUAD_RUNTIME:-singularity}" in script and "export BERT_SQUAD_GPU_ENV=ROCR_VISIBLE_DEVICES" in script
    # lumi-userguide software/packages/pytorch.md; LUMI-AI-Guide 02-setting-up-environment/README.md.
    for var in ('NCCL_SOCKET_IFNAME="hsn"', 'NCCL_NET_GDR_LEVEL="3"', 'CXI_FORK_SAFE="1"', 'FI_CXI_DISABLE_CQ_HUGETLB="1"'):
        assert f"export {var}" in script
    assert "module purge\nmodule use /appl/local/laifs/modules\nmodule load lumi-aif-singularity-bindings\n" in script
    assert 'BERT_SQUAD_NETWORK="ofi"' in script
    # The package and what the LUMI AI Factory image lacks: a venv in a SquashFS file at /user-software.
    assert 'export SINGULARITYENV_PREPEND_PATH="/user-software/bin"' in script
    assert 'SITE_RUNTIME_FLAGS="-B $BERT_SQUAD_WORK/bert-squad-env.sqsh:/user-software:image-src=/"' in script
    assert re.search(r'IMAGE=\$\{BERT_SQUAD_IMAGE:-"/appl/local/laifs/containers/\S+/lumi-multitorch-full-\S+\.sif"\}', script)
    assert '"configs/ds_bf16.json"' in script


def test_partial_lumi_node_drops_the_gcd_masks(capsys):
    script = render(capsys, "--site", "lumi", "--gpus-per-node", "2")
    assert sbatch_lines(script)["ntasks-per-node"] == "2" and 'CPU_BIND=""' in script


def test_options_and_training_arguments(capsys):
    script = render(capsys, "--site", "generic", "--nodes", "2", "--gpus-per-node", "4", "--time", "1-00:00:00",
                    "--account", "proj_1", "--partition", "gpu", "--requeue", "--",
                    "--epochs", "3", "--output-dir", "runs/a b", "--seed", "$HOME")
    opts = sbatch_lines(script)
    assert (opts["nodes"], opts["ntasks-per-node"], opts["gpus-per-node"]) == ("2", "4", "4")
    assert (opts["time"], opts["account"], opts["partition"]) == ("1-00:00:00", "proj_1", "gpu")
    assert "requeue" in opts and opts["open-mode"] == "append" and "REQUEUE=${BERT_SQUAD_REQUEUE:-1}" in script
    # User arguments are literal words: quoted, never expanded by the batch shell.
    line = re.findall(r"^  TRAIN_ARGS=\((.*)\)$", script, re.M)[-1]  # the defaults, after ("$@")
    words = subprocess.run(["bash", "-c", f"a=({line}); printf '%s\\n' \"${{a[@]}}\""],
                           capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert words == ["--epochs", "3", "--output-dir", "runs/a b", "--seed", "$HOME"]


@pytest.mark.parametrize("argv,message", [
    (["--site", "daint", "--nodes", "0"], "--nodes 0"),
    (["--site", "lumi", "--gpus-per-node", "9"], "has 8 GPU(s)"),
    (["--site", "daint", "--gpus-per-node", "5"], "a daint node has 4 GPU(s)"),
    (["--site", "lumi", "--time", "1 hour"], "--time"),
    (["--site", "lumi", "--account", "x;rm"], "--account"),
])
def test_bad_options_are_one_line_errors(capsys, argv, message):
    assert cli.main(["launch", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bert-squad launch: error:") and message in err


@pytest.mark.slurm
@pytest.mark.slow
def test_submit_runs_the_rendered_script_on_the_test_slurm(slurm_cluster, tiny_model, tmp_path, monkeypatch, capsys):
    """`launch --submit` from the checkout hands the real sbatch exactly the script --dry-run prints (Slurm
    keeps it), with its options, and the job trains."""
    out = tmp_path / "model"
    train = ["--model", str(tiny_model), "--train-file", "bert_squad/sample/train-v1.1.json", "--max-steps", "1",
             "--max-seq-length", "96", "--doc-stride", "16", "--no-eval", "--output-dir", str(out),
             "--cache-dir", str(tmp_path / "cache")]
    submitting_env(monkeypatch, slurm_cluster, tmp_path)
    monkeypatch.chdir(ROOT)
    own = ["--site", "generic", "--time", "00:10:00"]
    script = render(capsys, *own, "--dry-run", "--", *train)
    assert cli.main(["launch", *own, "--submit", "--", *train]) == 0
    job = re.search(r"^Submitted batch job (\d+)$", capsys.readouterr().out, re.M).group(1)
    assert stored_script(slurm_cluster, job) == script
    info, text = finished(slurm_cluster, job, tmp_path / f"job-{job}.out", timeout=600)
    assert info["JobState"] == "COMPLETED" and info["TimeLimit"] == "00:10:00", f"{info}\n{text[-3000:]}"
    assert json.loads((out / "train_metrics.json").read_text())["steps"] == 1


def test_a_requeue_switch_that_is_no_switch_is_refused_by_the_job(tmp_path):
    """BERT_SQUAD_REQUEUE=yes was read as 0 (no requeue) without a word; the job script says so and stops."""
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "1", "BERT_SQUAD_REPO": str(ROOT), "BERT_SQUAD_REQUEUE": "yes"}
    proc = subprocess.run(["bash", str(ROOT / "slurm" / "generic.sbatch")], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "bert-squad: error: BERT_SQUAD_REQUEUE=yes: use 1 (requeue after a checkpointed stop) or 0"], proc.stderr


def fake_sbatch(tmp_path, monkeypatch):
    """sbatch as a script that keeps what it was given; PATH keeps bash, od and unsquashfs."""
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ncat > {tmp_path}/script\necho 'Submitted batch job 42'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin:/usr/sbin:/sbin")
    return tmp_path / "script"


def daint_inputs(tmp_path, monkeypatch, image_from="/bin"):
    """A Daint submission's world: a scratch with a cache, and a SquashFS image whose /usr/bin/env is this
    machine's (x86_64) or a copy whose ELF header says aarch64."""
    if not shutil.which("mksquashfs", path="/usr/bin:/usr/sbin"):
        pytest.skip("mksquashfs is not installed (apt-get install squashfs-tools, or `make system-deps`)")
    scratch = tmp_path / "scratch"
    (scratch / "bert-squad" / "cache").mkdir(parents=True)
    root = tmp_path / "rootfs" / "usr" / "bin"
    root.mkdir(parents=True)
    env = bytearray(Path(shutil.which("env")).read_bytes())
    if image_from == "aarch64":
        env[18:20] = (183).to_bytes(2, "little")  # e_machine EM_AARCH64
    (root / "env").write_bytes(bytes(env))
    image = scratch / "bert-squad" / "bert-squad-cuda.sqsh"
    subprocess.run(["mksquashfs", str(tmp_path / "rootfs"), str(image), "-noappend", "-quiet", "-no-progress"],
                   check=True, capture_output=True, timeout=120)
    monkeypatch.setenv("BERT_SQUAD_SCRATCH", str(scratch))
    for var in ("BERT_SQUAD_IMAGE", "BERT_SQUAD_EDF", "BERT_SQUAD_CACHE", "BERT_SQUAD_WORK", "BERT_SQUAD_RUNTIME",
                "BERT_SQUAD_LAUNCHER"):
        monkeypatch.delenv(var, raising=False)
    return image


def test_daint_submission_with_its_inputs_reaches_sbatch(tmp_path, monkeypatch, capsys):
    daint_inputs(tmp_path, monkeypatch, image_from="aarch64")
    sent = fake_sbatch(tmp_path, monkeypatch)
    assert cli.main(["launch", "--site", "daint", "--submit"]) == 0
    assert capsys.readouterr().out == "Submitted batch job 42\n"
    assert sent.read_text() == render(capsys, "--site", "daint")


@pytest.mark.parametrize("case", ["edf", "image", "arch", "mount", "launcher"])
def test_what_a_daint_job_cannot_start_without_is_refused_at_submit(tmp_path, monkeypatch, capsys, case):
    """One line naming the file, exit 2, and nothing sent to sbatch: the job script's own checks, run on the
    submit host (the same lines refuse it when the job starts)."""
    image = daint_inputs(tmp_path, monkeypatch, image_from="aarch64" if case != "arch" else "/bin")
    sent = fake_sbatch(tmp_path, monkeypatch)
    expected = {
        "edf": f"BERT_SQUAD_EDF={tmp_path}/no.toml: no such file",
        "image": f"image {tmp_path}/absent.sqsh is absent",
        "arch": f"image {image} is built for x86_64, a daint node runs aarch64",
        "mount": f"mount source {tmp_path}/no-cache does not exist",
        "launcher": "BERT_SQUAD_RUNTIME=ce starts the containers through srun",
    }[case]
    monkeypatch.setenv(*{"edf": ("BERT_SQUAD_EDF", f"{tmp_path}/no.toml"),
                         "image": ("BERT_SQUAD_IMAGE", f"{tmp_path}/absent.sqsh"),
                         "arch": ("BERT_SQUAD_RUNTIME", "ce"),
                         "mount": ("BERT_SQUAD_CACHE", f"{tmp_path}/no-cache"),
                         "launcher": ("BERT_SQUAD_LAUNCHER", "mpirun")}[case])
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
    assert check("--model", "org/other", "--train-file", "x.json")[0] == 2
    assert check("--download-only")[0] == 2
    assert "check-cache" in launch.TEMPLATE_FILE.read_text()


def test_cache_check_refuses_an_output_dir_it_cannot_write(tmp_path, capsys):
    """Run inside the job's image before the ranks start, so a read-only place there fails in one line."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    code = cli.main(["check-cache", "--model", str(model), "--train-file", "x.json", "--output-dir", "/proc/1/out"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "/proc/1/out: output dir cannot be written" in err, err


@pytest.mark.parametrize("var", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_model_in_the_users_hugging_face_cache_is_found_by_name(var, tiny_model, tmp_path):
    hf_home = tmp_path / "hf"
    snapshot = put_in_hub_cache(hf_home / "hub", "org/tiny", tiny_model)
    env = dict(os.environ, **{var: str(hf_home if var == "HF_HOME" else hf_home / "hub")})
    proc = subprocess.run([PYTHON, "-m", "bert_squad", "check-cache", "--model", "org/tiny", "--train-file", "x.json",
                           "--cache-dir", str(tmp_path / "empty"), "--output-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"model: {snapshot}"


def _scripts(tmp_path, capsys):
    paths = sorted((ROOT / "slurm").iterdir())
    for site in ("daint", "lumi"):
        for nodes in ("1", "8"):
            path = tmp_path / f"{site}-{nodes}.sbatch"
            path.write_text(render(capsys, "--site", site, "--nodes", nodes, "--requeue", "--", "--epochs", "1"))
            paths.append(path)
    return paths


def test_scripts_pass_shellcheck(tmp_path, capsys):
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (apt-get install shellcheck, or `make system-deps`)")
    paths = _scripts(tmp_path, capsys)
    proc = subprocess.run(["shellcheck", "-S", "error", "-s", "bash", *map(str, paths)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout
    for path in paths:
        assert subprocess.run(["bash", "-n", str(path)], timeout=60).returncode == 0, path

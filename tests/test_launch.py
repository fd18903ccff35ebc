"""`bert-squad launch`: the site renders, the checked-in slurm/ scripts, input errors, shellcheck."""

import json
import os
import re
import shutil
import subprocess

import pytest

from bert_squad import cache, cli
from bert_squad.cluster import launch
from conftest import PYTHON, ROOT, put_in_hub_cache
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
    script = render(capsys, "--site", "daint", "--nodes", str(nodes), "--dry-run")
    opts = sbatch_lines(script)
    assert opts["nodes"] == str(nodes) and opts["ntasks-per-node"] == "1" and opts["cpus-per-task"] == "12"
    assert opts["constraint"] == "gpu" and "gpus-per-node" not in opts
    assert opts["signal"] == "B:USR1@300"
    for module in ("daint-gpu", "sarus", "openmpi"):
        assert f"module load {module}\n" in script
    assert "RUNTIME=${BERT_SQUAD_RUNTIME:-sarus}" in script and "LAUNCHER=${BERT_SQUAD_LAUNCHER:-mpirun}" in script
    assert 'IMAGE=${BERT_SQUAD_IMAGE:-"load/library/bert-squad:cuda"}' in script
    assert "export BERT_SQUAD_GPU_ENV=CUDA_VISIBLE_DEVICES" in script
    assert '"configs/ds_fp16.json"' in script and '"--resume" "auto"' in script
    assert f"bert-squad launch --site daint --nodes {nodes} --dry-run" in script


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
    for var in ("NCCL_SOCKET_IFNAME=\"hsn0,hsn1,hsn2,hsn3\"", "NCCL_NET_GDR_LEVEL=\"PHB\"", "CXI_FORK_SAFE=\"1\""):
        assert f"export {var}" in script
    assert "module load singularity-AI-bindings" in script and "module load aws-ofi-rccl" in script
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
    (["--site", "daint", "--gpus-per-node", "2"], "has 1 GPU(s)"),
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


def test_cache_check_follows_the_python_layout(tmp_path, capsys):
    """The job's fail-fast check is `bert-squad check-cache`: it looks where bert_squad.cache puts things."""
    def check(*args):
        code = cli.main(["check-cache", "--cache-dir", str(tmp_path), *args])
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


@pytest.mark.parametrize("var", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_model_in_the_users_hugging_face_cache_is_found_by_name(var, tiny_model, tmp_path):
    hf_home = tmp_path / "hf"
    snapshot = put_in_hub_cache(hf_home / "hub", "org/tiny", tiny_model)
    env = dict(os.environ, **{var: str(hf_home if var == "HF_HOME" else hf_home / "hub")})
    proc = subprocess.run([PYTHON, "-m", "bert_squad", "check-cache", "--model", "org/tiny", "--train-file", "x.json",
                           "--cache-dir", str(tmp_path / "empty")], capture_output=True, text=True, env=env,
                          timeout=300)
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

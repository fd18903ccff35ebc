"""`bert-squad sweep` and `bert-squad summarize`: parsing, naming, skipping, the sbatch command, and a real array
job."""

import csv
import json
import re
import shlex
import subprocess
import sys

import pytest
from helpers import ROOT, window_args
from slurm_jobs import job_env, job_train_args, paused, stored_script, submitting_env

from bert_squad import cli, outputs
from bert_squad.cluster import launch, sweep
from bert_squad.errors import UserError


def dry_run(capsys, *argv):
    assert cli.main(["sweep", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.mark.parametrize("text,seeds", [("1-3", [1, 2, 3]), ("5", [5]), ("1,3,5", [1, 3, 5]), ("0-1,7", [0, 1, 7])])
def test_seeds(text, seeds):
    assert sweep.parse_seeds(text) == seeds


def test_grid_maps_keys_to_training_flags():
    grid = sweep.parse_grid(
        ["learning_rate=3e-5,5e-5", "epochs=2,3", "config=configs/ds_bf16.json", "max-seq-length=128"]
    )
    assert [(k, f, v) for k, f, v in grid] == [
        ("learning_rate", "--learning-rate", ["3e-5", "5e-5"]),
        ("epochs", "--epochs", ["2", "3"]),
        ("config", "--deepspeed-config", ["configs/ds_bf16.json"]),
        ("max_seq_length", "--max-seq-length", ["128"]),
    ]


def test_combinations_name_group_and_order():
    grid = sweep.parse_grid(["learning_rate=3e-5,5e-5", "deepspeed_config=configs/ds_bf16.json"])
    combos = sweep.combinations(grid, [1, 2])
    assert [c["index"] for c in combos] == [0, 1, 2, 3]
    assert combos[1]["name"] == "learning_rate=3e-5_deepspeed_config=ds_bf16.json_seed=2"
    assert combos[1]["group"] == "learning_rate=3e-5,deepspeed_config=ds_bf16.json" and combos[1]["seed"] == 2
    assert combos[2]["args"] == ["--learning-rate", "5e-5", "--deepspeed-config", "configs/ds_bf16.json"]
    assert [c["name"] for c in sweep.combinations([], [4])] == ["seed=4"]


def test_array_spec():
    assert sweep.array_spec([0, 1]) == "0-1"
    assert sweep.array_spec([1, 3], 2) == "1,3%2"
    assert sweep.array_spec([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_done_needs_final_metrics(tmp_path):
    """train_metrics.json is written last (after the evaluation): it alone says a run finished."""
    (tmp_path / "eval_metrics.json").write_text("{}")
    assert not outputs.finished(tmp_path)
    (tmp_path / "train_metrics.json").write_text("{}")
    assert outputs.finished(tmp_path)


TRAIN = ["--model", "m", "--train-file", "t.json", "--max-steps", "3"]


def command(out):
    """(the sbatch command's words, its environment, every option the job gets) of a dry run's output."""
    words = shlex.split(out.strip().splitlines()[-1])
    env = dict(w.split("=", 1) for w in words[: words.index("sbatch")])
    asks = dict(re.findall(r"--([\w-]+)(?:=(\S*))?", re.search(r"^# asks for: (.*)$", out, re.M).group(1)))
    return words[words.index("sbatch") :], env, asks


def test_dry_run_is_one_array_job(capsys, tmp_path):
    argv, env, opts = command(
        dry_run(capsys, "--site", "generic", "--seeds", "1-2", "--runs-dir", str(tmp_path), "--", *TRAIN)
    )
    assert opts["array"] == "0-1" and opts["ntasks-per-node"] == "1" and opts["job-name"] == "bert-squad-sweep-seeds"
    assert opts["output"] == f"{tmp_path}/seeds/slurm-%A_%a.out"
    # Every array task runs the sweep's own action (slurm/job.sh: BERT_SQUAD_SWEEP_DIR) on the training arguments.
    assert env == {"BERT_SQUAD_SWEEP_DIR": f"{tmp_path}/seeds"}
    assert argv[-len(TRAIN) - 1 :] == [str(ROOT / "slurm" / "generic.sbatch"), *TRAIN]
    # a dry run writes the manifest alone, for `sweep run --index N` here
    assert [p.name for p in (tmp_path / "seeds").iterdir()] == ["sweep.json"]


def test_grid_gpus_and_parallel(capsys, tmp_path):
    argv, env, opts = command(
        dry_run(
            capsys,
            "--site",
            "lumi",
            "--seeds",
            "1-3",
            "--grid",
            "learning_rate=3e-5,5e-5",
            "--gpus-per-run",
            "2",
            "--max-parallel",
            "4",
            "--requeue",
            "--time",
            "2:00:00",
            "--runs-dir",
            str(tmp_path),
            "--name",
            "lr",
        )
    )
    assert opts["array"] == "0-5%4" and opts["ntasks-per-node"] == "2" and opts["gpus-per-node"] == "2"
    assert opts["time"] == "2:00:00" and "requeue" in opts and opts["partition"] == "small-g"
    assert env == {"BERT_SQUAD_REQUEUE": "1", "BERT_SQUAD_SWEEP_DIR": str(tmp_path / "lr")}
    # No training arguments: the site's defaults, less its own --output-dir/--resume.
    script = argv.index(str(ROOT / "slurm" / "lumi.sbatch"))
    assert argv[script + 1 :] == ["--deepspeed-config", "ds_bf16", "--epochs", "2", "--checkpoint-every", "500"]


@pytest.mark.parametrize("sweep_dir,expected", [("/s/lr", "sweep run /s/lr|--output-dir /s/lr"), ("", "--epochs 1|")])
def test_a_sweep_task_runs_the_sweeps_action(sweep_dir, expected):
    """slurm/job.sh: with BERT_SQUAD_SWEEP_DIR each rank runs `sweep run DIR`, which takes its training arguments
    from the manifest, and the cache check proves DIR writable; without, the ranks train on the job's arguments."""
    block = re.search(r"^RANK_ARGS=.*?^fi$", (ROOT / "slurm" / "job.sh").read_text(), re.M | re.S).group(0)
    proc = subprocess.run(
        ["bash", "-c", f'TRAIN_ARGS=(--epochs 1)\n{block}\necho "${{RANK_ARGS[*]}}|${{CHECK_ARGS[*]}}"'],
        capture_output=True,
        text=True,
        env={"BERT_SQUAD_SWEEP_DIR": sweep_dir},
        timeout=60,
    )
    assert proc.stdout.strip() == expected, proc.stderr


def test_a_sweep_task_trains_on_the_manifests_arguments(tmp_path, capsys):
    """`sweep run DIR --index N` by hand is what the array task runs: the manifest's training arguments, then
    the combination's, its seed and run directory (here a window the training refuses, so nothing trains)."""
    combos = sweep.combinations(sweep.parse_grid(["doc_stride=32,90"]), [1])
    manifest = {"name": "s", "site": "generic", "train_args": ["--max-seq-length", "96"], "combinations": combos}
    (tmp_path / "sweep.json").write_text(json.dumps(manifest))
    assert sweep.run_task(sweep.parse_task([str(tmp_path), "--index", "1"])) == 2
    assert "--doc-stride 90 must leave room" in capsys.readouterr().err  # 96 tokens: the manifest's
    assert (tmp_path / combos[1]["name"] / "exit_code").read_text() == "2\n"
    with pytest.raises(UserError, match="unrecognized arguments: -- --epochs 1"):
        sweep.parse_task([str(tmp_path), "--index", "0", "--", "--epochs", "1"])


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--seeds", "3-1"], "runs backwards"),
        (["--seeds", "1,x"], "--seeds"),
        (["--seeds", "1,1"], "listed twice"),
        (["--seeds", "1", "--grid", "warp_speed=9"], "warp_speed is not a training option that takes a value (see"),
        (["--seeds", "1", "--grid", "lerning-rate=1e-5"], "(did you mean learning_rate?)"),
        (["--seeds", "1", "--grid", "confg=ds_fp32"], "(did you mean config?)"),
        (["--seeds", "1", "--grid", "learning_rate"], "key=value1,value2"),
        (["--seeds", "1", "--grid", "epochs=two"], "'two' is not a valid --epochs value"),
        (["--seeds", "1", "--grid", "seed=1,2"], "same for every run"),
        (["--seeds", "1", "--grid", "model=a,b"], "same for every run"),
        (["--seeds", "1", "--grid", "no_eval=1"], "takes a value"),
        (["--seeds", "1", "--max-parallel", "0"], "--max-parallel"),
        (["--seeds", "1", "--", "--output-dir", "x"], "the sweep sets"),
        (["--seeds", "1", "--", "--output_dir", "x"], "--output_dir: the sweep sets --output-dir, --seed, --resume"),
        # Every grid point's training arguments are checked, at a dry run too: its DeepSpeed config where the job
        # starts, its values, and how they go with the common ones.
        (["--seeds", "1", "--grid", "config=ds_fp32,ds_zero9", "--dry-run"], "with config=ds_zero9: ds_zero9: no such"),
        (["--seeds", "1", "--grid", "config=ds_fp32,ds_bf61", "--dry-run"], "; did you mean 'ds_bf16'?"),
        (["--seeds", "1", "--grid", "warmup_ratio=0.1,1.5"], "with warmup_ratio=1.5: --warmup-ratio 1.5: must be"),
        (
            ["--seeds", "1", "--grid", "max_seq_length=384,96", "--", "--doc-stride", "64"],
            "with max_seq_length=96: --doc-stride 64 must leave room",
        ),
        (["--seeds", "1", "--", "--epochz", "1"], "unrecognized arguments: --epochz"),
        (["--seeds", "1", "--", "--max-seq-length", "96", "--doc-stride", "32"], "--doc-stride 32 must leave room"),
    ],
)
def test_bad_input_is_one_line_error(capsys, argv, message):
    assert cli.main(["sweep", "--site", "generic", *argv]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (DeepSpeed's import may log a line first)
    assert last.startswith("bert-squad sweep: error:") and message in last, last


@pytest.mark.parametrize("used", ["submitted", "a run trained"])
def test_another_sweep_under_the_same_name_is_refused(capsys, tmp_path, used):
    """Once a sweep was submitted or one of its runs trained, another grid under its name is refused, at a dry
    run too; a manifest nothing used (a dry run's) gives way to the new one."""
    sweep_dir = tmp_path / "seeds"
    sweep_dir.mkdir()
    combos = sweep.combinations([], [7])
    (sweep_dir / "sweep.json").write_text(json.dumps({"train_args": [], "combinations": combos}))
    argv = ["sweep", "--site", "generic", "--seeds", "1", "--runs-dir", str(tmp_path)]
    assert cli.main(argv) == 0  # a plan nobody used: replaced
    assert json.loads((sweep_dir / "sweep.json").read_text())["combinations"][0]["seed"] == 1
    (sweep_dir / "sweep.json").write_text(json.dumps({"train_args": [], "combinations": combos}))
    if used == "submitted":
        (sweep_dir / "job_id").write_text("41\n")
    else:
        (sweep_dir / "seed=7").mkdir()
    for mode in ("--submit", "--dry-run"):
        assert cli.main([*argv, mode]) == 2
        assert "a different sweep" in capsys.readouterr().err
    assert json.loads((sweep_dir / "sweep.json").read_text())["combinations"] == combos


def test_a_dry_run_says_what_submit_would_refuse(capsys, tmp_path, monkeypatch):
    """A train file the job would not find: the dry run prints its command and says, in one line, that --submit
    would refuse it."""
    monkeypatch.setenv("BERT_SQUAD_REPO", str(ROOT))
    monkeypatch.setenv("BERT_SQUAD_RUNTIME", "none")
    monkeypatch.setenv("BERT_SQUAD_SCRATCH", str(tmp_path))
    argv = ["sweep", "--site", "generic", "--seeds", "1-2", "--runs-dir", str(tmp_path), "--", *TRAIN]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "sbatch " in out.splitlines()[-1]
    assert f"note: --submit would refuse this here: t.json: no such file in {ROOT}, where the job" in err, err
    assert f"bert-squad sweep run {tmp_path / 'seeds'} --index N (N from 0 to 1" in err, err


@pytest.mark.slow
def test_a_combination_of_a_dry_run_trains_here(capsys, tmp_path, tiny_model, sample_train):
    """What the dry run says to try: `sweep run DIR --index N` trains that combination here as its array task
    would, into its run directory, with its seed."""
    train = ["--model", str(tiny_model), "--train-file", str(sample_train), "--max-steps", "1", "--no-eval"]
    train += [*window_args(96, 16, None), "--cache-dir", str(tmp_path / "cache")]
    argv = ["sweep", "--site", "generic", "--seeds", "3-4", "--runs-dir", str(tmp_path), "--dry-run", "--", *train]
    assert cli.main(argv) == 0
    shown = re.search(r"try a combination here with bert-squad (sweep run \S+ --index) N", capsys.readouterr().err)
    assert cli.main([*shown.group(1).split(), "1"]) == 0
    run = tmp_path / "seeds" / "seed=4"
    assert json.loads((run / "train_metrics.json").read_text())["config"]["train"]["seed"] == 4
    assert (run / "exit_code").read_text() == "0\n"


def fake_sweep(tmp_path):
    """Three seeds of one group and one of another: finished, failed, stopped and never started runs."""
    grid = sweep.parse_grid(["learning_rate=3e-5,5e-5"])
    combos = sweep.combinations(grid, [1, 2, 3])
    tmp_path.mkdir(exist_ok=True)
    train_args = sweep.common_args(launch.load_site("generic"), [])  # what a sweep without `--` records
    (tmp_path / "sweep.json").write_text(
        json.dumps({"name": "lr", "site": "generic", "train_args": train_args, "combinations": combos})
    )
    for combo, f1 in zip(combos[:2], (50.0, 60.0)):
        run = tmp_path / combo["name"]
        run.mkdir()
        (run / "eval_metrics.json").write_text(json.dumps({"exact_match": f1 - 10, "f1": f1}))
        (run / "train_metrics.json").write_text(json.dumps({"run_samples_per_second": 12.0, "wall_time_s": 30.0}))
        (run / "exit_code").write_text("0\n")
    for combo, code in zip(combos[2:4], ("1", "75")):
        (tmp_path / combo["name"]).mkdir()
        (tmp_path / combo["name"] / "exit_code").write_text(code + "\n")
    return combos


def test_summarize_lists_failed_and_unfinished_runs(tmp_path, capsys):
    fake_sweep(tmp_path)
    assert cli.main(["summarize", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "learning_rate=3e-5" in out and "failed (exit 1)" in out and "stopped (checkpointed" in out
    assert "not finished" in out
    rows = {r["combination"]: r for r in csv.DictReader((tmp_path / "summary.csv").open())}
    first = rows["learning_rate=3e-5"]
    assert (first["seeds"], first["finished"], first["runs"]) == ("1 2", "2", "3")
    assert (first["f1_mean"], first["f1_min"], first["f1_max"], first["f1_std"]) == ("55.00", "50.00", "60.00", "7.07")
    assert (first["em_mean"], first["samples_per_second"], first["wall_time_s"]) == ("45.00", "12.00", "30.00")
    assert rows["learning_rate=5e-5"]["finished"] == "0"  # listed, not dropped
    md = (tmp_path / "summary.md").read_text()
    assert "learning_rate=5e-5_seed=3 (seed 3): not finished" in md
    assert "learning_rate=3e-5_seed=3 (seed 3): failed (exit 1)" in md
    assert (tmp_path / "f1_by_combination.png").read_bytes()[:4] == b"\x89PNG"


def test_one_finished_seed_has_no_spread(tmp_path, capsys, monkeypatch):
    """One finished seed of a combination measures no standard deviation: "-" in the table and empty in the CSV,
    not a spread of 0."""
    combos = fake_sweep(tmp_path)
    (tmp_path / combos[1]["name"] / "train_metrics.json").unlink()  # seed 2 of learning_rate=3e-5 not finished
    monkeypatch.delenv("COLUMNS", raising=False)
    assert cli.main(["summarize", str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "learning_rate=3e-5 " in line)
    assert "40.00 ± -" in row and "50.00 ± -" in row and "± 0.00" not in row, row
    rows = {r["combination"]: r for r in csv.DictReader((tmp_path / "summary.csv").open())}
    first = rows["learning_rate=3e-5"]
    assert (first["f1_mean"], first["f1_std"], first["em_std"]) == ("50.00", "", "")


@pytest.mark.parametrize("combinations", [["default"], ["lr=3e-5", "lr=5e-5"], ["a=1", "a=2", "a=3"]])
def test_the_figures_title_is_whole_for_a_few_combinations(combinations):
    """f1_by_combination.png of one combination (a seeds-only sweep), two or three shows its title whole: the
    title's drawn box lies inside the figure."""
    from bert_squad import plots

    rows = [{"combination": c, "f1_values": [80.0, 82.0], "f1_mean": 81.0, "f1_std": 1.41} for c in combinations]
    fig = plots.f1_figure(rows)
    fig.canvas.draw()
    title, page = fig.axes[0].title.get_window_extent(), fig.bbox
    assert page.x0 <= title.x0 and title.x1 <= page.x1 and page.y0 <= title.y0 and title.y1 <= page.y1, (title, page)


def test_summarize_prints_whole_columns_to_a_file_or_pipe(tmp_path, capsys, monkeypatch):
    """Printed to a file or a pipe, the table is as wide as its columns (as on a wide enough terminal), not
    squeezed into 80 columns: each row on one line, each value whole."""
    fake_sweep(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)  # rich's own width where it is not a terminal: 80
    assert cli.main(["summarize", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) > 80
    header = next(line for line in lines if "combination" in line)
    assert all(name in header for name in ("EM mean ± std", "F1 mean ± std", "F1 min–max", "samples/s", "wall s"))
    row = next(line for line in lines if "learning_rate=3e-5 " in line)
    assert all(value in row for value in ("1 2", "2/3", "45.00 ± 7.07", "55.00 ± 7.07", "50.00–60.00", "12.0", "30"))
    assert any(line.startswith("learning_rate=5e-5_seed=3 (seed 3): not finished") for line in lines)


@pytest.mark.slurm
def test_submit_skips_finished_runs(slurm_cluster, tmp_path, monkeypatch, capsys):
    """The array the real sbatch receives leaves out the runs with final metrics; with none left, nothing
    is submitted. (The queue is paused: the array is looked at and cancelled, never run.)"""
    combos = fake_sweep(tmp_path / "lr")
    submitting_env(monkeypatch, slurm_cluster, tmp_path)
    monkeypatch.chdir(ROOT)
    argv = [
        "sweep",
        "--site",
        "generic",
        "--seeds",
        "1-3",
        "--grid",
        "learning_rate=3e-5,5e-5",
        "--runs-dir",
        str(tmp_path),
        "--name",
        "lr",
        "--submit",
    ]
    with paused(slurm_cluster):
        assert cli.main(argv) == 0
        job = (tmp_path / "lr" / "job_id").read_text().strip()
        assert slurm_cluster.job(job)["ArrayTaskId"] == "2-5"  # 0 and 1 have final metrics
    for combo in combos:
        (tmp_path / "lr" / combo["name"]).mkdir(exist_ok=True)
        for name in ("train_metrics.json", "eval_metrics.json"):
            (tmp_path / "lr" / combo["name"] / name).write_text("{}")
    capsys.readouterr()
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "nothing to run" in out and "Submitted" not in out


def test_run_needs_a_combination(tmp_path, monkeypatch):
    fake_sweep(tmp_path)
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    with pytest.raises(UserError, match="array task"):
        sweep.run_task(sweep.parse_task([str(tmp_path)]))
    with pytest.raises(UserError, match="has 6"):
        sweep.run_task(sweep.parse_task([str(tmp_path), "--index", "6"]))
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1a")
    with pytest.raises(UserError, match=r"^SLURM_ARRAY_TASK_ID=1a: not a whole number$"):
        sweep.run_task(sweep.parse_task([str(tmp_path)]))


@pytest.mark.slurm
@pytest.mark.slow
def test_two_seed_array_on_local_slurm(slurm_cluster, tiny_model, sample_train, sample_dev, tmp_path):
    runs = tmp_path / "runs"
    train = job_train_args(
        tiny_model, sample_train, None, "--eval-file", sample_dev, steps=3, windows=window_args(96, 16, None)
    )
    env = {**slurm_cluster.env, **job_env(tmp_path), "COLUMNS": "200"}  # the rich table on one line per row

    def bert_squad(*args):
        return subprocess.run(
            [sys.executable, "-m", "bert_squad", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
        )

    submit = ["sweep", "--site", "generic", "--seeds", "1-2", "--runs-dir", str(runs), "--submit", "--", *train]
    proc = bert_squad(*submit)
    assert proc.returncode == 0, proc.stderr
    array_job = re.search(r"Submitted batch job (\d+)", proc.stdout).group(1)
    sweep_dir = runs / "seeds"
    assert (sweep_dir / "job_id").read_text() == f"{array_job}\n"
    # While the array is in the queue (held there, so it cannot finish meanwhile) a second one is refused.
    slurm_cluster.run("scontrol", "hold", array_job)
    twice = bert_squad(*submit)
    slurm_cluster.run("scontrol", "release", array_job)
    assert twice.returncode == 2 and "Submitted" not in twice.stdout, twice.stdout + twice.stderr
    assert f"job {array_job} still has" in twice.stderr and f"scancel {array_job}" in twice.stderr, twice.stderr
    combos = json.loads((sweep_dir / "sweep.json").read_text())["combinations"]
    assert [c["name"] for c in combos] == ["seed=1", "seed=2"]
    ports = set()
    for task in ("0", "1"):
        info = slurm_cluster.wait(f"{array_job}_{task}", timeout=600)
        log = (sweep_dir / f"slurm-{array_job}_{task}.out").read_text()
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{log[-3000:]}"
        ports.add(re.search(r"master \S+:(\d+)", log).group(1))
    assert len(ports) == 2  # each array task is its own job: its own rendezvous port
    for combo in combos:
        run = sweep_dir / combo["name"]
        assert (run / "exit_code").read_text() == "0\n"
        metrics = json.loads((run / "train_metrics.json").read_text())
        assert metrics["steps"] == 3 and metrics["config"]["train"]["seed"] == combo["seed"]
        assert "f1" in json.loads((run / "eval_metrics.json").read_text())

    again = bert_squad(*submit)
    assert again.returncode == 0 and "nothing to run" in again.stdout, again.stderr
    assert "2 finished, 0 to run" in again.stderr and "Submitted" not in again.stdout

    summary = bert_squad("summarize", str(sweep_dir))
    assert summary.returncode == 0, summary.stderr
    assert "default" in summary.stdout and "1 2" in summary.stdout and "2/2" in summary.stdout
    rows = list(csv.DictReader((sweep_dir / "summary.csv").open()))
    assert len(rows) == 1 and (rows[0]["seeds"], rows[0]["finished"]) == ("1 2", "2")
    assert "| default | 1 2 | 2 | 2 |" in (sweep_dir / "summary.md").read_text()
    assert (sweep_dir / "f1_by_combination.png").stat().st_size > 0


@pytest.mark.slurm
def test_submit_checks_what_the_job_needs_from_the_checkout(slurm_cluster, tmp_path, monkeypatch, capsys):
    """The job runs the checkout it was submitted from: from elsewhere, or with a training file the job would
    not find there, the submission is refused with one line and nothing reaches sbatch; from the checkout
    (BERT_SQUAD_REPO) it reaches the real sbatch. (The queue is paused: nothing runs.)"""
    submitting_env(monkeypatch, slurm_cluster, tmp_path)
    monkeypatch.delenv("BERT_SQUAD_REPO", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    argv = [
        "sweep",
        "--site",
        "generic",
        "--seeds",
        "1",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--submit",
        "--",
        "--model",
        "m",
        "--train-file",
        "bert_squad/sample/train-v1.1.json",
        "--deepspeed_config",
        "configs/ds_fp32.json",
    ]
    with paused(slurm_cluster):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == (
            f"bert-squad sweep: error: {elsewhere} has no bert_squad/ (the job runs the checkout it "
            f"is submitted from): submit from the repository root or set BERT_SQUAD_REPO to it"
        )
        assert not (tmp_path / "runs").exists()

        monkeypatch.setenv("BERT_SQUAD_REPO", str(ROOT))  # relative paths resolve in the checkout, not here
        assert cli.main([*argv[:-1], "configs/ds_fp33.json"]) == 2  # the sweep's own check, a dry run's too
        assert (
            capsys.readouterr()
            .err.strip()
            .endswith(
                "training arguments: configs/ds_fp33.json: no such DeepSpeed config (a JSON file, or one of ds_bf16, "
                "ds_fp16, ds_fp32, ds_zero2, ds_zero3); did you mean 'configs/ds_fp32.json'?"  # in the checkout
            )
        )
        assert cli.main([*argv[:-4], "--train-file", "nowhere.json"]) == 2
        assert (
            capsys.readouterr().err.strip().endswith(f"nowhere.json: no such file in {ROOT}, where the job resolves it")
        )
        assert cli.main(["launch", "--site", "generic", "--submit", "--", "--train-file", "nowhere.json"]) == 2
        assert "nowhere.json: no such file" in capsys.readouterr().err
        assert slurm_cluster.run("squeue", "-h").stdout == ""  # nothing reached sbatch so far
        assert cli.main(argv) == 0
        job = re.search(r"^Submitted batch job (\d+)$", capsys.readouterr().out, re.M).group(1)
        assert stored_script(slurm_cluster, job) == (ROOT / "slurm" / "generic.sbatch").read_text()
        assert slurm_cluster.job(job)["JobName"] == "bert-squad-sweep-seeds"

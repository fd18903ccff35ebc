"""Checkpoints and resume: a stopped-and-resumed run ends bit-identical to an uninterrupted one."""

import json
import os
import re
import shutil
import signal

import pytest
import torch
from helpers import (
    MPIRUN,
    PYTHON,
    ROOT,
    Started,
    assert_same_weights,
    launcher_env,
    ranks_by_hand,
    run_bert_squad,
    train_args,
    wait_ranks,
)
from safetensors.torch import load_file

from bert_squad.checkpoint import MARKER, checkpoint_root, complete_tags, find
from bert_squad.preemption import EXIT_STOPPED

pytestmark = pytest.mark.slow


def _args(tiny_model, sample_train, out, *extra):
    """These tests' run: 16 steps of the tiny model, no evaluation, the feature cache beside `out`; then `extra`."""
    return train_args(tiny_model, sample_train, out, *ARGS, *extra, cache=out.parent / "cache")


ARGS = ["--no-eval", "--learning-rate", "1e-3", "--max-steps", "16"]


def _start(tiny_model, sample_train, out, *extra, launcher=()):
    """The training, started; the caller's `with` ends its process group whatever happens."""
    cmd = [*launcher, PYTHON, "-m", "bert_squad", *_args(tiny_model, sample_train, out, *extra)]
    return Started(cmd, out.parent / "logs", env=launcher_env(launcher))


def _weights(out):
    return load_file(str(out / "model.safetensors"))


def test_ctrl_c_then_resume_matches_uninterrupted_run_and_keeps_the_history(tiny_model, sample_train, tmp_path):
    """Ctrl-C (SIGINT) at a step checkpoints and exits 75, as SIGTERM does; `--resume auto` ends bit-identical to an
    uninterrupted run, and its train_metrics.json holds both parts: every log line once, each part's wall time and
    their sum, and a figure of the whole run."""
    ref = tmp_path / "ref" / "out"
    r = run_bert_squad(*_args(tiny_model, sample_train, ref))
    assert r.returncode == 0, r.stderr[-2000:]

    out = tmp_path / "stopped" / "out"
    with _start(tiny_model, sample_train, out, "--log-every", "2") as proc:
        proc.wait_for("step 6/16")
        proc.proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=300) == EXIT_STOPPED, proc.seen()
        assert "Ctrl-C: stopping at the next step every rank checks" in proc.stdout
        assert "stop requested (signal SIGINT)" in proc.stdout and "resume with --resume auto" in proc.stdout
    tags = complete_tags(checkpoint_root(out))
    assert len(tags) == 1 and 6 <= int(tags[0][4:]) < 16
    stopped_at = int(tags[0][4:])
    assert not (out / "model.safetensors").exists()  # a stopped run exports nothing half-done

    r = run_bert_squad(*_args(tiny_model, sample_train, out, "--resume", "auto", "--log-every", "2"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resumed from {checkpoint_root(out) / tags[0]}" in r.stdout
    a, b = _weights(ref), _weights(out)
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), k  # bit-identical
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["steps"] == 16 and [log["step"] for log in metrics["logs"]] == list(range(2, 17, 2))
    parts = [(p["first_step"], p["last_step"], p["world_size"]) for p in metrics["parts"]]
    assert parts == [(0, stopped_at, 1), (stopped_at, 16, 1)]
    assert all(p["wall_time_s"] > 0 for p in metrics["parts"])
    assert metrics["wall_time_s"] == pytest.approx(sum(p["wall_time_s"] for p in metrics["parts"]))
    assert "in 2 parts" in r.stdout.splitlines()[-1]
    assert (out / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_second_ctrl_c_aborts_at_once(tiny_model, sample_train, sample_dev, tmp_path):
    """After the first Ctrl-C the run is on its way to a checkpoint; a second one ends it by SIGINT, without
    waiting for the stop check or the save. Log lines far apart leave the stop check to its clock (about 10 s of
    training on); an evaluation line says the loop is running."""
    out = tmp_path / "out"
    loop = ["--log-every", 100000, "--max-steps", 100000, "--eval-file", sample_dev, "--eval-every", 2]
    cmd = [PYTHON, "-m", "bert_squad", *train_args(tiny_model, sample_train, out, *loop, cache=tmp_path / "cache")]
    with Started(cmd, tmp_path / "logs") as proc:
        proc.wait_for("eval step 2:")
        proc.proc.send_signal(signal.SIGINT)
        proc.wait_for("Ctrl-C again aborts")
        proc.proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == -signal.SIGINT, proc.seen()
        assert "stop requested" not in proc.stdout
    assert not (checkpoint_root(out).exists() and complete_tags(checkpoint_root(out)))


def test_sigterm_checkpoints_and_exits_75_too(tiny_model, sample_train, tmp_path):
    """Preemption and scancel send SIGTERM: same path as Slurm's USR1 warning."""
    out = tmp_path / "out"
    with _start(tiny_model, sample_train, out, "--log-every", "1") as proc:
        proc.wait_for("step 2/16")
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == EXIT_STOPPED, proc.seen()
        assert "signal SIGTERM: stopping at the next step every rank checks" in proc.stdout
        assert "stop requested (signal SIGTERM)" in proc.stdout
    assert complete_tags(checkpoint_root(out))


def test_periodic_checkpoints_keep_the_last_k_and_resume_path(tiny_model, sample_train, tmp_path):
    out = tmp_path / "out"
    r = run_bert_squad(*_args(tiny_model, sample_train, out, "--checkpoint-every", 4, "--keep-checkpoints", 2))
    assert r.returncode == 0, r.stderr[-2000:]
    root = checkpoint_root(out)
    assert complete_tags(root) == ["step00000012", "step00000016"]
    assert (root / "latest").read_text().strip() == "step00000016"
    # A save that died half-way (no marker, newer step) is never picked.
    (root / "step00000020").mkdir()
    assert find("auto", out).path == root / "step00000016"
    with pytest.raises(Exception, match="not a complete checkpoint"):
        find(str(root / "step00000020"), out)
    # An explicit path resumes too; at the end already, it trains no further steps.
    r = run_bert_squad(*_args(tiny_model, sample_train, out, "--resume", root / "step00000012"))
    assert r.returncode == 0 and "at step 12" in r.stdout


def test_a_used_output_dir_is_refused_continued_or_replaced(tiny_model, sample_dev, sample_train, tmp_path):
    """A directory of the user's own files takes a run. A second run there is refused in one line naming the
    directory and the two ways on, nothing touched; --overwrite-output-dir replaces the first run: none of its
    checkpoints, exported model or evaluation is left beside the new run's, and the user's file stays."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    first = ["--max-steps", 4, "--checkpoint-every", 2, "--eval-file", sample_dev]
    r = run_bert_squad(*train_args(tiny_model, sample_train, out, *first, cache=tmp_path / "cache"))
    assert r.returncode == 0, r.stderr[-3000:]
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert complete_tags(checkpoint_root(out)) and (out / "predictions.json").exists()
    again = ["--max-steps", 2, "--no-export"]  # and, as ARGS say, --no-eval
    r = run_bert_squad(*_args(tiny_model, sample_train, out, *again))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"bert-squad: error: --output-dir {out} holds a finished run: continue it with --resume auto, or replace it "
        f"with --overwrite-output-dir (which removes its outputs and checkpoints first)"
    ], r.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    r = run_bert_squad(*_args(tiny_model, sample_train, out, *again, "--overwrite_output_dir"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((out / "train_metrics.json").read_text())["steps"] == 2
    left = sorted(p.name for p in out.iterdir())
    assert left == ["deepspeed_config.json", "notes.txt", "train_metrics.json", "training_curves.png"], left
    assert (out / "notes.txt").read_text() == "mine\n"


def test_resume_auto_without_checkpoint_starts_fresh(tiny_model, sample_train, tmp_path):
    """With nothing to resume, `--resume auto` is a fresh run: the same weights as one without it."""
    runs = {}
    for name, extra in (("auto", ["--resume", "auto"]), ("fresh", [])):
        runs[name] = run_bert_squad(*_args(tiny_model, sample_train, tmp_path / name, *extra, "--max-steps", 2))
        assert runs[name].returncode == 0, runs[name].stderr[-3000:]
    assert_same_weights(tmp_path / "auto", tmp_path / "fresh")
    assert not (tmp_path / "auto" / "checkpoints").exists()


def test_a_resumed_run_keeps_the_precision_it_started_in(tiny_model, sample_train, tmp_path):
    """A run that names no DeepSpeed config resumes in the precision its checkpoint was written in, where this
    device's default is the other one (a run started elsewhere, or with a config named then): the plan line says
    so, and the run finishes in it. Named, the config wins, and the checkpoint of the other precision is refused."""
    from bert_squad import choices, perf

    default = choices.precision(None, "cpu", False, choices.this_cpuinfo(), perf.bf16_speedup).value
    other = {"ds_bf16": "ds_fp32", "ds_fp32": "ds_bf16"}[default]
    out, steps = tmp_path / "out", ["--max-steps", 4]
    r = run_bert_squad(
        *_args(tiny_model, sample_train, out, *steps, "--deepspeed-config", other, "--checkpoint-every", 2)
    )
    assert r.returncode == 0, r.stderr[-2000:]
    resumed = run_bert_squad(
        *_args(tiny_model, sample_train, out, *steps, "--resume", checkpoint_root(out) / "step00000002")
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    precision = other.removeprefix("ds_")
    assert f", {precision} ({other}: kept from the checkpoint it resumes)" in resumed.stdout, resumed.stdout[-3000:]
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["precision"] == precision and metrics["config"]["train"]["deepspeed_config"] == other
    named = run_bert_squad(*_args(tiny_model, sample_train, out, "--resume", "auto", "--deepspeed-config", default))
    assert named.returncode == 2 and "resume with the config it was written with" in named.stderr, named.stderr


@pytest.mark.mpi
def test_signal_under_mpirun_stops_both_ranks_at_one_step(tiny_model, sample_train, tmp_path):
    out = tmp_path / "out"
    with _start(tiny_model, sample_train, out, "--log-every", "1", launcher=MPIRUN) as proc:
        proc.wait_for("step 3/16")
        proc.proc.send_signal(signal.SIGUSR1)  # mpirun forwards SIGUSR1 to every rank
        assert proc.wait(timeout=300) == EXIT_STOPPED, proc.seen()
    tag = complete_tags(checkpoint_root(out))[-1]
    files = os.listdir(checkpoint_root(out) / tag)
    assert {"rng_rank0.pt", "rng_rank1.pt", MARKER} <= set(files)


@pytest.mark.cpu  # two ranks on one host: its CPU (on one GPU, NCCL would refuse the second rank at once)
def test_a_dead_rank_does_not_hang_the_others(tiny_model, sample_train, tmp_path):
    """Two ranks started by hand (torchrun-style env): kill one; the other must fail, not wait forever.
    Its collectives give up after --dist-timeout (30 s); the deadline to see it exit is generous."""
    endless = ["--max-steps", 100000, "--log-every", 1, "--dist-timeout", 30]
    cmd = [PYTHON, "-m", "bert_squad", *_args(tiny_model, sample_train, tmp_path / "out", *endless)]
    with ranks_by_hand(cmd, tmp_path) as (first, second):
        first.wait_for("step 2/")
        second.kill()
        assert first.wait(timeout=600) != 0, first.seen()


@pytest.mark.cpu  # two ranks on one host: its CPU
def test_a_signal_to_one_rank_stops_both_at_one_step_without_a_collective_per_step(tiny_model, sample_train, tmp_path):
    """Only rank 0 gets SIGUSR1 (after step 12); rank 1 learns of it at a stop check, and both checkpoint the same
    step and exit 75. The ranks look at steps they agree on ahead: the project's all-reduces (recorded by
    tests/reduce_tap.py) fall on the same steps on both ranks, the last at the step they stop at. How many
    there are follows the wall time, so bench/stop_checks.py prints that count instead of a test asserting it."""
    out, calls = tmp_path / "out", tmp_path / "calls.json"
    tap = [PYTHON, ROOT / "tests" / "reduce_tap.py", calls, "--signal-at-step", 12]
    cmd = [*tap, *_args(tiny_model, sample_train, out, "--max-steps", 100000, "--log-every", 100000)]
    with ranks_by_hand(cmd, tmp_path) as (first, second):
        assert wait_ranks([first, second], 600) == [EXIT_STOPPED] * 2, (first.seen(), second.seen())
        assert "stop requested (signal SIGUSR1)" in first.stdout
    step = int(re.search(r"checkpoint at step (\d+) saved", first.stdout).group(1))
    assert complete_tags(checkpoint_root(out)) == [f"step{step:08d}"] and step > 12
    seen = [json.loads((tmp_path / f"calls.json.rank{rank}").read_text()) for rank in (0, 1)]
    assert seen[0] == seen[1] and seen[0][-1] == step, seen


def _hot_head(tiny_model, out):
    """`tiny_model` with its span head scaled 1000x: its fp16 gradients overflow at torch's first loss scales."""
    from safetensors.torch import save_file

    shutil.copytree(tiny_model, out)
    weights = load_file(str(out / "model.safetensors"))
    hot = {k: v * 1000 if k.startswith("qa_outputs") else v for k, v in weights.items()}
    save_file(hot, out / "model.safetensors", metadata={"format": "pt"})  # transformers 4.x reads the format
    return out


@pytest.mark.compat  # the loss scaler and its overflow check on the floor torch too
def test_fp16_overflow_skips_are_counted_and_the_loss_scale_resumes(tiny_model, sample_train, tmp_path):
    """fp16 autocast for real on the CPU, with gradients that overflow: each step torch's loss scaler skips is
    counted (DeepSpeed's skipped_steps, the log line), the LR schedule stays where it is on it, and the scale is in
    every checkpoint, so a run resumed after an overflow ends bit-identical to the uninterrupted one."""
    model = _hot_head(tiny_model, tmp_path / "hot")
    out = tmp_path / "out"
    args = [*_args(model, sample_train, out, "--max-steps", 8, "--checkpoint-every", 4, "--log-every", 1)]
    args += ["--deepspeed-config", "ds_fp16", "--keep-checkpoints", 2]
    r = run_bert_squad(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    skipped = json.loads((out / "train_metrics.json").read_text())["engine"]["skipped_steps"]
    # torch's scaler halves its scale (65536 at first) on each overflow, and grows it only after 2000 good steps
    root = checkpoint_root(out)
    scales = {
        tag: torch.load(root / tag / "mp_rank_00_model_states.pt", weights_only=False)["grad_scaler"]["scale"]
        for tag in complete_tags(root)
    }
    assert 0 < skipped < 8 and scales["step00000008"] == 65536 / 2**skipped, (skipped, scales)
    lines = re.findall(r"^step (\d+)/8 loss \S+ lr (\S+)(?: skipped (\d+))?", r.stdout, re.M)
    counts = [int(n or 0) for _, _, n in lines]
    assert counts[-1] == skipped and counts == sorted(counts)
    for (_, lr, n), (_, before, m) in zip(lines[1:], lines):
        if n != m:  # a skipped step: the scheduler did not advance
            assert lr == before, lines
    reference = tmp_path / "uninterrupted"
    reference.mkdir()
    os.replace(out / "model.safetensors", reference / "model.safetensors")

    r = run_bert_squad(*args, "--resume", root / "step00000004")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "train_metrics.json").read_text())["engine"]["skipped_steps"] == skipped
    assert_same_weights(reference, out)

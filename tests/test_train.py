"""End-to-end training on CPU, for real: DeepSpeed engine, gloo, mpirun, export. (tests/test_gpu.py trains on
a GPU; these assume a CPU-only host: device cpu, gloo, two ranks sharing it.)"""

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import (
    MPIRUN,
    PYTHON,
    ROOT,
    TINY_WINDOWS,
    assert_same_weights,
    free_port,
    inference_args,
    put_in_hub_cache,
    run_bert_squad,
    run_python,
    train_args,
    zero_on_cpu,
)

pytestmark = [pytest.mark.slow, pytest.mark.cpu]

TINY_ARGS = [*TINY_WINDOWS, "--log-every", "5"]


def tiny_run(tiny_model, sample_train, tmp_path, *extra, out=None, launcher=()):
    """The tiny model trained on the sample with these tests' windows and log lines, the feature cache in
    `tmp_path` (the output dir too unless given), then `extra`; it must succeed."""
    out = out or tmp_path / "out"
    r = run_bert_squad(
        *train_args(tiny_model, sample_train, out, *TINY_ARGS, *extra, cache=tmp_path / "cache"), launcher=launcher
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def losses(stdout):
    return [float(m) for m in re.findall(r"^step \d+/\d+ loss ([\d.]+)", stdout, re.M)]


@pytest.fixture(scope="module")
def trained(tiny_model, sample_train, tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    r = tiny_run(tiny_model, sample_train, run, "--no-eval", "--max-steps", 60, "--learning-rate", "3e-3")
    return run / "out", r


@pytest.mark.compat
def test_one_rank_cpu_training_loss_falls(trained):
    out, r = trained
    seen = losses(r.stdout)
    assert len(seen) == 12
    assert sum(seen[-2:]) / 2 < 0.85 * sum(seen[:2]) / 2, seen
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["steps"] == 60 and metrics["world_size"] == 1
    assert metrics["run_samples_per_second"] > 0 and metrics["run_tokens_per_second"] > 0
    assert "rank 0/1" in r.stdout and "device cpu backend gloo" in r.stdout
    # Named nothing, the run takes the CPU's choices (tests/test_choices.py holds every branch): each batch padded
    # to its longest feature, and bf16 autocast where this CPU computes bf16 faster than fp32 in the run's own
    # timing, else fp32; the plan line says why, with the timed speed where the CPU has bf16 arithmetic.
    from bert_squad import choices

    why = metrics["chosen"]["deepspeed_config"]
    if choices.cpu_computes("bf16", choices.this_cpuinfo()):
        speedup = float(re.search(r"([\d.]+)x fp32's speed in a timed matmul$", why).group(1))
        assert metrics["precision"] == ("bf16" if speedup > 1 else "fp32"), why
    else:
        assert metrics["precision"] == "fp32" and why.startswith("this CPU has no bf16 arithmetic"), why
    assert metrics["config"]["train"]["deepspeed_config"] == f"ds_{metrics['precision']}"
    assert f"{metrics['precision']} (ds_{metrics['precision']}: {why})" in r.stdout
    assert (
        metrics["config"]["speed"]["padding"] == "longest"
        and metrics["chosen"]["padding"] == choices.padding(None, False, "cpu").why
    )
    assert "micro batch padded to its longest feature: the fewest tokens, which a CPU's step time follows" in r.stdout
    assert len({n for _, n in metrics["shapes"]}) > 8, metrics["shapes"]  # a length for almost every batch
    # The libraries' warnings are the run's business, not its user's (a whole 521-token context given to
    # the tokenizer once made transformers warn on every run of the sample).
    assert "[transformers]" not in r.stderr and "Token indices" not in r.stderr, r.stderr[-3000:]


AGREED = """
import sys
from bert_squad import choices, config, runtime

runtime.prepare(deepspeed=True)
from bert_squad import train


def facts(s):
    return s.path, dict(s.values), s.batch, s.precision, s.needs, s.load_universal


argv = sys.argv[1:]
mine = train.check(config.parse_run_config(argv))
assert mine.chosen.timed  # a CPU, no config named, nothing resumed: each rank's own choice
other = {"ds_bf16": "ds_fp32", "ds_fp32": "ds_bf16"}[mine.chosen.deepspeed_config.value]
rank0s = choices.Choice(other, "rank 0's timing")  # what the broadcast brings this rank
agreed = train.in_precision(mine, rank0s)
named = train.check(config.parse_run_config([*argv, "--deepspeed-config", other]))
assert agreed.chosen.deepspeed_config == rank0s and agreed.cfg == named.cfg, (agreed.cfg, named.cfg)
assert facts(agreed.ds_settings) == facts(named.ds_settings) and agreed.stamp.layout == named.stamp.layout
assert agreed.stamp.layout.precision == other.removeprefix("ds_") != mine.stamp.layout.precision
assert train.agreed(mine) is mine  # rank 0 chose as this rank did: nothing is rebuilt
print("agreed", other)
"""


def test_a_rank_whose_timing_fell_the_other_way_takes_rank_0s_precision(tiny_model, sample_train, tmp_path):
    """`train.agreed` (after the process group starts, before the engine): a rank that timed its CPU the other
    way from rank 0 trains in rank 0's precision (`train.in_precision`), with the DeepSpeed settings and checkpoint
    stamp of a run that named it; one that timed alike keeps what it built. The broadcast itself runs in every
    two-rank CPU run here."""
    args = train_args(tiny_model, sample_train, tmp_path / "out", *TINY_ARGS, cache=tmp_path / "cache")
    r = run_python("-c", AGREED, *args)
    assert r.returncode == 0 and "agreed ds_" in r.stdout, r.stderr[-3000:]


def cpu_form(name, folder):
    """A shipped config as this CPU runs it: fp16 (which needs a GPU) swapped for bf16, all else as shipped."""
    cfg = json.loads((ROOT / "bert_squad" / "configs" / f"{name}.json").read_text())
    if cfg.pop("fp16", {}).get("enabled"):
        cfg["bf16"] = {"enabled": True}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.compat
@pytest.mark.parametrize("name", ["ds_fp32", "ds_bf16", "ds_fp16", "ds_zero2", "ds_zero3"])
def test_every_shipped_config_builds_a_torch_optimizer(name, tiny_model, sample_train, tmp_path):
    """The engine of every shipped config steps a torch.optim optimizer, so no DeepSpeed op is compiled on the
    host; --no-export writes the metrics (each log line's window, what the engine built) and no model."""
    out = tmp_path / "out"
    config = ["--deepspeed_config", cpu_form(name, tmp_path)]
    r = tiny_run(
        tiny_model, sample_train, tmp_path, "--no-eval", "--no-export", "--max-steps", 2, "--log-every", 1, *config
    )
    metrics = json.loads((out / "train_metrics.json").read_text())
    engine = metrics["engine"]
    assert engine["optimizer"] == "torch.optim.adamw.AdamW", engine
    assert "optimizer torch.optim.adamw.AdamW" in r.stdout
    # fp16's loss scale starts at 2^16, which may overflow a first step on one CPU and not on another: a skip is
    # counted and said in the log line, and only fp16 has one
    said = re.findall(r"^step 2/\d+ .* skipped (\d+) \(fp16 overflow\)", r.stdout, re.M)
    assert engine["skipped_steps"] == (int(said[0]) if said else 0) and (name == "ds_fp16" or not said), engine
    # fp32 weights at stage 0: the loop clips (dsconfig.Reading.loop_clip); ZeRO's optimizer clips its own partition
    clipped_by_the_loop = "gradient norm clipped to 1 in one foreach call" in r.stdout
    assert clipped_by_the_loop == (name in ("ds_fp32", "ds_bf16", "ds_fp16")), r.stdout[-3000:]
    assert [log["step"] for log in metrics["logs"]] == [1, 2] and metrics["last_log"] == metrics["logs"][-1]
    assert metrics["weights_sha256_per_rank"] == [] and not (out / "model.safetensors").exists()
    assert "no model (--no-export)" in r.stdout


@pytest.mark.parametrize("name", ["ds_fp32", "ds_bf16"])
def test_the_loops_clipping_trains_as_deepspeeds(name, tiny_model, sample_train, tmp_path):
    """The loop's one foreach clip (stage 0) against DeepSpeed's own clipping of the same config at ZeRO stage 1
    on one rank (its optimizer clips its flat fp32 partition): the same arithmetic, so the same losses and
    weights to rounding, three steps at a learning rate whose gradients are clipped; unclipped, they differ."""
    from safetensors.torch import load_file

    base = json.loads((ROOT / "bert_squad" / "configs" / f"{name}.json").read_text())
    configs = {
        "loop": base,
        "deepspeed": dict(base, zero_optimization={"stage": 1}),
        "unclipped": dict(base, gradient_clipping=0.0),
    }
    weights, runs = {}, {}
    for how, cfg in configs.items():
        (tmp_path / f"{how}.json").write_text(json.dumps(cfg))
        args = ["--deepspeed_config", tmp_path / f"{how}.json", "--max-steps", 3, "--log-every", 1, "--no-eval"]
        extra = ["--learning-rate", "5e-3", *args]
        r = run_bert_squad(*train_args(tiny_model, sample_train, tmp_path / how, *extra, cache=tmp_path / "cache"))
        assert r.returncode == 0, r.stderr[-3000:]
        runs[how], weights[how] = losses(r.stdout), load_file(str(tmp_path / how / "model.safetensors"))
    assert "in one foreach call" not in r.stdout  # the last run, unclipped: the loop clips nothing either
    assert runs["loop"] == pytest.approx(runs["deepspeed"], rel=1e-4) and len(runs["loop"]) == 3
    for key, tensor in weights["loop"].items():
        assert torch.allclose(tensor, weights["deepspeed"][key], rtol=1e-4, atol=1e-6), key
    assert any(not torch.allclose(t, weights["unclipped"][k], rtol=1e-3, atol=1e-5) for k, t in weights["loop"].items())


def steps_planned(stdout):
    """(total steps, steps per epoch) from the run's `training N steps (M per epoch)` line."""
    found = re.search(r"^training (\d+) steps \((\d+) per epoch\)", stdout, re.M)
    assert found, stdout[-3000:]
    return int(found.group(1)), int(found.group(2))


def test_a_fraction_of_an_epoch_is_that_share_of_its_steps(tiny_model, sample_train, tmp_path):
    """--epochs without --max-steps, as `make demo` and every site script train: 2 % of an epoch of the
    sample is ceil(0.02 x its steps per epoch) optimizer steps."""
    out = tmp_path / "out"
    r = tiny_run(tiny_model, sample_train, tmp_path, "--epochs", "0.02", "--no-eval")
    total, per_epoch = steps_planned(r.stdout)
    assert per_epoch > 50 and total == math.ceil(0.02 * per_epoch), (total, per_epoch)
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["steps"] == total and metrics["epochs"] == pytest.approx(total / per_epoch)


def test_resume_in_the_middle_of_an_epoch_ends_with_the_same_weights(tiny_model, sample_train, tmp_path):
    """1.5 epochs of one article (a few steps an epoch), a checkpoint after every step; runs resumed one
    step into the first epoch and one step into the second end with the uninterrupted run's weights, bit
    for bit: the epoch, the position in it and that epoch's order of batches are restored."""
    from safetensors.torch import load_file

    doc = json.loads(sample_train.read_text())
    article = tmp_path / "article.json"
    article.write_text(json.dumps(dict(doc, data=doc["data"][:1])))
    common = ["--epochs", "1.5", "--no-eval", "--learning-rate", "1e-3"]
    full = tmp_path / "full"
    r = tiny_run(tiny_model, article, tmp_path, *common, "--checkpoint-every", 1, "--keep-checkpoints", 1000, out=full)
    total, per_epoch = steps_planned(r.stdout)
    assert 2 < per_epoch < total < 2 * per_epoch, (total, per_epoch)
    for step in (1, per_epoch + 1):  # one step into each epoch
        resumed = tmp_path / f"resumed-{step}"
        r = tiny_run(
            tiny_model, article, tmp_path, *common, "--resume", full / "checkpoints" / f"step{step:08d}", out=resumed
        )
        assert f"at step {step}" in r.stdout, r.stdout[-3000:]
        a, b = load_file(str(full / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a), step
        assert json.loads((resumed / "train_metrics.json").read_text())["steps"] == total


def test_compile_builds_one_whole_graph_a_length_bucket_and_trains_as_eager_code_does(
    tiny_model, sample_train, tmp_path
):
    """--compile on two epochs of two articles (two length buckets at these windows), evaluating every 5 steps,
    through tests/compile_tap.py: from the second epoch on a recompile is an error, evaluations included. The run
    compiles one graph a shape and breaks none, and with inductor drawing its random numbers as eager code does
    (dropout is on) it trains as the eager run: every step's loss within a relative 1e-5 (equal here), and the
    exports' weights within 1e-4, under the same names. Inductor builds C++ on the CPU: about 3 minutes here.
    Compiled, the run pads to the length buckets by itself (a CPU's eager default pads each batch to its longest:
    the eager run is told); both in fp32, whose arithmetic the bounds below are of."""
    doc = json.loads(sample_train.read_text())
    articles = tmp_path / "articles.json"
    articles.write_text(json.dumps(dict(doc, data=doc["data"][:2])))
    common = [
        "--epochs",
        2,
        "--eval-every",
        5,
        "--eval-file",
        articles,
        "--log-every",
        1,
        "--deepspeed-config",
        "ds_fp32",
    ]
    metrics = {}
    for name, extra in (("eager", ["--padding", "buckets"]), ("compiled", ["--compile"])):
        args = train_args(tiny_model, articles, tmp_path / name, *common, *extra, cache=tmp_path / "cache")
        r = run_python(ROOT / "tests" / "compile_tap.py", *args, timeout=1200)
        assert r.returncode == 0, r.stderr[-3000:]
        metrics[name] = json.loads((tmp_path / name / "train_metrics.json").read_text())
    compiled, eager = metrics["compiled"], metrics["eager"]
    assert compiled["shapes"] == eager["shapes"] == [[16, 64], [16, 128]]
    assert compiled["compile"]["graphs"] == 2 and eager["compile"] is None
    assert compiled["chosen"]["padding"] == "--compile builds a graph a shape" and eager["chosen"]["padding"] == "given"
    assert compiled["compile"]["graph_breaks"] == compiled["compile"]["cudagraph_skips"] == 0
    losses = {name: [log["loss"] for log in m["logs"]] for name, m in metrics.items()}
    assert len(losses["eager"]) == eager["steps"] and losses["compiled"] == pytest.approx(losses["eager"], rel=1e-5)
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("compiled", "eager"))
    # Adam moves a weight by up to about lr a step whatever its gradient's size, so the exports may differ by up to
    # the steps times lr (18 steps at 5e-5, 9e-4) where a gradient is near 0 and its rounding decides the step's sign
    # (the span head's bias differed by 1.1e-4 here, every encoder weight by less than 1e-5)
    bound = eager["steps"] * eager["deepspeed_config"]["optimizer"]["params"]["lr"]
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=bound) for k in a)


@pytest.mark.compat
def test_export_loads_with_auto_classes_and_answers(trained):
    """The exported directory is a plain Hugging Face QA model (for this transformers line; CI's second
    environment runs this with the oldest supported 4.x), and our answer API answers from it."""
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from bert_squad.answer import Answerer

    out, _ = trained
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    question, context = "Where was Ada Novak born?", "Ada Novak was born in Lugano in 1834. She studied physics."
    tok, model = AutoTokenizer.from_pretrained(out), AutoModelForQuestionAnswering.from_pretrained(out).eval()
    qa = Answerer.from_pretrained(out)
    enc = tok(question, context, return_tensors="pt")
    with torch.no_grad():
        ours, theirs = qa.module(**enc), model(**enc)
    assert torch.equal(ours.start_logits, theirs.start_logits) and torch.equal(ours.end_logits, theirs.end_logits)
    [best] = qa.answer(question, context)
    assert best.text and context[best.start : best.end] == best.text and 0 < best.score <= 1
    assert not qa.null_answer  # trained on SQuAD 1.1: recorded in the exported config


@pytest.mark.compat
@pytest.mark.mpi
def test_mpirun_two_ranks_zero2_bf16_identical_weights(tiny_model, sample_train, tmp_path):
    out = tmp_path / "out"
    config = ["--deepspeed_config", zero_on_cpu(tmp_path, 2, bf16=True)]
    r = tiny_run(
        tiny_model,
        sample_train,
        tmp_path,
        "--no-eval",
        "--max-steps",
        10,
        "--learning-rate",
        "1e-3",
        *config,
        launcher=MPIRUN,
    )
    assert "rank 0/2" in r.stdout and "rank 1/2" in r.stdout and "launcher mpirun" in r.stdout
    assert f"bf16 ({config[1]}, given), zero stage 2" in r.stdout  # the plan line: the config named, and why
    assert r.stdout.count("step 10/10 loss") == 1, r.stdout  # the log lines are rank 0's alone
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["train_batch_size"] == 32
    digests = metrics["weights_sha256_per_rank"]
    assert len(digests) == 2 and digests[0] == digests[1]


def test_bad_config_fails_before_training(tiny_model, sample_train, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 16}))
    out = tmp_path / "out"
    r = run_bert_squad(
        "--model", tiny_model, "--train-file", sample_train, "--output-dir", out, "--deepspeed_config", bad
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"bert-squad: error: {bad}: train_batch_size 24 != train_micro_batch_size_per_gpu 16 x "
        f"gradient_accumulation_steps 1 x world size 1; remove train_batch_size to derive it"
    )
    assert "Traceback" not in r.stderr and not out.exists()


@pytest.mark.compat
def test_offline_run_from_cache_by_hub_names(tiny_model, sample_train, sample_dev, tmp_path):
    """What a compute node sees after --download-only: hub names resolve to the cache, no network."""
    import datasets

    from bert_squad.data import read_squad

    cache = tmp_path / "cache"
    put_in_hub_cache(cache / "hub", "bert-base-uncased", tiny_model)
    splits = {}
    for split, path in (("train", sample_train), ("validation", sample_dev)):
        rows = read_squad(path).records
        splits[split] = datasets.Dataset.from_list(
            [{k: r[k] for k in ("id", "title", "context", "question", "answers")} for r in rows]
        )
    datasets.DatasetDict(splits).save_to_disk(str(cache / "datasets" / "squad"))
    env = {
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "BERT_SQUAD_CACHE": str(cache),
    }
    r = run_bert_squad(
        "--model",
        "bert-base-uncased",
        "--dataset",
        "squad",
        "--no-eval",
        "--output-dir",
        tmp_path / "out",
        "--max-steps",
        2,
        *TINY_ARGS,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "squad[train]" in r.stdout
    r = run_bert_squad("--model", "bert-large-cased", "--output-dir", tmp_path / "out2", env=env)
    assert r.returncode == 2 and "--download-only --model bert-large-cased" in r.stderr


def test_download_only_without_network_is_one_clear_line(tmp_path):
    env = {"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}
    cache = tmp_path / "cache"
    r = run_bert_squad("--download-only", "--model", "bert-base-uncased", "--cache-dir", cache, env=env, timeout=120)
    assert r.returncode == 2 and not cache.exists()  # a failed download leaves no empty cache behind
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("bert-squad: error: cannot reach the Hugging Face hub for model 'bert-base-uncased'")
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "warmup_args, warmup_steps", [([], 1), (["--warmup-ratio", "0.5"], 3)], ids=["default-warmup", "warmup-ratio-0.5"]
)
def test_monitors_write_loss_lr_and_throughput(tiny_model, sample_train, tmp_path, warmup_args, warmup_steps):
    """csv_monitor and tensorboard get the log lines' loss and throughput and DeepSpeed's
    learning rate, in the directory the config names (csv: none named, so the run's output dir). The rate
    follows the schedule --warmup-ratio fills: ceil(ratio x 6 steps) of linear warmup (0.1 by default)."""
    import csv
    import math

    import torch
    from deepspeed.runtime.lr_schedules import WarmupDecayLR

    cfg = json.loads((ROOT / "configs" / "ds_fp32.json").read_text())
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator", reason="tensorboard is in setup.cfg's test extra"
    )
    cfg["csv_monitor"] = {"enabled": True, "job_name": "tiny"}
    cfg["tensorboard"] = {"enabled": True, "output_path": str(tmp_path / "tb"), "job_name": "tiny"}
    (tmp_path / "monitored.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    steps = ["--max-steps", 6, "--learning-rate", "1e-3", "--log-every", 2, *warmup_args]
    r = tiny_run(
        tiny_model, sample_train, tmp_path, "--no-eval", "--deepspeed_config", tmp_path / "monitored.json", *steps
    )
    scheduled = json.loads((out / "train_metrics.json").read_text())["deepspeed_config"]["scheduler"]["params"]
    assert (scheduled["warmup_num_steps"], scheduled["total_num_steps"]) == (warmup_steps, 6)

    def series(name):
        with open(out / "monitor" / "tiny" / f"Train_Samples_{name}.csv") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["step", name]
        return [(int(step), float(value)) for step, value in rows[1:]]

    losses_logged = series("train_loss")
    assert [s for s, _ in losses_logged] == [32, 64, 96]  # samples seen at steps 2, 4 and 6
    assert all(math.isfinite(v) and v > 0 for _, v in losses_logged)
    assert [round(v, 4) for _, v in losses_logged] == losses(r.stdout)  # the values the log lines print
    assert all(v > 0 for _, v in series("samples_per_second")) and len(series("tokens_per_second")) == 3
    # The learning rate at every step is the schedule's: WarmupDecayLR with the "auto" values filled in.
    param = torch.nn.Parameter(torch.zeros(1))
    schedule = WarmupDecayLR(
        torch.optim.SGD([param], lr=1e-3),
        total_num_steps=6,
        warmup_min_lr=0,
        warmup_max_lr=1e-3,
        warmup_num_steps=warmup_steps,
        warmup_type="linear",
    )
    expected = []
    for _ in range(6):
        schedule.step()
        expected.append(schedule.get_lr()[0])
    assert [s for s, _ in series("lr")] == [16 * i for i in range(1, 7)]
    assert [v for _, v in series("lr")] == pytest.approx(expected, rel=1e-6)
    events = event_accumulator.EventAccumulator(str(tmp_path / "tb" / "tiny"))
    events.Reload()
    assert [e.value for e in events.Scalars("Train/Samples/train_loss")] == pytest.approx([v for _, v in losses_logged])
    assert len(events.Scalars("Train/Samples/lr")) == 6


@pytest.mark.compat
@pytest.mark.mpi
def test_mpirun_two_ranks_zero3_trains_evaluates_exports_and_resumes(tiny_model, sample_train, sample_dev, tmp_path):
    """ZeRO-3 partitions every parameter (threshold 0: even the tiny model's): evaluation with one batch
    keeps rank 1 in the collectives, the export holds the gathered weights (the evaluation of the exported
    model on one process gives the run's predictions), and a resumed run ends bit-identical."""
    from safetensors.torch import load_file
    from transformers import AutoModelForQuestionAnswering

    zero3 = zero_on_cpu(tmp_path, 3)  # fp32
    dev = json.loads(sample_dev.read_text())
    dev["data"] = dev["data"][:1]
    para = dev["data"][0]["paragraphs"][0]
    dev["data"][0]["paragraphs"] = [dict(para, qas=para["qas"][:2])]  # one eval batch (< 64 features), two ranks
    (tmp_path / "dev.json").write_text(json.dumps(dev))
    common = ["--eval-file", tmp_path / "dev.json", "--max-steps", 4, "--learning-rate", "1e-3", "--dist-timeout", 60]
    common += ["--deepspeed_config", zero3]
    out = tmp_path / "out"
    r = tiny_run(
        tiny_model, sample_train, tmp_path, *common, "--checkpoint-every", 2, "--eval-every", 2, launcher=MPIRUN
    )
    assert (
        f"fp32 ({zero3}, given), zero stage 3" in r.stdout and "eval step 2:" in r.stdout and "eval step 4:" in r.stdout
    )

    exported, initial = load_file(str(out / "model.safetensors")), load_file(str(tiny_model / "model.safetensors"))
    for name, weight in initial.items():
        if name in exported:
            assert exported[name].shape == weight.shape and not exported[name].equal(weight), name
    assert exported["qa_outputs.weight"].shape == (2, 32)
    AutoModelForQuestionAnswering.from_pretrained(str(out))
    again = run_bert_squad(
        *inference_args("evaluate", out, tmp_path / "dev.json", tmp_path / "eval", cache=tmp_path / "cache")
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "eval" / "predictions.json").read_text() == (out / "predictions.json").read_text()

    resumed = tmp_path / "resumed"
    r = tiny_run(
        tiny_model,
        sample_train,
        tmp_path,
        *common,
        "--resume",
        out / "checkpoints" / "step00000002",
        out=resumed,
        launcher=MPIRUN,
    )
    assert "at step 2" in r.stdout, r.stdout[-3000:]
    weights = load_file(str(resumed / "model.safetensors"))
    assert weights.keys() == exported.keys() and all(weights[k].equal(exported[k]) for k in weights)


def test_the_written_config_given_back_trains_the_same_run(tiny_model, sample_train, tmp_path):
    """deepspeed_config.json, given back as --deepspeed-config: the same clipping (the loop's, at the norm the
    shipped config gives), the micro batch --micro-batch-size gave the first run, and the same weights, bit for
    bit, three steps at a learning rate whose gradients are clipped."""
    first, again = tmp_path / "first", tmp_path / "again"
    common = ("--max-steps", 3, "--learning-rate", "5e-3", "--no-eval", "--log-every", 1)
    flags = ("--deepspeed-config", "ds_fp32", "--micro-batch-size", 4)
    a = tiny_run(tiny_model, sample_train, tmp_path, *common, *flags, out=first)
    written = first / "deepspeed_config.json"
    first_config = json.loads(written.read_text())
    assert first_config["gradient_clipping"] == 1.0 and first_config["train_micro_batch_size_per_gpu"] == 4
    b = tiny_run(tiny_model, sample_train, tmp_path, *common, "--deepspeed-config", written, out=again)
    for r in (a, b):
        assert "gradient norm clipped to 1 in one foreach call" in r.stdout, r.stdout[-2000:]
        assert "global batch 4 = 4 x 1 x 1" in r.stdout, r.stdout[-2000:]
    assert losses(a.stdout) == losses(b.stdout) and len(losses(a.stdout)) == 3
    assert_same_weights(first, again)
    assert json.loads((again / "deepspeed_config.json").read_text()) == first_config


def test_options_given_with_a_written_config_decide_its_schedule(tiny_model, sample_train, tmp_path):
    """What the run fills from its options stays "auto" in deepspeed_config.json, so given back with other
    options it follows them: the length, the peak rate and the warmup the options decide, not the first run's."""
    first, other = tmp_path / "first", tmp_path / "other"
    tiny_run(tiny_model, sample_train, tmp_path, "--max-steps", 3, "--learning-rate", "5e-3", "--no-eval", out=first)
    written = json.loads((first / "deepspeed_config.json").read_text())
    assert {written["scheduler"]["params"][k] for k in ("warmup_max_lr", "total_num_steps", "warmup_num_steps")} == {
        "auto"
    }
    given = ("--max-steps", 4, "--learning-rate", "3e-5", "--warmup-ratio", "0.5", "--no-eval")
    tiny_run(
        tiny_model, sample_train, tmp_path, *given, "--deepspeed-config", first / "deepspeed_config.json", out=other
    )
    trained = json.loads((other / "train_metrics.json").read_text())
    params = trained["deepspeed_config"]["scheduler"]["params"]
    assert (params["total_num_steps"], params["warmup_num_steps"], params["warmup_max_lr"]) == (4, 2, 3e-5)
    assert trained["deepspeed_config"]["optimizer"]["params"]["lr"] == 3e-5 and trained["steps"] == 4


def test_a_figure_that_cannot_be_drawn_costs_the_figure_not_the_metrics(tiny_model, sample_train, tmp_path):
    """training_curves.png cannot be written (a directory holds its name): the run still finishes, its
    train_metrics.json written, one note line says what was not drawn, and no scratch file of it is left."""
    out = tmp_path / "out"
    (out / "training_curves.png").mkdir(parents=True)
    r = tiny_run(tiny_model, sample_train, tmp_path, "--max-steps", 2, "--no-eval")
    assert json.loads((out / "train_metrics.json").read_text())["steps"] == 2
    assert f"note: {out / 'training_curves.png'} was not drawn" in r.stdout, r.stdout[-2000:]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".training_curves")]


def test_config_under_torchrun_prints_one_plan(tiny_model, sample_train, tmp_path):
    """docs/usage.md's torchrun line (`--no-python` and the console script) on `config`: two ranks, one plan,
    whose world is the launcher's two."""
    bin_dir = Path(PYTHON).parent
    args = train_args(tiny_model, sample_train, tmp_path / "out", *TINY_ARGS, cache=tmp_path / "cache")
    cmd = [bin_dir / "torchrun", "--nproc-per-node", "2", "--master-port", free_port(), "--no-python"]
    r = subprocess.run(
        [*map(str, cmd), str(bin_dir / "bert-squad"), "config", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    plan = json.loads(r.stdout)  # one JSON document: a second rank's would follow it
    assert plan["world_size"] == 2 and plan["total_steps"] > 0
    assert not (tmp_path / "out").exists()

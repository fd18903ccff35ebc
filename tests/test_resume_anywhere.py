"""Resume anywhere: a checkpoint of any ZeRO stage resumed on another number of ranks, damaged
checkpoints passed over, and the Hugging Face model of any checkpoint.

The chain of runs across worlds trains the tiny EuroBERT, an encoder without a question-answering class in
transformers: the project's own span head is the harder case (its weights are the project's to save, convert,
load and export), and so every shipped config carries it through every step.

Runs go through tests/state_tap.py, which writes what the engine holds right before each save and
right after each load: "loaded what was saved" is checked tensor for tensor on the real training.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import (
    MPIRUN,
    PYTHON,
    ROOT,
    assert_same_weights,
    assert_span_head_export,
    free_port,
    inference_args,
    rank_env,
    run_bert_squad,
    run_python,
    train_args,
    zero_on_cpu,
)

from bert_squad import checkpoint, dsconfig, resume
from bert_squad.checkpoint import MARKER, Layout, checkpoint_root
from bert_squad.errors import UserError

pytestmark = pytest.mark.heavy

TAP = ROOT / "tests" / "state_tap.py"
ARGS = ["--no-eval", "--learning-rate", "1e-3", "--log-every", "2", "--checkpoint-every", "2", "--resume", "auto"]
CONFIGS = ["ds_fp32", "ds_bf16", "zero2_bf16", "zero3_bf16"]
CHAIN = [(2, 2), (1, 4), (2, 6)]  # (ranks, --max-steps) of three runs: 2 ranks -> 1 rank -> 2 ranks


def ds_config(name, directory):
    """A shipped config, or the CPU form (bf16) of a shipped ZeRO one."""
    return name if name.startswith("ds_") else zero_on_cpu(Path(directory), int(name[4]), bf16=True)


def tapped(dumps, *args, ranks=1):
    """A training run through the state tap, on `ranks` ranks (mpirun for 2, on a free port: the default
    one may be another test session's)."""
    return run_python(TAP, dumps, *args, launcher=MPIRUN if ranks == 2 else ())


def resume_args(model, train, out, config):
    """The runs here: the tiny windows, a checkpoint every 2 steps, resumed where there is one, the feature cache
    beside `out`."""
    return train_args(model, train, out, "--deepspeed_config", config, *ARGS, cache=Path(out).parent / "cache")


# --- the world-size decision (pure) ---------------------------------------------------------------

DS = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "train_batch_size": 16,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2},
}


WRAPPED = dsconfig.Reading.of(DS).precision_path  # bf16 weights in DeepSpeed's 16-bit optimizer


def settings(world, ds=DS):
    """DS checked for `world` ranks (its micro batch of 16 kept: the global batch follows the world), planned for a
    job's device (what it needs, such as NVMe offload's op, is not this machine's to have)."""
    return dsconfig.settings(
        {k: v for k, v in ds.items() if k != "train_batch_size"}, "c.json", world_size=world, device=None
    )


@pytest.mark.parametrize(
    "layout, world, expected",
    [
        (Layout(2, 32, 1, 2, "bf16", True, WRAPPED), 2, (resume.AS_IS, 16, 1)),
        (Layout(4, 64, 1, 2, "bf16", True, WRAPPED), 2, (resume.UNIVERSAL, 16, 2)),  # shrinking: accumulation
        (Layout(1, 32, 2, 2, "bf16", True, WRAPPED), 2, (resume.UNIVERSAL, 16, 1)),
        (
            Layout(1, 16, 1, 2, "bf16", True, WRAPPED),
            2,
            (resume.UNIVERSAL, 8, 1),
        ),  # growing past the batch: a smaller micro
        (Layout(1, 48, 3, 2, "bf16", True, WRAPPED), 4, (resume.UNIVERSAL, 12, 1)),
        (Layout(4, 64, 1, None, None, False), 2, (resume.WHOLE, 16, 2)),  # an older marker: stage 0 by its files
        (Layout(), 3, (resume.AS_IS, 16, 1)),  # a marker without a world size: as before
    ],
)
def test_the_decision_for_a_world_size(layout, world, expected, tmp_path):
    decision = resume.decide(checkpoint.Resumable(tmp_path, layout), settings(world))
    batch = decision.settings.batch
    assert (decision.action, batch.micro, batch.accumulation) == expected
    if decision.action != resume.AS_IS:
        assert batch.size == layout.train_batch_size and batch.world_size == world


@pytest.mark.parametrize(
    "layout, world, ds, reason",
    [
        (
            Layout(1, 32, 2, 2, "bf16", True, WRAPPED),
            3,
            DS,
            "written by 1 rank with a global batch of 32, which 3 ranks cannot "
            "split evenly; resume on a number of ranks that divides 32",
        ),
        (
            Layout(2, 32, 1, 0, "fp32", False),
            1,
            DS,
            "written with ZeRO stage 0 in fp32, this run's DeepSpeed config has stage 2 in bf16",
        ),
        (
            Layout(2, 32, 1, 2, "bf16", True, WRAPPED),
            1,
            dict(DS, zero_optimization={"stage": 2, "offload_optimizer": {"device": "nvme"}}),
            "no universal checkpoint with the optimizer offloaded to NVMe",
        ),
        (  # the same precision by its name, reached another way: the optimizer states differ
            Layout(2, 32, 1, 2, "bf16", True, "bf16 autocast over fp32 weights"),
            2,
            DS,
            "written with bf16 autocast over fp32 weights, this run computes in bf16 weights in DeepSpeed's "
            "16-bit optimizer: their optimizer states differ",
        ),
        (  # a 16-bit checkpoint whose marker predates the record: either path
            Layout(2, 32, 1, 2, "bf16", True),
            2,
            DS,
            "written with bf16, by a version that did not record its precision path, this run computes in",
        ),
    ],
)
def test_what_cannot_resume_is_refused_in_one_line(layout, world, ds, reason, tmp_path):
    with pytest.raises(UserError, match=f"^{tmp_path}: ") as err:
        resume.decide(checkpoint.Resumable(tmp_path, layout), settings(world, ds))
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_the_config_for_a_conversion(tmp_path):
    """The finished config of a resume through a universal checkpoint: the checkpoint's global batch by
    accumulation, and DeepSpeed told to load a universal checkpoint, this run only (the written config, given
    back, would load every later checkpoint as a universal one); checking that the checkpoint can take the
    conversion leaves nothing in it."""
    decision = resume.decide(checkpoint.Resumable(tmp_path, Layout(2, 32, 1, 2, "bf16", True, WRAPPED)), settings(1))
    done = decision.settings.finish(10, 0.1)
    assert (done.as_dict()["gradient_accumulation_steps"], done.as_dict()["train_batch_size"]) == (2, 32)
    assert done.for_engine()["checkpoint"] == {"load_universal": True} and "checkpoint" not in done.as_dict()
    assert not list(tmp_path.iterdir())  # its probe of the checkpoint dir is gone


# --- the file list in the marker ------------------------------------------------------------------


def fake_checkpoint(path, step=2):
    path.mkdir(parents=True)
    (path / "mp_rank_00_model_states.pt").write_bytes(bytes(range(256)) * 64)
    (path / "hf").mkdir()
    (path / "hf" / "config.json").write_text("{}")
    checkpoint.write_marker(path, {"step": step}, checkpoint.manifest(path))
    return path


@pytest.mark.parametrize(
    "harm, problem",
    [
        (lambda f: os.truncate(f, 100), "mp_rank_00_model_states.pt is 100 bytes, the marker recorded 16384"),
        (lambda f: f.unlink(), "mp_rank_00_model_states.pt is missing"),
        (
            lambda f: f.write_bytes(bytes(range(255, -1, -1)) * 64),
            "mp_rank_00_model_states.pt differs from the marker's checksum",
        ),
    ],
)
def test_damage_names_the_file(harm, problem, tmp_path):
    path = fake_checkpoint(tmp_path / "step00000002")
    assert checkpoint.describe_damage(path) is None
    harm(path / "mp_rank_00_model_states.pt")
    assert checkpoint.describe_damage(path) == problem
    assert (checkpoint.describe_damage(path, read=False) is None) == ("checksum" in problem)  # sizes only: no read


def test_resume_auto_passes_over_damaged_checkpoints(tmp_path):
    root = checkpoint_root(tmp_path)
    for step in (2, 4, 6):
        fake_checkpoint(root / f"step0000000{step}", step)
    for step in (4, 6):
        (root / f"step0000000{step}" / "hf" / "config.json").write_text("{ }")
    found = checkpoint.find("auto", tmp_path)
    assert found.path == root / "step00000002" and found.skipped == tuple(
        f"{root}/step0000000{step}: damaged checkpoint: hf/config.json is 3 bytes, the marker recorded 2; "
        f"resuming from step00000002 instead"
        for step in (6, 4)
    )
    with pytest.raises(UserError, match=r"step00000004: damaged checkpoint: hf/config\.json is 3 bytes"):
        checkpoint.find(str(root / "step00000004"), tmp_path)
    (root / "step00000002" / MARKER).write_text("{")
    with pytest.raises(
        UserError,
        match=f"^{root}: every complete checkpoint is damaged \\(the newest, step00000006: hf/config.json is 3 bytes",
    ):
        checkpoint.find("auto", tmp_path)


def test_pruning_keeps_the_newest_intact_checkpoints(tmp_path):
    """--keep-checkpoints counts intact checkpoints: damaged ones are deleted and never counted, and
    nothing newer than the newest intact one is touched."""
    root = tmp_path / "checkpoints"
    for step in (2, 4, 6, 8):
        fake_checkpoint(root / f"step0000000{step}", step)
    (root / "step00000004" / "hf" / "config.json").unlink()
    (root / "step00000008" / "mp_rank_00_model_states.pt").unlink()
    checkpoint.prune(root, keep=2)
    assert checkpoint.complete_tags(root) == ["step00000002", "step00000006", "step00000008"]
    checkpoint.prune(root, keep=1)
    assert checkpoint.complete_tags(root) == ["step00000006", "step00000008"]


# --- 2 ranks -> 1 rank -> 2 ranks, each config --------------------------------------------------


@pytest.fixture(scope="module", params=CONFIGS)
def chain(request, tiny_eurobert, sample_train, sample_dev, tmp_path_factory):
    """Three runs of the span-head model in one output dir, each resuming the last one's newest checkpoint:
    2 ranks to step 2 (evaluated on both ranks at each step, keeping the best), 1 rank to step 4, 2 ranks to
    step 6, a checkpoint every 2 steps. `first` is the first run's train_metrics.json, `written` each run's
    deepspeed_config.json."""
    tmp = tmp_path_factory.mktemp(request.param)
    config, out, logs, written, first = ds_config(request.param, tmp), tmp / "out", [], [], None
    evaluated = ["--eval-file", sample_dev, "--eval-every", 1, "--keep-best"]
    for ranks, steps in CHAIN:
        args = resume_args(tiny_eurobert, sample_train, out, config)
        if first is None:
            args = [a for a in args if a != "--no-eval"] + list(map(str, evaluated))
        r = tapped(tmp / "dumps", *args, "--max-steps", steps, ranks=ranks)
        assert r.returncode == 0, r.stderr[-3000:]
        logs.append(r.stdout)
        written.append((out / "deepspeed_config.json").read_text())
        first = first or json.loads((out / "train_metrics.json").read_text())
    return SimpleNamespace(
        name=request.param,
        out=out,
        dumps=tmp / "dumps",
        logs=logs,
        written=written,
        first=first,
        zero_stage=dsconfig.Reading.of(dsconfig.load(config)).zero_stage,
    )


def ranks(n):
    return f"{n} rank" if n == 1 else f"{n} ranks"


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("run", [1, 2])
def test_a_checkpoint_resumes_on_another_number_of_ranks_as_it_was_saved(chain, run):
    """Weights, Adam moments, learning rate, step, epoch and data position after loading are those saved,
    whatever the stage: ZeRO-0 loads as it is, ZeRO 1-3 (ds_bf16 is stage 1) through a universal checkpoint."""
    (old, _), (new, _) = CHAIN[run - 1], CHAIN[run]
    step = CHAIN[run - 1][1]
    saved, loaded = (torch.load(chain.dumps / f"{kind}-step{step}.pt") for kind in ("saved", "loaded"))
    assert (saved["world_size"], loaded["world_size"]) == (old, new)
    assert saved["tensors"].keys() == loaded["tensors"].keys()
    for name, tensors in saved["tensors"].items():
        for what, a, b in zip(("fp32 weight", "exp_avg", "exp_avg_sq"), tensors, loaded["tensors"][name]):
            assert torch.equal(a, b), f"{name}: {what}"
    assert loaded["lr"] == saved["lr"] and loaded["global_steps"] == saved["global_steps"] == step
    assert loaded["weight_decay"] == saved["weight_decay"] == [0.01, 0.0]
    assert saved["accumulation"] * old == loaded["accumulation"] * new == 2  # the global batch of 2 x 16 kept
    before, after = saved["progress"], loaded["progress"]
    assert (after["step"], after["epoch"]) == (before["step"], before["epoch"])
    assert after["batch_in_epoch"] == before["batch_in_epoch"] // saved["accumulation"] * loaded["accumulation"]
    how = "universal checkpoint (converted in" if chain.zero_stage else "optimizer state whole (ZeRO stage 0)"
    line = (
        f"resumed from {checkpoint_root(chain.out)}/step0000000{step} at step {step}, written by {ranks(old)}, "
        f"on {ranks(new)}: {how}"
    )
    assert line in chain.logs[run], chain.logs[run][-3000:]


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.compat
@pytest.mark.parametrize("name", ["ds_fp32", "zero2_bf16", "zero3_bf16"])
def test_two_ranks_resumed_on_one_load_what_they_saved(name, tiny_model, sample_train, tmp_path):
    """The tiny BERT, which every supported transformers has (the compat line runs this on the floors: the oldest
    torch, DeepSpeed and transformers the project supports): 2 ranks to a checkpoint at step 2, resumed on 1 rank,
    load weights and Adam moments bit for bit as saved, ZeRO-0 as it is, ZeRO-2 and -3 through DeepSpeed's universal
    checkpoint; the resumed run finishes and exports. A DeepSpeed whose universal load below stage 3 maps the fp32
    weights onto a moment (before 0.19.7) refuses that resume in one line, before it writes anything."""
    from importlib.metadata import version

    from packaging.version import Version

    config, out, dumps = ds_config(name, tmp_path), tmp_path / "out", tmp_path / "dumps"
    (two, steps), (one, more) = CHAIN[:2]
    r = tapped(dumps, *resume_args(tiny_model, sample_train, out, config), "--max-steps", steps, ranks=two)
    assert r.returncode == 0, r.stderr[-3000:]
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    r = tapped(dumps, *resume_args(tiny_model, sample_train, out, config), "--max-steps", more, ranks=one)
    if "zero3" not in name and "zero" in name and Version(version("deepspeed")) < Version("0.19.7"):
        assert r.returncode == 2 and r.stderr.splitlines()[-1].endswith(
            f"needs DeepSpeed 0.19.7 or later (this is {version('deepspeed')}, whose universal checkpoint loads the "
            "fp32 weights wrong); resume on 2 ranks"
        ), r.stderr[-3000:]
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
        return
    assert r.returncode == 0, r.stderr[-3000:]
    saved, loaded = (torch.load(dumps / f"{kind}-step{steps}.pt") for kind in ("saved", "loaded"))
    assert (saved["world_size"], loaded["world_size"]) == (2, 1) and saved["tensors"].keys() == loaded["tensors"].keys()
    for tensor, (a, b) in ((n, pair) for n, t in saved["tensors"].items() for pair in zip(t, loaded["tensors"][n])):
        assert torch.equal(a, b), tensor
    assert json.loads((out / "train_metrics.json").read_text())["steps"] == more
    assert (out / "model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.mpi
def test_the_config_a_resume_writes_trains_a_run_that_resumes_its_own_checkpoint(
    chain, tiny_eurobert, sample_train, tmp_path
):
    """deepspeed_config.json holds the user's config and the batch and schedule the run decided, never how one
    resume loaded its checkpoint: after 2 ranks -> 1 rank through a universal checkpoint it has no checkpoint
    section, and given back it trains a new run that stops at a checkpoint and resumes from that ordinary one
    (told to load universal checkpoints, DeepSpeed would look for a conversion there is none of)."""
    assert not [w for w in chain.written if "checkpoint" in json.loads(w)]
    if chain.name != "zero2_bf16":
        return
    given_back, out = tmp_path / "given-back.json", tmp_path / "out"
    given_back.write_text(chain.written[1])  # the 1-rank run's, which resumed through a universal checkpoint
    for steps in (2, 3):
        r = run_bert_squad(*resume_args(tiny_eurobert, sample_train, out, given_back), "--max-steps", steps)
        assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {checkpoint_root(out)}/step00000002 at step 2\n" in r.stdout, r.stdout[-3000:]
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert (metrics["world_size"], metrics["train_batch_size"], metrics["steps"]) == (1, 32, 3)
    assert json.loads((out / "deepspeed_config.json").read_text()) == json.loads(chain.written[1])


@pytest.mark.slow
@pytest.mark.mpi
def test_a_run_started_on_one_rank_grows_to_two(two_checkpoints, tiny_model, sample_train, tmp_path):
    """ZeRO-2 on 1 rank (micro batch 16, no accumulation: `two_checkpoints`' run), resumed from step 2 on 2 ranks:
    the global batch of 16 is kept by a micro batch of 8, the shards go through a universal checkpoint, the state
    loads as saved, and the run finishes."""
    out, dumps = tmp_path / "out", tmp_path / "dumps"
    shutil.copytree(two_checkpoints.out, out)
    shutil.copytree(two_checkpoints.dumps, dumps)
    shutil.rmtree(checkpoint_root(out) / "step00000004")  # step 4 is this run's to write
    args = resume_args(tiny_model, sample_train, out, two_checkpoints.config)
    r = tapped(dumps, *args, "--max-steps", 4, "--resume", checkpoint_root(out) / "step00000002", ranks=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "written by 1 rank, on 2 ranks: universal checkpoint (converted in" in r.stdout
        and "micro batch 8 x accumulation 1 keeps the global batch of 16" in r.stdout
    ), r.stdout[-3000:]
    saved, loaded = (torch.load(dumps / f"{kind}-step2.pt") for kind in ("saved", "loaded"))
    assert all(
        torch.equal(a, b)
        for name, tensors in saved["tensors"].items()
        for a, b in zip(tensors, loaded["tensors"][name])
    )
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert (metrics["world_size"], metrics["train_batch_size"], metrics["steps"]) == (2, 16, 4)
    assert [(p["first_step"], p["last_step"], p["world_size"]) for p in metrics["parts"]] == [(0, 2, 1), (2, 4, 2)]
    assert metrics["deepspeed_config"]["train_micro_batch_size_per_gpu"] == 8


@pytest.mark.slow
@pytest.mark.mpi
def test_the_first_run_evaluates_on_both_ranks_and_keeps_the_best(chain):
    """The masked-LM head the model was saved with is left out in one line; both ranks evaluate at each step,
    and the run records the best of those evaluations as its best step."""
    assert chain.logs[0].count("left out: lm_head (the head it was saved with, 1 tensor)") == 1, chain.logs[0][-3000:]
    metrics = chain.first
    assert metrics["world_size"] == 2 and [e["step"] for e in metrics["evals"]] == [1, 2]
    best = next(e for e in metrics["evals"] if e["step"] == metrics["best_step"])
    assert metrics["best_metrics"]["f1"] == best["f1"] == max(e["f1"] for e in metrics["evals"])


@pytest.mark.slow
@pytest.mark.mpi
def test_the_resumed_runs_finish_and_export(chain):
    """The third run finishes and exports; its metrics hold the whole history: every part with its ranks, the log
    lines of all three (every 2 steps) once each, the first run's evaluations (the last one after its final
    checkpoint) and each part's wall time, drawn in training_curves.png."""
    metrics = json.loads((chain.out / "train_metrics.json").read_text())
    assert (metrics["world_size"], metrics["train_batch_size"], metrics["steps"]) == (2, 32, 6)
    parts = [(p["first_step"], p["last_step"], p["world_size"]) for p in metrics["parts"]]
    assert parts == [(0, 2, 2), (2, 4, 1), (4, 6, 2)]
    assert [log["step"] for log in metrics["logs"]] == [2, 4, 6] and [e["step"] for e in metrics["evals"]] == [1, 2]
    assert metrics["evals"] == chain.first["evals"]
    assert metrics["wall_time_s"] == pytest.approx(sum(p["wall_time_s"] for p in metrics["parts"]))
    assert (chain.out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert metrics["engine"]["optimizer"] == "torch.optim.adamw.AdamW" and metrics["engine"]["skipped_steps"] == 0
    assert_span_head_export(chain.out)
    assert checkpoint.complete_tags(checkpoint_root(chain.out)) == ["step00000004", "step00000006"]


@pytest.mark.slow
@pytest.mark.mpi
def test_the_export_holds_the_optimizers_fp32_weights(chain):
    """The final export is the fp32 weights the optimizer held at the last step (the tap's dump before the step-6
    checkpoint: ZeRO's gathered master partitions, or the module's own fp32 weights under autocast), not the
    16-bit copy a bf16 run computed with cast back up: hardly an element of it is a bf16 value."""
    from safetensors.torch import load_file

    exported = load_file(chain.out / "model.safetensors")
    saved = torch.load(chain.dumps / "saved-step6.pt")["tensors"]
    assert saved.keys() <= exported.keys()
    for name, (weight, _, _) in saved.items():
        assert exported[name].dtype == torch.float32 and torch.equal(exported[name], weight), name
    elements = sum(t.numel() for t in exported.values())
    in_bf16 = sum(int((t == t.to(torch.bfloat16).float()).sum()) for t in exported.values())
    assert in_bf16 < 0.05 * elements, f"{in_bf16} of {elements} exported values are bf16 values"


@pytest.mark.slow
@pytest.mark.mpi
def test_export_of_the_last_checkpoint_is_the_runs_own_export(chain, tmp_path, sample_dev):
    """`bert-squad export` of the step-6 checkpoint (2 ranks wrote it) in one process gives the run's
    final export: the same weights, config, modelling file and logits; evaluate and answer take it."""
    from bert_squad import span_head
    from bert_squad.answer import Answerer

    export = tmp_path / "export"
    r = run_bert_squad("export", "--checkpoint", checkpoint_root(chain.out), "--output-dir", export, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_weights(export, chain.out)
    for name in ("config.json", f"{span_head.MODULE}.py"):
        assert (export / name).read_text() == (chain.out / name).read_text(), name
    models = [Answerer.from_pretrained(d) for d in (export, chain.out)]
    enc = models[0].tokenizer("Where was Ada Novak born?", "Ada Novak was born in Lugano in 1834.", return_tensors="pt")
    with torch.no_grad():
        ours, theirs = (qa.module.eval()(**enc) for qa in models)
    assert torch.equal(ours.start_logits, theirs.start_logits) and torch.equal(ours.end_logits, theirs.end_logits)
    if chain.name != "zero3_bf16":
        return
    r = run_bert_squad(
        *inference_args("evaluate", export, sample_dev, tmp_path / "eval", cache=tmp_path / "cache"), timeout=300
    )
    assert r.returncode == 0 and '"exact_match"' in r.stdout, r.stderr[-3000:]
    answers = [
        run_bert_squad(
            "answer",
            "--model-dir",
            d,
            "--question",
            "Where was Ada Novak born?",
            "--context",
            "Ada Novak was born in Lugano in 1834.",
            "--json",
            timeout=300,
        )
        for d in (export, chain.out)
    ]
    assert answers[0].returncode == 0 and answers[0].stdout == answers[1].stdout, answers[0].stderr[-3000:]


@pytest.mark.slow
@pytest.mark.mpi
def test_a_conversion_is_reused_and_redone_when_damaged(chain):
    path = checkpoint_root(chain.out) / "step00000004"  # converted when the third run resumed it on 2 ranks
    if not chain.zero_stage:
        assert not (path / resume.DIR).exists()  # ZeRO-0 resumed as it was: nothing converted
        return
    assert resume.convert_once(path) == "reused its conversion"
    (path / resume.DIR / "zero" / "optimizer_state.pt").unlink()
    note = resume.convert_once(path)
    assert note.startswith("converted in") and "damaged: zero/optimizer_state.pt is missing" in note
    assert checkpoint.describe_damage(path / resume.DIR) is None
    assert not list(path.glob(".universal-*"))


# --- damaged checkpoints ----------------------------------------------------------------------------


def flip_a_byte(f):
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))


DAMAGES = {  # what happens to one file of the newest checkpoint
    "truncated model states": ("mp_rank_00_model_states.pt", lambda f: os.truncate(f, f.stat().st_size // 2)),
    "deleted optimizer shard": ("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", Path.unlink),
    "corrupted RNG file": ("rng_rank0.pt", flip_a_byte),
}


@pytest.fixture(scope="module")
def two_checkpoints(tiny_model, sample_train, tmp_path_factory):
    """A ZeRO-2 run on 1 rank with checkpoints at steps 2 and 4 (through the state tap: its dumps), and the same
    run resumed from step 2 to step 6 directly."""
    tmp = tmp_path_factory.mktemp("damage")
    config = ds_config("zero2_bf16", tmp)
    r = tapped(tmp / "dumps", *resume_args(tiny_model, sample_train, tmp / "out", config), "--max-steps", 4)
    assert r.returncode == 0, r.stderr[-3000:]
    shutil.copytree(tmp / "out", tmp / "direct")
    r = run_bert_squad(
        *resume_args(tiny_model, sample_train, tmp / "direct", config),
        "--max-steps",
        6,
        "--resume",
        checkpoint_root(tmp / "direct") / "step00000002",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return SimpleNamespace(out=tmp / "out", dumps=tmp / "dumps", direct=tmp / "direct", config=config)


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_is_passed_over(damage, two_checkpoints, tiny_model, sample_train, tmp_path):
    """`--resume auto` names the damaged file in one line and resumes from the checkpoint before, ending
    like a run resumed from that one directly; named with `--resume PATH`, it is refused in one line."""
    out = tmp_path / "out"
    shutil.copytree(two_checkpoints.out, out)
    name, harm = DAMAGES[damage]
    damaged = checkpoint_root(out) / "step00000004"
    harm(damaged / name)
    args = resume_args(tiny_model, sample_train, out, two_checkpoints.config)
    r = run_bert_squad(*args, "--max-steps", 6, "--resume", damaged)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert f"{damaged}: damaged checkpoint: {name} " in r.stderr
    r = run_bert_squad(*args, "--max-steps", 6)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [line for line in r.stdout.splitlines() if "damaged checkpoint:" in line]
    assert line.startswith(f"{damaged}: damaged checkpoint: {name} ") and line.endswith(
        "resuming from step00000002 instead"
    ), line
    assert f"resumed from {checkpoint_root(out)}/step00000002 at step 2" in r.stdout
    assert_same_weights(out, two_checkpoints.direct)


# --- bad input: one line, exit 2, nothing written --------------------------------------------------


@pytest.mark.slow
def test_export_of_what_is_not_a_checkpoint(tiny_model, tmp_path):
    r = run_bert_squad("export", "--checkpoint", tiny_model, "--output-dir", tmp_path / "export", timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"bert-squad export: error: {tiny_model}: not a complete checkpoint (no '{MARKER}' marker)"
    )
    assert not (tmp_path / "export").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, message",
    [
        ("model", "a checkpoint of another model ("),
        ("window", "written with --max-seq-length 128, this run has 96: its data position counts those windows"),
    ],
)
def test_a_checkpoint_of_another_model_or_window_is_refused(
    change, message, two_checkpoints, tiny_model, tiny_family, sample_train, tmp_path
):
    model = tiny_family("distilbert") if change == "model" else tiny_model
    args = resume_args(model, sample_train, tmp_path / "out", two_checkpoints.config)
    if change == "window":
        args[args.index("--max-seq-length") + 1] = "96"
    r = run_bert_squad(*args, "--resume", checkpoint_root(two_checkpoints.out) / "step00000002")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr[-3000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_conversion_into_a_read_only_checkpoint_is_refused(two_checkpoints, tiny_model, sample_train, tmp_path):
    """Resuming a 1-rank ZeRO-2 checkpoint on 2 ranks (micro batch 8: the global batch of 16 kept) needs
    its universal conversion, inside it; on a read-only file system (a bind mount in a mount namespace of
    its own) that is one line, exit 2. The check comes before the process group, so one process of the
    two is enough."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare (util-linux)")
    source = checkpoint_root(two_checkpoints.out) / "step00000002"
    config = json.loads(two_checkpoints.config.read_text())
    (tmp_path / "micro8.json").write_text(json.dumps(dict(config, train_micro_batch_size_per_gpu=8)))
    readonly = f'mount --bind "{source}" "{source}" && mount -o remount,ro,bind "{source}" && exec "$@"'
    cmd = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        readonly,
        "sh",
        PYTHON,
        "-m",
        "bert_squad",
        *map(str, resume_args(tiny_model, sample_train, tmp_path / "out", tmp_path / "micro8.json")),
        "--resume",
        str(source),
    ]
    env = dict(os.environ, **rank_env(0, 2, free_port()))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    if "unshare failed" in r.stderr or "mount:" in r.stderr:
        pytest.skip(f"no mount namespace here: {r.stderr.strip()}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert f"{source}: resuming it on another number of ranks converts" in r.stderr
    assert "cannot be written (Read-only file system)" in r.stderr
    assert not (source / resume.DIR).exists() and not (tmp_path / "out").exists()

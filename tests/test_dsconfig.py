"""DeepSpeed configs: named by a shipped name or a path; shipped ones are valid; bad ones fail before any work
with the key named."""

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import gpu_count, run_bert_squad, sample_path, train_args

from bert_squad import config
from bert_squad.dsconfig import AS_GIVEN, MONITORS, Batch, locate, settings
from bert_squad.dsconfig import SHIPPED_DIR as CONFIG_DIR
from bert_squad.dsconfig import load as load_ds_config
from bert_squad.engine import step_once
from bert_squad.errors import UserError

SHIPPED = sorted(CONFIG_DIR.glob("ds_*.json"))
CPU = torch.device("cpu")  # a run on this machine; device=None: a plan for a job's device, not this machine's


def test_all_five_configs_ship():
    assert {p.name for p in SHIPPED} == {
        "ds_fp32.json",
        "ds_fp16.json",
        "ds_bf16.json",
        "ds_zero2.json",
        "ds_zero3.json",
    }


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_are_valid_deepspeed_configs(path):
    cfg = settings(load_ds_config(path), path, world_size=2, device=None).finish(total_steps=100, warmup_ratio=0.1)
    cfg = cfg.as_dict()
    assert cfg["optimizer"]["type"] == "AdamW"
    params = cfg["scheduler"]["params"]
    assert params["total_num_steps"] == 100 and params["warmup_num_steps"] == 10
    assert params["warmup_max_lr"] == cfg["optimizer"]["params"]["lr"]
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 2


def test_a_warmup_ratio_of_0_fills_the_least_warmup_deepspeed_takes():
    """--warmup-ratio 0 (Hugging Face's default) fills one warmup step: DeepSpeed's warmup schedulers refuse 0."""
    import torch
    from deepspeed.runtime.lr_schedules import WarmupDecayLR

    path = SHIPPED[0]
    cpu = torch.device("cpu")
    params = settings(load_ds_config(path), path, world_size=1, device=cpu).finish(100, 0.0).as_dict()["scheduler"]
    assert params["params"]["warmup_num_steps"] == 1
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    WarmupDecayLR(optimizer, **{**params["params"], "warmup_max_lr": 1e-3})  # DeepSpeed takes it


def test_batch_arithmetic_mismatch_names_the_keys(tmp_path):
    cfg = {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1}
    with pytest.raises(UserError, match="train_batch_size 48 != train_micro_batch_size_per_gpu 16"):
        settings(cfg, "x.json", world_size=2, device=CPU)
    assert settings(cfg, "x.json", world_size=3, device=CPU).batch.size == 48


def test_global_batch_only_must_divide():
    with pytest.raises(UserError, match="not divisible"):
        settings({"train_batch_size": 30, "gradient_accumulation_steps": 4}, "x.json", world_size=2, device=CPU)
    cfg = settings({"train_batch_size": 32, "gradient_accumulation_steps": 4}, "x.json", world_size=2, device=CPU)
    assert cfg.batch.micro == 4


def test_the_micro_batch_flag_replaces_the_files_and_the_global_batch_follows():
    cfg = {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 3}
    chosen = settings(cfg, "x.json", world_size=2, device=CPU, micro_batch_size=4)
    assert chosen.batch == Batch(4, 3, 2) and chosen.batch.size == 24
    written = chosen.finish(10, 0.1).as_dict()
    assert (written["train_micro_batch_size_per_gpu"], written["train_batch_size"]) == (4, 24)
    assert cfg["train_micro_batch_size_per_gpu"] == 16  # the file's own values stay as read


def test_the_accumulation_flag_replaces_the_files_and_the_global_batch_follows():
    """--gradient-accumulation-steps: the micro batch stays the file's (or --micro-batch-size's), whichever batch
    keys the file gives, and the global batch follows by the batch rule."""
    cfg = {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 3}
    chosen = settings(cfg, "x.json", world_size=1, device=CPU, gradient_accumulation_steps=2)
    assert chosen.batch == Batch(16, 2, 1)
    written = chosen.finish(10, 0.1).as_dict()
    assert (written["gradient_accumulation_steps"], written["train_batch_size"]) == (2, 32)
    assert cfg["gradient_accumulation_steps"] == 3  # the file's own values stay as read
    total_only = {"train_batch_size": 32, "gradient_accumulation_steps": 4}  # micro 32 / (4 x 2) = 4
    assert settings(total_only, "x.json", world_size=2, device=CPU, gradient_accumulation_steps=1).batch == Batch(
        4, 1, 2
    )
    both = settings(cfg, "x.json", world_size=2, device=CPU, micro_batch_size=2, gradient_accumulation_steps=5)
    assert both.batch == Batch(2, 5, 2) and both.batch.size == 20


def test_report_to_turns_one_monitor_on_and_every_other_off(tmp_path):
    """--report-to's choices are DeepSpeed's monitor sections; the one named is on in the run's config (its
    other keys kept), every other one the file turned on is off, and DeepSpeed's reading agrees."""
    assert {m for sections in config.REPORT_TO.values() for m in sections} <= set(MONITORS)
    cfg = plain(tensorboard={"enabled": True, "output_path": "tb"}, csv_monitor={"enabled": False, "job_name": "j"})
    for choice, on in (("csv", "csv_monitor"), ("tensorboard", "tensorboard"), ("none", None)):
        monitors = config.TrainConfig(report_to=choice).monitors
        chosen = settings(cfg, "c.json", world_size=1, device=CPU, monitors=monitors, output_dir=tmp_path)
        written = chosen.finish(10, 0.1).as_dict()
        assert {m: chosen.reading.monitor(m).enabled for m in MONITORS} == {m: m == on for m in MONITORS}
        assert written["csv_monitor"]["job_name"] == "j" and written["tensorboard"]["output_path"] == "tb"
        assert "wandb" not in written and "comet" not in written  # off already: not written in
    assert settings(cfg, "c.json", world_size=1, device=CPU, monitors=None).reading.monitor("tensorboard").enabled


def test_the_options_over_the_config_reach_the_plan(tmp_path):
    """`bert-squad config` with run_qa.py's spellings: the accumulation and the monitor in the config the run
    would hand the engine."""
    env = {"CUDA_VISIBLE_DEVICES": ""} if gpu_count() else None
    args = train_args(UNCACHED, sample_path("train-v1.1.json"), tmp_path / "out", cache=tmp_path / "cache")
    extra = ["--gradient_accumulation_steps", "3", "--report_to", "csv", "--deepspeed", "ds_bf16"]
    r = run_bert_squad("config", *args, *extra, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    written = json.loads(r.stdout)["deepspeed_config"]
    micro = load_ds_config(CONFIG_DIR / "ds_bf16.json")["train_micro_batch_size_per_gpu"]
    assert (written["gradient_accumulation_steps"], written["train_batch_size"]) == (3, 3 * micro)
    assert written["csv_monitor"] == {"enabled": True} and written["torch_autocast"]["dtype"] == "bfloat16"


def test_deepspeeds_fp16_weights_without_gpu_are_refused_or_planned_as_a_need():
    """DeepSpeed's fp16 section needs a GPU: refused for a run on a CPU, a need of the job in a plan made where no
    GPU is; fp16 autocast (ds_fp16) runs on a CPU, as bf16 does."""
    zero2 = load_ds_config(CONFIG_DIR / "ds_zero2.json")
    with pytest.raises(UserError, match=r"fp16\.enabled needs a GPU"):
        settings(zero2, "ds_zero2.json", world_size=1, device=CPU)
    assert settings(zero2, "ds_zero2.json", world_size=1, device=None).needs == (
        "fp16.enabled: a GPU (DeepSpeed's fp16 weights run on a GPU only)",
    )
    cfg = load_ds_config(CONFIG_DIR / "ds_fp16.json")
    assert settings(cfg, "ds_fp16.json", world_size=1, device=CPU).precision == "fp16"


@pytest.mark.parametrize(
    "sections, message",
    [
        ({"torch_autocast": {"enabled": True}}, "torch_autocast.dtype must be bfloat16 or float16, not None"),
        ({"torch_autocast": {"enabled": True, "dtype": "int8"}}, "not 'int8'"),
        ({"torch_autocast": {"enabled": True, "dtype": "bf16"}, "bf16": {"enabled": True}}, "choose one"),
    ],
)
def test_precision_sections_that_cannot_run(sections, message):
    with pytest.raises(UserError, match=message):
        settings({"train_micro_batch_size_per_gpu": 8, **sections}, "x.json", world_size=1, device=None)


@pytest.mark.parametrize(
    "name, precision, stage, loop_clip",
    [
        # fp32 weights at stage 0: the loop clips the whole gradient in one foreach call, DeepSpeed does not
        ("ds_fp32", "fp32", 0, 1.0),
        ("ds_bf16", "bf16", 0, 1.0),
        ("ds_fp16", "fp16", 0, 1.0),
        # ZeRO's optimizer clips its flat fp32 partition itself
        ("ds_zero2", "fp16", 2, 0.0),
        ("ds_zero3", "fp16", 3, 0.0),
    ],
)
def test_each_shipped_config_takes_its_path(name, precision, stage, loop_clip):
    finished = settings(load_ds_config(CONFIG_DIR / f"{name}.json"), name, world_size=2, device=None).finish(10, 0.1)
    assert (finished.precision, finished.zero_stage, finished.loop_clip) == (precision, stage, loop_clip)
    # one of the two clips, never both, at the config's norm; the run's config keeps the norm it was given
    assert {finished.loop_clip, finished.for_engine()["gradient_clipping"]} == {0.0, 1.0}
    assert finished.values["gradient_clipping"] == 1.0
    assert finished.values["optimizer"]["params"]["fused"] is True  # torch's fused AdamW, on every device


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu must be a positive integer, not 0$"),
        ({"gradient_accumulation_steps": "2"}, "gradient_accumulation_steps must be a positive integer, not '2'$"),
        ({"zero_optimization": {"stage": 7}}, "zero_optimization.stage: must be one of 0, 1, 2, 3, not 7"),
        (
            {"optimizer": {"type": "AdamW", "params": {"lr": -1}}},
            "optimizer.params.lr must be a positive number, not -1$",
        ),
        ({}, "give train_micro_batch_size_per_gpu \\(or train_batch_size\\)$"),
    ],
)
def test_impossible_values(cfg, message):
    with pytest.raises(UserError, match="^x.json: " + message):
        settings({"train_micro_batch_size_per_gpu": 8, **cfg} if cfg else cfg, "x.json", world_size=1, device=CPU)


def plain(**sections):
    """The shipped fp32 config with sections (or top-level values) replaced."""
    return {**load_ds_config(CONFIG_DIR / "ds_fp32.json"), **sections}


# Each switch the run acts on, given as a string: read as true by Python, as false by pydantic, never as JSON says.
SWITCHES = {
    "fp16.enabled": {"fp16": {"enabled": "false"}},
    "bf16.enabled": {"bf16": {"enabled": "false"}},
    "torch_autocast.enabled": {"torch_autocast": {"enabled": "false", "dtype": "bfloat16"}},
    **{f"{m}.enabled": {m: {"enabled": "false"}} for m in ("tensorboard", "csv_monitor", "wandb", "comet")},
    "zero_optimization.offload_optimizer.pin_memory": {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": "false"}}
    },
    "wall_clock_breakdown": {"wall_clock_breakdown": "yes"},
    "prescale_gradients": {"prescale_gradients": "false"},
    "optimizer.params.fused": {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "fused": "no"}}},
}
# Each number the run acts on given otherwise than JSON's numbers, or a value DeepSpeed would divide by.
NUMBERS = {
    "zero_optimization.stage": {"zero_optimization": {"stage": "2"}},
    "zero_optimization.reduce_bucket_size": {"zero_optimization": {"stage": 2, "reduce_bucket_size": "5e8"}},
    "fp16.loss_scale_window": {"fp16": {"enabled": False, "loss_scale_window": True}},
    "steps_per_print": {"steps_per_print": 0},
    "gradient_clipping": {"gradient_clipping": "1.0"},
    "train_micro_batch_size_per_gpu": {"train_micro_batch_size_per_gpu": "16"},
    "gradient_predivide_factor": {"gradient_predivide_factor": "2"},
    "optimizer.params.eps": {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True, "eps": "1e-8"}}},
    "scheduler.params.total_num_steps": {"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "100"}}},
}


@pytest.mark.parametrize("key", [*SWITCHES, *NUMBERS])
def test_a_value_read_otherwise_than_json_says_is_refused_by_key(key):
    """A string (or a switch) where DeepSpeed reads a switch or a number, in every section the run reads, and a
    value DeepSpeed would divide by: one line naming the key, for a run and for a plan alike."""
    for device in (CPU, None):
        with pytest.raises(UserError, match=f"^c.json: {re.escape(key)}[: ]") as err:
            settings(plain(**{**SWITCHES, **NUMBERS}[key]), "c.json", world_size=1, device=device)
        assert "\n" not in str(err.value)
    if key in SWITCHES and key.endswith(".enabled") and key != "torch_autocast.enabled":
        assert str(err.value).endswith('is the string "false", which DeepSpeed reads as false: write false')


def test_a_value_deepspeed_reads_raw_is_of_the_kind_of_its_own_default():
    """DeepSpeed acts on a top-level switch or number as JSON gives it (its DeepSpeedConfig, the oracle, holds
    prescale_gradients "false", which is true to Python): every one it reads with a switch or number for a default
    is refused as a string, by the kind of that default, and a value of its kind passes."""
    from deepspeed.runtime.config import DeepSpeedConfig

    assert DeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "prescale_gradients": "false"}).prescale_gradients
    defaults = settings(plain(), "c.json", world_size=1, device=CPU).reading.defaults
    read_raw = {k: v for k, v in defaults.items() if "." not in k and isinstance(v, (bool, int, float))}
    assert {"prescale_gradients", "gradient_predivide_factor", "wall_clock_breakdown"} <= set(read_raw)
    for key, default in read_raw.items():
        kind = "true or false" if isinstance(default, bool) else "a number"
        if key in AS_GIVEN:  # which must be more than their kind (a positive integer, a norm), said so
            kind = AS_GIVEN[key]
        with pytest.raises(UserError, match=f"^c.json: {key} must be {re.escape(kind)}, not '"):
            settings(plain(**{key: json.dumps(default)}), "c.json", world_size=1, device=CPU)
        settings(plain(**{key: default}), "c.json", world_size=1, device=CPU)


def test_the_run_reads_a_config_as_deepspeeds_engine_does():
    """Precision, stage, offload and clipping are DeepSpeed's own reading of the file (its DeepSpeedConfig is the
    oracle): its old spelling of bf16, a number for a switch, a float for a stage."""
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = plain(bfloat16={"enabled": 1}, zero_optimization={"stage": 2.0, "cpu_offload": True})
    engine = DeepSpeedConfig(dict(cfg))
    ours = settings(cfg, "c.json", world_size=1, device=CPU)
    assert engine.bfloat16_config.enabled and engine.zero_optimization_stage == 2
    assert (ours.precision, ours.zero_stage) == ("bf16", 2)
    assert ours.reading.offload("offload_optimizer").device == engine.zero_config.offload_optimizer.device == "cpu"
    assert ours.finish(10, 0.1).loop_clip == 0.0  # 16-bit weights under ZeRO: its optimizer clips


def test_an_optimizer_is_stepped_once_as_a_copy_so_torch_checks_its_kernel_arguments():
    """torch's AdamW takes capturable=True on a GPU and refuses it on a CPU only at a step (torch is the oracle:
    the same error from stepping the optimizer itself). `step_once` steps a copy of the engine's optimizer, with
    the arguments it was built with, on a parameter of its own."""
    param = torch.nn.Parameter(torch.ones(2))
    built = torch.optim.AdamW([param], lr=1e-3, capturable=True)
    with pytest.raises(Exception) as ours:
        step_once(built, CPU)
    param.grad = torch.zeros_like(param)
    with pytest.raises(Exception) as torchs:
        built.step()
    assert type(ours.value) is type(torchs.value) and str(ours.value) == str(torchs.value)
    param.grad = None
    fine = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.5, fused=True)
    step_once(fine, CPU)
    assert param.equal(torch.ones(2)) and fine.state == {}  # the run's own parameter and state untouched


def test_nvme_offload_needs_its_directory_and_deepspeeds_async_io_op(tmp_path):
    """An NVMe path that does not exist is refused by its key; one that does still needs DeepSpeed's async_io op,
    which this machine may lack (libaio): either it is built or the line names the device."""
    zero3 = {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": str(tmp_path / "nvme")}}
    with pytest.raises(UserError, match=rf"^c.json: zero_optimization.offload_param.nvme_path {tmp_path}/nvme: cannot"):
        settings(plain(zero_optimization=zero3), "c.json", world_size=1, device=CPU)
    needs = settings(plain(zero_optimization=zero3), "c.json", world_size=1, device=None).needs
    assert needs[0] == (
        f"zero_optimization.offload_param.nvme_path {tmp_path}/nvme on the job's nodes (here: cannot be written: No "
        "such file or directory)"
    )
    (tmp_path / "nvme").mkdir()
    try:
        settings(plain(zero_optimization=zero3), "c.json", world_size=1, device=CPU)
    except UserError as err:
        assert str(err).startswith(
            "c.json: zero_optimization.offload_param.device nvme: DeepSpeed's async_io op cannot"
        )
    assert list((tmp_path / "nvme").iterdir()) == []  # its probe leaves nothing


def test_how_a_checkpoint_loads_is_refused():
    with pytest.raises(UserError, match=r"^c.json: checkpoint.load_universal: how a checkpoint loads is the run's"):
        settings(plain(checkpoint={"load_universal": False}), "c.json", world_size=1, device=CPU)


def test_unknown_key_and_malformed_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "fp61": {"enabled": True}}))
    with pytest.raises(UserError, match=f"{p}: unknown key 'fp61' \\(did you mean 'fp16'\\?\\)"):
        load_ds_config(p)
    p.write_text('{"train_micro_batch_size_per_gpu": 8,')
    with pytest.raises(UserError, match="malformed JSON at line 1"):
        load_ds_config(p)
    with pytest.raises(UserError, match="no such DeepSpeed config"):
        load_ds_config(Path(tmp_path / "missing.json"))


def test_deepspeed_judges_the_keys(tmp_path):
    """Sections DeepSpeed reads are valid without a hand-kept list; inside a section its own model judges."""
    valid = {
        "train_micro_batch_size_per_gpu": 8,
        "tensorboard": {"enabled": False, "output_path": "tb"},
        "wandb": {"enabled": False, "project": "p"},
        "csv_monitor": {"enabled": False},
        "comet": {"enabled": False},
        "aio": {"block_size": 1048576},
        "flops_profiler": {"enabled": False},
        "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
    }
    p = tmp_path / "c.json"
    p.write_text(json.dumps(valid))
    settings(load_ds_config(p), p, world_size=2, device=CPU)
    for section, message in (
        (
            ("zero_optimization", {"stage": 3, "stage3_prefetch_bucket_sise": 1}),
            "zero_optimization.stage3_prefetch_bucket_sise: unknown key",
        ),
        (("csv_monitor", {"enabled": True, "jobname": "x"}), "csv_monitor.jobname: unknown key"),
        (("tensorboard", {"enabled": "maybe"}), "tensorboard.enabled: input should be a valid boolean"),
        (("optimizer", "AdamW"), "'optimizer' and its 'params' must be JSON objects"),
        (("elasticity", {}), "elasticity: DeepSpeed refuses it: Elastic training has been removed"),
    ):
        with pytest.raises(UserError, match=f"^{p}: {message}") as err:
            settings(dict(valid, **dict([section])), p, world_size=1, device=CPU)
        assert "\n" not in str(err.value)


def test_what_the_engine_is_told_for_this_run_alone_is_not_in_the_written_config(tmp_path):
    """A file monitor without an output_path writes into the run's output dir, the loop's clipping turns
    DeepSpeed's off, a universal checkpoint is loaded: the engine is told, the written config keeps the user's."""
    cfg = plain(csv_monitor={"enabled": True}, tensorboard={"enabled": False})
    chosen = settings(cfg, "c.json", world_size=2, device=CPU, output_dir=tmp_path)
    done = chosen.resuming(chosen.batch, load_universal=True).finish(10, 0.1)
    engine, written = done.for_engine(), done.as_dict()
    assert (
        engine["csv_monitor"]["output_path"] == str(tmp_path / "monitor") and "output_path" not in engine["tensorboard"]
    )
    assert (engine["gradient_clipping"], engine["checkpoint"]) == (0.0, {"load_universal": True})
    expected = {**engine, "csv_monitor": {"enabled": True}, "gradient_clipping": 1.0}
    del expected["checkpoint"]
    assert written == expected
    named = plain(csv_monitor={"enabled": True, "output_path": "/elsewhere"})
    done = settings(named, "c.json", world_size=1, device=CPU, output_dir=tmp_path).finish(10, 0.1)
    assert done.for_engine()["csv_monitor"]["output_path"] == "/elsewhere"


def test_the_finished_config_cannot_be_edited():
    """What the engine gets is a finished value: a caller's copy changes nothing in it."""
    done = settings({"train_micro_batch_size_per_gpu": 4}, "c.json", world_size=2, device=CPU).finish(10, 0.1)
    copy = done.as_dict()
    copy["train_micro_batch_size_per_gpu"] = 99
    assert done.as_dict()["train_micro_batch_size_per_gpu"] == 4 and done.batch.size == 8
    with pytest.raises(AttributeError):
        done.text = "{}"


def test_shipped_configs_by_name_or_path(tmp_path):
    assert locate("ds_bf16") == CONFIG_DIR / "ds_bf16.json" == locate("ds_bf16.json")
    own = tmp_path / "mine.json"
    own.write_text("{}")
    assert locate(str(own)) == own
    with pytest.raises(UserError, match=r"ds_bf17: no such DeepSpeed config .*ds_bf16, ds_fp16, ds_fp32, ds_zero2"):
        locate("ds_bf17")


def test_the_flag_is_spelled_like_every_other_and_deepspeeds_spelling_still_parses(tmp_path):
    """--deepspeed-config is the flag the help shows; --deepspeed_config (DeepSpeed's own scripts' spelling)
    gives the same run configuration."""
    own = tmp_path / "mine.json"
    own.write_text("{}")
    for value in ("ds_bf16", str(own)):
        dashed = config.parse_run_config(["--deepspeed-config", value])
        assert dashed == config.parse_run_config(["--deepspeed_config", value])
        assert dashed.train.deepspeed_config == value
    help_text = config.training_parser().format_help()
    assert "--deepspeed-config NAME_OR_FILE" in help_text and "[--deepspeed-config NAME_OR_FILE]" in help_text
    assert "--deepspeed-config" in config.training_options()


def test_a_config_is_named_by_one_rule_from_where_the_run_starts(tmp_path):
    """A path is read from the directory the run starts in (`base`: the job's checkout for launch's check), else
    a shipped name; nothing else."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mine.json").write_text("{}")
    assert locate("configs/mine.json", base=tmp_path) == tmp_path / "configs" / "mine.json"
    assert locate("ds_bf16", base=tmp_path) == CONFIG_DIR / "ds_bf16.json" == locate("ds_bf16.json", base=tmp_path)
    for name in ("configs/mine.json", "ds_bf16.txt", "other/ds_bf16.json"):
        with pytest.raises(UserError, match="no such DeepSpeed config"):
            locate(name)  # not in this directory
    # A name that is neither: the nearest shipped name, or the nearest JSON file in the folder named.
    for name, nearest in (
        ("ds_bf61", "ds_bf16"),
        ("ds_zero_3.json", "ds_zero3"),
        ("configs/mien.json", "configs/mine.json"),
    ):
        with pytest.raises(UserError, match=f"; did you mean '{nearest}'\\?$"):
            locate(name, base=tmp_path)
    with pytest.raises(UserError, match=r"ds_zero2, ds_zero3\)$"):  # nothing near
        locate("configs/other.json", base=tmp_path)


UNCACHED = "google-bert/bert-not-in-the-cache"  # a hub name no test downloads


@pytest.mark.parametrize("name", [p.stem for p in SHIPPED])
def test_a_job_is_planned_on_a_login_node(name, tmp_path):
    """`bert-squad config` where the job will not run, without a GPU and before the model is downloaded: the
    shipped config resolved as far as it can be (the batch, the learning rate the warmup goes to), and what the
    job needs, each said once; exit 0 and nothing written."""
    env = {"CUDA_VISIBLE_DEVICES": ""} if gpu_count() else None  # a login node has no GPU
    args = train_args(UNCACHED, sample_path("train-v1.1.json"), tmp_path / "out", cache=tmp_path / "cache")
    r = run_bert_squad("config", *args, "--deepspeed-config", name, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    plan = json.loads(r.stdout)
    shipped = load_ds_config(CONFIG_DIR / f"{name}.json")
    shipped["scheduler"]["params"]["warmup_max_lr"] = shipped["optimizer"]["params"]["lr"]
    shipped["train_batch_size"] = shipped["train_micro_batch_size_per_gpu"] * shipped["gradient_accumulation_steps"]
    assert plan["deepspeed_config"] == shipped and plan["total_steps"] is None
    needs = plan["needs"]
    assert needs[-2].startswith(f"model '{UNCACHED}' is not in the cache {tmp_path / 'cache' / 'hub'}")
    assert needs[-1] == (
        "the run's length, counted from its features by the model's tokenizer: scheduler.params.warmup_num_steps, "
        'scheduler.params.total_num_steps stay "auto" here, filled at the job\'s start'
    )
    assert needs[:-2] == (
        ["fp16.enabled: a GPU (DeepSpeed's fp16 weights run on a GPU only)"] if "zero" in name else []
    )
    assert not (tmp_path / "out").exists()


def test_a_plan_with_the_model_counts_the_steps_and_still_names_the_gpu(tiny_model, sample_train, tmp_path):
    """With the model in reach, the plan counts the run's steps and fills the schedule; ZeRO-2's fp16 weights are
    still the job's GPU's to run where this machine has none."""
    env = {"CUDA_VISIBLE_DEVICES": ""} if gpu_count() else None
    args = train_args(tiny_model, sample_train, tmp_path / "out", "--max-steps", 7, cache=tmp_path / "cache")
    r = run_bert_squad(*args, "--deepspeed-config", "ds_zero2", "--print-config", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    plan = json.loads(r.stdout)
    assert plan["total_steps"] == plan["deepspeed_config"]["scheduler"]["params"]["total_num_steps"] == 7
    assert plan["needs"] == ["fp16.enabled: a GPU (DeepSpeed's fp16 weights run on a GPU only)"]

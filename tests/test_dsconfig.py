"""DeepSpeed configs: named by a shipped name or a path; shipped ones are valid; bad ones fail before any work
with the key named."""

import json
from pathlib import Path

import pytest

from bert_squad import config
from bert_squad.dsconfig import SHIPPED_DIR as CONFIG_DIR
from bert_squad.dsconfig import Batch, locate, settings
from bert_squad.dsconfig import load as load_ds_config
from bert_squad.errors import UserError

SHIPPED = sorted(CONFIG_DIR.glob("ds_*.json"))


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
    cfg = settings(load_ds_config(path), path, world_size=2, has_gpu=True).finish(total_steps=100, warmup_ratio=0.1)
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
    params = settings(load_ds_config(path), path, world_size=1, has_gpu=False).finish(100, 0.0).as_dict()["scheduler"]
    assert params["params"]["warmup_num_steps"] == 1
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    WarmupDecayLR(optimizer, **{**params["params"], "warmup_max_lr": 1e-3})  # DeepSpeed takes it


def test_batch_arithmetic_mismatch_names_the_keys(tmp_path):
    cfg = {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1}
    with pytest.raises(UserError, match="train_batch_size 48 != train_micro_batch_size_per_gpu 16"):
        settings(cfg, "x.json", world_size=2, has_gpu=False)
    assert settings(cfg, "x.json", world_size=3, has_gpu=False).batch.size == 48


def test_global_batch_only_must_divide():
    with pytest.raises(UserError, match="not divisible"):
        settings({"train_batch_size": 30, "gradient_accumulation_steps": 4}, "x.json", world_size=2, has_gpu=False)
    cfg = settings({"train_batch_size": 32, "gradient_accumulation_steps": 4}, "x.json", world_size=2, has_gpu=False)
    assert cfg.batch.micro == 4


def test_the_micro_batch_flag_replaces_the_files_and_the_global_batch_follows():
    cfg = {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 3}
    chosen = settings(cfg, "x.json", world_size=2, has_gpu=False, micro_batch_size=4)
    assert chosen.batch == Batch(4, 3, 2) and chosen.batch.size == 24
    written = chosen.finish(10, 0.1).as_dict()
    assert (written["train_micro_batch_size_per_gpu"], written["train_batch_size"]) == (4, 24)
    assert cfg["train_micro_batch_size_per_gpu"] == 16  # the file's own values stay as read


def test_deepspeeds_fp16_weights_without_gpu_are_refused():
    """DeepSpeed's fp16 section needs a GPU; fp16 autocast (ds_fp16) runs on a CPU, as bf16 does."""
    with pytest.raises(UserError, match=r"fp16\.enabled needs a GPU"):
        settings(load_ds_config(CONFIG_DIR / "ds_zero2.json"), "ds_zero2.json", world_size=1, has_gpu=False)
    cfg = load_ds_config(CONFIG_DIR / "ds_fp16.json")
    assert settings(cfg, "ds_fp16.json", world_size=1, has_gpu=False).precision == "fp16"


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
        settings({"train_micro_batch_size_per_gpu": 8, **sections}, "x.json", world_size=1, has_gpu=True)


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
    finished = settings(load_ds_config(CONFIG_DIR / f"{name}.json"), name, world_size=2, has_gpu=True).finish(10, 0.1)
    assert (finished.precision, finished.zero_stage, finished.loop_clip) == (precision, stage, loop_clip)
    # one of the two clips, never both, at the config's norm; the run's config keeps the norm it was given
    assert {finished.loop_clip, finished.for_engine()["gradient_clipping"]} == {0.0, 1.0}
    assert finished.values["gradient_clipping"] == 1.0
    assert finished.values["optimizer"]["params"]["fused"] is True  # torch's fused AdamW, on every device


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"train_micro_batch_size_per_gpu": 0}, "'train_micro_batch_size_per_gpu' must be a positive integer"),
        ({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": "2"}, "'gradient_accumulation_steps'"),
        ({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 7}}, "zero_optimization.stage"),
        ({"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": -1}}}, "lr"),
    ],
)
def test_impossible_values(cfg, message):
    with pytest.raises(UserError, match=message):
        settings(cfg, "x.json", world_size=1, has_gpu=True)


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
    settings(load_ds_config(p), p, world_size=2, has_gpu=False)
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
            settings(dict(valid, **dict([section])), p, world_size=1, has_gpu=False)
        assert "\n" not in str(err.value)


def finished(cfg, **kwargs):
    return settings(cfg, "c.json", world_size=1, has_gpu=False, **kwargs).finish(10, 0.1).as_dict()


def test_monitors_write_into_the_output_dir_unless_named(tmp_path):
    base = {"train_micro_batch_size_per_gpu": 1}
    cfg = finished(dict(base, csv_monitor={"enabled": True}, tensorboard={"enabled": False}), output_dir=tmp_path)
    assert cfg["csv_monitor"]["output_path"] == str(tmp_path / "monitor") and "output_path" not in cfg["tensorboard"]
    named = dict(base, csv_monitor={"enabled": True, "output_path": "/elsewhere"})
    assert finished(named, output_dir=tmp_path)["csv_monitor"]["output_path"] == "/elsewhere"


def test_the_finished_config_cannot_be_edited():
    """What the engine gets is a finished value: a caller's copy changes nothing in it."""
    done = settings({"train_micro_batch_size_per_gpu": 4}, "c.json", world_size=2, has_gpu=False).finish(10, 0.1)
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

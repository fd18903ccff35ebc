"""DeepSpeed configs: shipped ones are valid; bad ones fail before any work with the key named."""

import json
from pathlib import Path

import pytest

from bert_squad.dsconfig import SHIPPED_DIR as CONFIG_DIR
from bert_squad.dsconfig import fill_schedule
from bert_squad.dsconfig import load as load_ds_config
from bert_squad.dsconfig import resolve as resolve_ds_config
from bert_squad.errors import UserError

SHIPPED = sorted(CONFIG_DIR.glob("ds_*.json"))


def test_all_four_configs_ship():
    assert {p.name for p in SHIPPED} == {"ds_fp32.json", "ds_fp16.json", "ds_bf16.json", "ds_zero2.json"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_are_valid_deepspeed_configs(path):
    cfg = resolve_ds_config(load_ds_config(path), path, world_size=2, has_gpu=True)
    fill_schedule(cfg, total_steps=100, warmup_ratio=0.1)
    assert cfg["optimizer"]["type"] == "AdamW"
    params = cfg["scheduler"]["params"]
    assert params["total_num_steps"] == 100 and params["warmup_num_steps"] == 10
    assert params["warmup_max_lr"] == cfg["optimizer"]["params"]["lr"]
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 2


def test_batch_arithmetic_mismatch_names_the_keys(tmp_path):
    cfg = {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1}
    with pytest.raises(UserError, match="train_batch_size 48 != train_micro_batch_size_per_gpu 16"):
        resolve_ds_config(cfg, "x.json", world_size=2, has_gpu=False)
    assert resolve_ds_config(cfg, "x.json", world_size=3, has_gpu=False)["train_batch_size"] == 48


def test_global_batch_only_must_divide():
    with pytest.raises(UserError, match="not divisible"):
        resolve_ds_config({"train_batch_size": 30, "gradient_accumulation_steps": 4}, "x.json",
                          world_size=2, has_gpu=False)
    cfg = resolve_ds_config({"train_batch_size": 32, "gradient_accumulation_steps": 4}, "x.json",
                            world_size=2, has_gpu=False)
    assert cfg["train_micro_batch_size_per_gpu"] == 4


def test_fp16_without_gpu_is_refused():
    cfg = load_ds_config(CONFIG_DIR / "ds_fp16.json")
    with pytest.raises(UserError, match="fp16.enabled needs a GPU"):
        resolve_ds_config(cfg, "ds_fp16.json", world_size=1, has_gpu=False)


@pytest.mark.parametrize("cfg, message", [
    ({"train_micro_batch_size_per_gpu": 0}, "'train_micro_batch_size_per_gpu' must be a positive integer"),
    ({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": "2"}, "'gradient_accumulation_steps'"),
    ({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 7}}, "zero_optimization.stage"),
    ({"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": -1}}}, "lr"),
])
def test_impossible_values(cfg, message):
    with pytest.raises(UserError, match=message):
        resolve_ds_config(cfg, "x.json", world_size=1, has_gpu=True)


def test_unknown_key_and_malformed_file(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "fp61": {"enabled": True}}))
    with pytest.raises(UserError, match=f"{p}: unknown key 'fp61'"):
        load_ds_config(p)
    p.write_text('{"train_micro_batch_size_per_gpu": 8,')
    with pytest.raises(UserError, match="malformed JSON at line 1"):
        load_ds_config(p)
    with pytest.raises(UserError, match="no such DeepSpeed config"):
        load_ds_config(Path(tmp_path / "missing.json"))

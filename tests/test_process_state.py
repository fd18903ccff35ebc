"""Commands run as library calls leave the process as they found it: the float32 matmul precision that --tf32
sets, and the tokenizers' thread switch that building features with worker processes sets."""

import os

import pytest
import torch
from helpers import inference_args, train_args

from bert_squad.cli import main

pytestmark = pytest.mark.slow  # it trains


def _state():
    return torch.get_float32_matmul_precision(), os.environ.get("TOKENIZERS_PARALLELISM")


def test_two_commands_in_one_process_leave_its_state_untouched(
    tiny_model, sample_train, sample_dev, tmp_path, monkeypatch
):
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)  # the user chose nothing: the commands may set it
    assert _state() == ("highest", None)  # torch's default, as a user's script starts
    out = tmp_path / "out"
    train = train_args(tiny_model, sample_train, out, "--max-steps", 2, "--no-eval", "--tf32", cache=tmp_path / "c")
    assert main([*train, "--preprocessing-workers", "2"]) == 0
    assert _state() == ("highest", None)
    evaluate = inference_args("evaluate", out, sample_dev, tmp_path / "eval", cache=tmp_path / "c")
    assert main([*evaluate, "--preprocessing-workers", "2"]) == 0
    assert _state() == ("highest", None)

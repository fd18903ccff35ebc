"""A model directory that is incomplete or corrupt: every command that loads a model says in one line
which directory and what is wrong with it (exit 2, nothing written), never a library's traceback."""

import json
import shutil

import pytest
from helpers import train_args

from bert_squad import cli


def _remove(model_dir, *patterns):
    for pattern in patterns:
        for f in model_dir.glob(pattern):
            f.unlink()


BROKEN = {
    # name: (how to break a copy of the tiny model, what the error line says)
    "no tokenizer files": (lambda d: _remove(d, "*token*", "vocab*"), "cannot load a tokenizer"),
    "truncated weights": (
        lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:5000]),
        "cannot load model weights",
    ),
    "weights not safetensors": (
        lambda d: (d / "model.safetensors").write_bytes(b"PK\x03\x04 this is a zip" * 50),
        "cannot load model weights",
    ),
    "garbage pytorch weights": (
        lambda d: (_remove(d, "model.safetensors"), (d / "pytorch_model.bin").write_bytes(b"\x80\x04garbage" * 100)),
        "cannot load model weights",
    ),
    "no weights": (lambda d: _remove(d, "model.safetensors"), "cannot load model weights"),
    "malformed config": (lambda d: (d / "config.json").write_text('{"model_type": "bert",'), "config.json"),
    "corrupt tokenizer.json": (
        lambda d: (d / "tokenizer.json").write_text('{"version": "1.0", "model": 3}'),
        "cannot load a tokenizer",
    ),
    "a family newer than transformers": (
        lambda d: (d / "config.json").write_text(
            json.dumps(dict(json.loads((d / "config.json").read_text()), model_type="bert-of-2031"))
        ),
        "model type 'bert-of-2031' is unknown to transformers",
    ),
    "another architecture": (
        lambda d: (d / "config.json").write_text(
            json.dumps({"model_type": "vit", "architectures": ["ViTForQuestionAnswering"], "hidden_size": 32})
        ),
        "cannot load model weights",
    ),
}

COMMANDS = {
    "train": lambda d, t: (
        cli.main,
        train_args(d, t.train, t.out, "--max-steps", 1, cache=t.cache, windows=[]),
    ),
    "evaluate": lambda d, t: (
        cli.main,
        [
            "evaluate",
            "--model-dir",
            str(d),
            "--eval-file",
            str(t.dev),
            "--output-dir",
            str(t.out),
            "--cache-dir",
            str(t.cache),
        ],
    ),
    "bert-squad-test": lambda d, t: (
        cli.bert_squad_test,
        ["--model-file", str(d), "--eval-file", str(t.dev), "--num-test-samples", "1"],
    ),
    "answer": lambda d, t: (
        cli.main,
        ["answer", "--model-dir", str(d), "--question", "Who?", "--context", "Ada wrote it."],
    ),
}


class Paths:
    def __init__(self, tmp_path, train, dev):
        self.train, self.dev, self.out, self.cache = train, dev, tmp_path / "out", tmp_path / "cache"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("broken", BROKEN)
def test_a_broken_model_dir_is_one_line(
    broken, command, tiny_model, sample_train, sample_dev, tmp_path, capsys, recwarn
):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    breaks, message = BROKEN[broken]
    breaks(model)
    main, argv = COMMANDS[command](model, Paths(tmp_path, sample_train, sample_dev))
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and str(model) in err[0] and message in err[0], err
    assert not [str(w.message) for w in recwarn]  # pytest holds warnings back that a user's stderr would show
    assert not (tmp_path / "out").exists()

"""A model directory that is incomplete or corrupt: every command that loads a model says in one line
which directory and what is wrong with it (exit 2, nothing written), never a library's traceback."""

import json
import shutil

import pytest
from helpers import put_in_hub_cache, train_args

from bert_squad import cache, cli, config, download
from bert_squad.errors import UserError


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


# A model named by a path that is not there, as given: what the one error line says (a hub name gets the advice to
# download it). Here, in the working directory: runs/ and a file, train.json.
MISSING = {
    "runs/typo": "runs/typo: no such model directory (runs/ is a folder here; nor is a hub model of that name",
    "./typo": "./typo: no such model directory",
    "../typo": "../typo: no such model directory",
    "/nowhere/model": "/nowhere/model: no such model directory",
    "~/no-such-model": "~/no-such-model: no such model directory",
    "runs/base/model": "runs/base/model: no such model directory",  # two slashes: no hub name
    "train.json": "train.json: not a model directory (a file)",
    "org/typo": "model 'org/typo' is not in the cache",  # org/ is no folder here: a hub name
    "typo-base-uncased": "model 'typo-base-uncased' is not in the cache",
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", MISSING)
def test_a_missing_model_is_named_missing_not_sent_to_the_hub(
    name, command, sample_train, sample_dev, tmp_path, monkeypatch, capsys
):
    (tmp_path / "runs").mkdir()
    (tmp_path / "train.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    main, argv = COMMANDS[command](name, Paths(tmp_path, sample_train, sample_dev))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and MISSING[name] in err[0], err
    assert ("--download-only" in err[0]) == MISSING[name].startswith("model '"), err
    assert not (tmp_path / "out").exists()


def test_a_hub_name_in_the_cache_is_found_where_a_folder_shares_its_org(tiny_model, tmp_path, monkeypatch):
    """org/name is a hub model where the cache holds it, even with a folder org/ here."""
    put_in_hub_cache(cache.hub_dir(tmp_path / "cache"), "org/tiny", tiny_model)
    (tmp_path / "org").mkdir()
    monkeypatch.chdir(tmp_path)
    found = cache.find_model("org/tiny", tmp_path / "cache")
    assert found.parent.parent.name == "models--org--tiny" and (found / "config.json").is_file()
    with pytest.raises(UserError, match=r"^org/other: no such model directory \(org/ is a folder here"):
        cache.find_model("org/other", tmp_path / "cache")


def test_download_takes_a_local_model_as_it_is(tiny_model, sample_train, tmp_path, capsys):
    """`download` of a local model directory fetches no model (the tests run offline: asking the hub would fail),
    and a missing one is named missing, not looked up on the hub."""
    argv = ["--train-file", str(sample_train), "--cache-dir", str(tmp_path / "cache")]
    assert download.download(config.parse_run_config(["--model", str(tiny_model), *argv])) == 0
    assert capsys.readouterr().out == f"model -> {tiny_model}\n"
    with pytest.raises(UserError, match=r"^\./typo: no such model directory$"):
        download.download(config.parse_run_config(["--model", "./typo", *argv]))

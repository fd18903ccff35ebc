"""`--download-only` against a Hugging Face hub that this test starts on 127.0.0.1 (tests/hub_server.py, reached
through HF_ENDPOINT), serving the tiny models: the login-node step fills the cache, and a compute node then
finds the model there by its hub name, offline.

Only the model is fetched: the runs give --train-file (a local SQuAD file), as a site without the hub's
dataset server does; serving a hub dataset would mean answering the datasets library's own API too.
"""

import re
from pathlib import Path

import pytest
from helpers import run_bert_squad, train_args, window_args
from hub_server import hub

pytestmark = pytest.mark.slow

# What the shipped images set (containers/Dockerfile, bert-squad.def): `download` goes online for itself anyway.
IMAGE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def download_only(model, cache, train_file, url):
    """`--download-only` of hub model `model` (and nothing else: the training file is named) from the hub at `url`."""
    args = ["--download-only", "--model", model, "--cache-dir", cache, "--train-file", train_file]
    return run_bert_squad(*args, env={**IMAGE_ENV, "HF_ENDPOINT": url}, timeout=300)


def test_download_only_fills_the_cache_that_offline_runs_read(tiny_model, sample_train, tmp_path):
    cache = tmp_path / "cache"
    with hub({"org/tiny-bert": tiny_model}) as (url, requests):
        r = download_only("org/tiny-bert", cache, sample_train, url)
    assert r.returncode == 0, r.stderr[-3000:]
    snapshot = Path(re.search(r"^model -> (.+)$", r.stdout, re.M).group(1))
    assert snapshot.parent == cache / "hub" / "models--org--tiny-bert" / "snapshots", snapshot
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(p.name for p in tiny_model.iterdir())
    assert all((snapshot / p.name).read_bytes() == p.read_bytes() for p in tiny_model.iterdir())
    assert "dataset ->" not in r.stdout  # --train-file: nothing else is fetched
    assert any(line.startswith("GET /org/tiny-bert/resolve/") for line in requests), requests
    # A compute node: offline (conftest's default), the model by its hub name from the cache, and it trains.
    r = run_bert_squad("check-cache", "--model", "org/tiny-bert", "--train-file", sample_train, "--cache-dir", cache)
    assert r.returncode == 0 and r.stdout.splitlines()[0] == f"model: {snapshot}", r.stderr
    steps = ["--no-eval", "--max-steps", 1]
    r = run_bert_squad(
        *train_args(
            "org/tiny-bert", sample_train, tmp_path / "out", *steps, cache=cache, windows=window_args(96, 16, None)
        )
    )
    assert r.returncode == 0, r.stderr[-3000:]


def test_a_model_the_hub_does_not_have_is_one_line(tiny_model, tmp_path):
    """The hub answers, without the model: a wrong name, not a missing network (as it used to say)."""
    cache = tmp_path / "cache"
    with hub({"org/tiny-bert": tiny_model}) as (url, _):
        r = download_only("org/tiny-bret", cache, "x.json", url)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"bert-squad: error: model 'org/tiny-bret' is not on the hub {url} (or not visible without a token): "
        f"check its name"
    ], r.stderr
    assert not cache.exists()  # a failed download leaves no empty cache behind

"""Shared fixtures: the shipped sample data and a tiny BERT built offline from it."""

import os
import sys
from pathlib import Path

import pytest

from bert_squad.sample import sample_path

ROOT = Path(__file__).resolve().parents[1]
SHARED_SQUAD = ROOT.parent / "shared" / "data" / "squad"
PYTHON = sys.executable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def shared_squad(name):
    """A file of ../shared/data/squad, or skip: CI and users may not have it."""
    path = SHARED_SQUAD / name
    if not path.exists():
        pytest.skip(f"{path} is absent (real SQuAD data lives in ../shared beside the clone)")
    return path


@pytest.fixture(scope="session")
def sample_train():
    return sample_path("train-v1.1.json")


@pytest.fixture(scope="session")
def sample_dev():
    return sample_path("dev-v1.1.json")


@pytest.fixture(scope="session")
def sample_dev_v2():
    return sample_path("dev-v2.0.json")


def build_tiny_model(out_dir, hidden=32, layers=2):
    """A randomly initialised 2-layer BERT whose WordPiece vocabulary is trained on the sample.

    Tests need a model that loads offline and trains in seconds; a real checkpoint would be too slow
    and may not be installed.
    """
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertForQuestionAnswering, BertTokenizerFast

    texts = []
    for name in ("train-v1.1.json", "dev-v1.1.json", "dev-v2.0.json"):
        for article in json.loads(sample_path(name).read_text())["data"]:
            for para in article["paragraphs"]:
                texts.append(para["context"])
                texts.extend(qa["question"] for qa in para["qas"])
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=1000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    (out_dir / "vocab.txt").write_text("".join(f"{w}\n" for w, _ in vocab))
    BertTokenizerFast(vocab_file=str(out_dir / "vocab.txt"), do_lower_case=True).save_pretrained(out_dir)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=hidden * 2, max_position_embeddings=512)
    import torch

    torch.manual_seed(0)
    BertForQuestionAnswering(config).save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-bert"))


def run_bert_squad(*args, launcher=(), env=None, timeout=600, cwd=ROOT):
    """Run the real CLI in a subprocess (optionally under a launcher such as mpirun)."""
    import subprocess

    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    cmd = [*launcher, PYTHON, "-m", "bert_squad", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd)


MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def require_mpirun():
    import shutil

    if not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed (make test installs Open MPI from Debian when run as root)")


# A real single-node Slurm (session fixture `slurm_cluster`), shared by the launch and sweep tests, and a
# real multi-node one of network namespaces on this machine (`multinode_cluster`, tests/test_multinode.py).
from slurm_cluster import multinode_cluster, slurm_cluster  # noqa: E402,F401

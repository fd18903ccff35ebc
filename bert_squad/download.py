"""The login-node step and its compute-node counterpart, on a training run's own arguments.

`bert-squad download` (or `python -m bert_squad --download-only ...`) fetches the run's model, tokenizer and
dataset into the cache: the only command that uses the network. `bert-squad check-cache` runs in a job,
before any rank starts, and says whether they are there. `cache` defines where.
"""

import shutil
from pathlib import Path

from bert_squad import cache, config, dsconfig
from bert_squad.config import RunConfig
from bert_squad.errors import UserError, first_line
from bert_squad.files import can_write, read_json, remove_empty_dirs, scratch

# Files a model needs; a hub repo's other formats (TF, Flax, ONNX, ...) stay on the hub.
HUB_PATTERNS = ["*.json", "*.txt", "*.model", "*.safetensors"]


def download_model(name: str, cache_dir: str) -> Path:
    """Model and tokenizer files into the hub cache under `cache_dir`; their snapshot directory."""
    from huggingface_hub import snapshot_download  # heavy: check-cache, in the same module, needs none of it

    hub = str(cache.hub_dir(cache_dir))
    path = Path(snapshot_download(name, cache_dir=hub, allow_patterns=HUB_PATTERNS))
    if not any(path.glob("*.safetensors")):  # an older repo with PyTorch pickles only
        path = Path(snapshot_download(name, cache_dir=hub, allow_patterns=[*HUB_PATTERNS, "pytorch_model*.bin"]))
    return path


def download_dataset(name: str, cache_dir: str) -> Path:
    """A hub dataset saved where `cache.find_dataset` looks, replaced whole or not at all."""
    import datasets  # heavy: only the login-node step needs it here

    target = cache.dataset_dir(cache_dir, name)
    ds = datasets.load_dataset(name, cache_dir=str(cache.datasets_download_dir(cache_dir)))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = scratch(target.parent, target.name, directory=True)  # jobs share the cache
    ds.save_to_disk(str(tmp))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def check_hub(model: str) -> None:
    """One clear line when the hub cannot be reached or has no such model."""
    import huggingface_hub  # heavy: check-cache, in the same module, needs none of it
    from huggingface_hub import constants
    from huggingface_hub.utils import RepositoryNotFoundError

    try:
        huggingface_hub.model_info(model, timeout=10)
    except RepositoryNotFoundError:  # reached, but no such model (a typo, or private)
        raise UserError(
            f"model '{model}' is not on the hub {constants.ENDPOINT} (or not visible without a token): check its name"
        ) from None
    except Exception as err:  # any other failure here means: no usable hub from this machine
        raise UserError(
            f"cannot reach the Hugging Face hub for model '{model}' ({first_line(err)}); "
            f"--download-only needs internet (a login node), compute nodes then run offline"
        ) from None


def download(cfg: RunConfig) -> int:
    """Model, tokenizer and (without --train-file) dataset of the run `cfg` into its cache; a local model
    directory is only checked, as a run checks it."""
    data = cfg.data
    new_cache = not Path(data.cache_dir).exists()
    can_write(data.cache_dir, "--cache-dir ")
    try:
        if cache.is_local(data.model):
            print(f"model -> {cache.find_model(data.model, data.cache_dir)}")
        else:
            check_hub(data.model)
            print(f"model -> {download_model(data.model, data.cache_dir)}")
        if not data.train_file:
            print(f"dataset -> {download_dataset(data.dataset, data.cache_dir)}")
    except BaseException:
        if new_cache:  # a failed download leaves no empty cache behind (what it fetched before it failed stays)
            remove_empty_dirs(data.cache_dir)
        raise
    return 0


DOWNLOAD = (
    "bert-squad download",
    "Fetch a training run's model, tokenizer and (without --train-file) dataset into its cache: the one command "
    "that uses the network (a login node). Takes the training options (also as `bert-squad --download-only ...`).",
)
CHECK_CACHE = (
    "bert-squad check-cache",
    "Say whether a training run's model and dataset are in its cache and its output dir can be written, offline "
    "(what a job runs before any rank starts). Takes the training options.",
)


def parse_download(argv: list[str]) -> RunConfig:
    return config.parse_run_config(argv, DOWNLOAD)


def parse_check(argv: list[str]) -> RunConfig:
    if "--download-only" in argv:
        raise UserError("--download-only needs internet: run it on a login node, not in a job")
    return config.parse_run_config(argv, CHECK_CACHE)


def check_cache(cfg: RunConfig) -> int:
    """Are the run's model and dataset in the cache, every file it names there and readable (a train or eval
    file, a DeepSpeed config: as JSON), and can its output dir be written, or made, and take this run? The job
    script asks once, inside the image, before it starts a container per rank. It creates nothing."""
    data = cfg.data
    print(f"model: {cache.find_model(data.model, data.cache_dir)}")
    if not data.train_file:
        print(f"dataset: {cache.find_dataset(data.dataset, data.cache_dir)}")
    for what, path in (("train file", data.train_file), ("eval file", data.eval_file)):
        if path:
            read_json(path, what="a SQuAD JSON file")
            print(f"{what}: {path}")
    if cfg.train.named_config:  # else the shipped config of the device's precision, chosen where the run starts
        ds_config = dsconfig.locate(cfg.train.named_config)
        dsconfig.read_object(ds_config)  # the run's own first check of it
        print(f"deepspeed config: {ds_config}")
    can_write(data.output_dir, "--output-dir ")
    cfg.faults.check_output_dir(data.output_dir)
    return 0

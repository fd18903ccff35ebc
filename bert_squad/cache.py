"""The cache layout, in one place: where `--download-only` puts models and datasets and where runs
(and the job script's fail-fast check) look for them. Compute nodes read it and never the network.

    <cache>/hub/                    models and tokenizers: a standard Hugging Face hub cache
    <cache>/datasets/<name>/        a hub dataset saved with `datasets.save_to_disk`
    <cache>/features/               tokenized features, keyed by data, tokenizer and window options
    <cache>/hf-datasets/            the datasets library's download cache (login node only)

A model named by its hub name is looked up in <cache>/hub, then in the user's own Hugging Face cache
(`HF_HUB_CACHE`, or `HF_HOME`/hub), so a model downloaded there before is not fetched twice.
"""

from __future__ import annotations

import os
from pathlib import Path

from bert_squad.errors import UserError
from bert_squad.files import directory


class NotCached(UserError):
    """A model or dataset the run needs is not in the cache: what a compute node cannot fetch, and a plan made
    before the download (`bert-squad config`) notes instead of refusing."""


def default_cache_dir() -> str:
    """$BERT_SQUAD_CACHE, or ./cache; a variable that names a file (or is empty) is refused here, where it is read."""
    if os.environ.get("BERT_SQUAD_CACHE") == "":
        raise UserError("BERT_SQUAD_CACHE is set but empty: unset it (./cache) or name the cache directory")
    return str(directory(os.environ.get("BERT_SQUAD_CACHE", "./cache"), "BERT_SQUAD_CACHE="))


def resolve_cache_dir(given: str | None) -> str:
    """`--cache-dir` as given, or the default; either one checked once, before any work."""
    if not given:
        return default_cache_dir()
    directory(given, "--cache-dir ")
    return given


def hub_dir(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / "hub"


def dataset_dir(cache_dir: str | Path, name: str) -> Path:
    return Path(cache_dir) / "datasets" / name


def features_dir(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / "features"


def datasets_download_dir(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / "hf-datasets"


def download_hint(cache_dir: str | Path, model: str | None = None, dataset: str | None = None) -> str:
    what = (f" --model {model}" if model else "") + (f" --dataset {dataset}" if dataset else "")
    return f"run `python -m bert_squad --download-only{what} --cache-dir {cache_dir}` on a machine with internet"


def _cached_snapshot(name: str, hub_cache: Path | None) -> Path | None:
    """The snapshot directory of hub model `name` in `hub_cache` (None: the library's default cache)."""
    from huggingface_hub import snapshot_download  # heavy: not for the commands that load no model

    try:
        path = Path(snapshot_download(name, cache_dir=hub_cache and str(hub_cache), local_files_only=True))
    except Exception:  # not cached there (or not a valid hub name): the caller says what to do
        return None
    return path if (path / "config.json").is_file() else None


def is_hub_name(name: str) -> bool:
    """Whether `name` can name a hub model (`bert-base-uncased`, `org/name`), by huggingface_hub's own rule."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # heavy: only where a model is looked up

    if name.startswith(("/", ".", "~")):  # ./, ../, /, ~: a path, whatever the rule says of the rest
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:  # two slashes, a space, ".." ...: only a path is spelled so
        return False
    return True


def is_local(name_or_path: str) -> bool:
    """Whether a model is named by a path here: one that exists, or a name only a path can have."""
    return Path(os.path.expanduser(name_or_path)).exists() or not is_hub_name(name_or_path)


def find_model(name_or_path: str, cache_dir: str | Path) -> Path:
    """A directory holding config.json: the path itself, or the cached snapshot of a hub name. A missing path
    is named as missing, with no advice to download it: a name only a path can have, or an `org/name` that
    the caches do not hold and whose `org` is a folder here."""
    path = Path(os.path.expanduser(name_or_path))
    if is_local(name_or_path):
        if not path.is_dir():
            raise UserError(
                f"{name_or_path}: {'not a model directory (a file)' if path.exists() else 'no such model directory'}"
            )
        if not (path / "config.json").is_file():
            raise UserError(f"{path}: not a model directory (no config.json)")
        return path
    found = _cached_snapshot(name_or_path, hub_dir(cache_dir)) or _cached_snapshot(name_or_path, None)
    if found is None and path.parent != Path(".") and path.parent.is_dir():
        raise UserError(
            f"{name_or_path}: no such model directory ({path.parent}/ is a folder here; nor is a hub model of "
            f"that name in the cache)"
        )
    if found is None:
        raise NotCached(
            f"model '{name_or_path}' is not in the cache {hub_dir(cache_dir)} nor in the Hugging Face "
            f"cache: {download_hint(cache_dir, model=name_or_path)}, or give a local model directory"
        )
    return found


def find_dataset(name: str, cache_dir: str | Path) -> Path:
    path = dataset_dir(cache_dir, name)
    if not (path / "dataset_dict.json").exists():
        raise NotCached(
            f"dataset '{name}' is not in the cache {path}: "
            f"{download_hint(cache_dir, dataset=name)}, or give --train-file/--eval-file"
        )
    return path

"""A command's inputs that need no library, checked before any is loaded: the paths it reads and fills, the
model's directory, the DeepSpeed config's file and JSON (names and numbers are the options' own checks,
`config`). torch, DeepSpeed, transformers and datasets take seconds to import, on every rank; a missing file is
one line without them. What needs them (a config's keys as DeepSpeed reads them, the data files' contents, the
model) is checked where the command loads it, as before.
"""

from collections.abc import Callable
from pathlib import Path

from bert_squad import cache, dsconfig
from bert_squad.config import RunConfig
from bert_squad.files import directory, readable


def training(cfg: RunConfig, planning: bool = False) -> None:
    """A training run's: its output dir, model, DeepSpeed config and data files (`data.load_examples` reads a hub
    data set's splits where no --train-file is given); `planning` (`bert-squad config`): a model or data set not
    downloaded yet is the plan's to report, not an error."""
    directory(cfg.data.output_dir, "--output-dir ")
    _cached(lambda: cache.find_model(cfg.data.model, cfg.data.cache_dir), planning)
    if cfg.train.named_config:
        dsconfig.read_object(dsconfig.locate(cfg.train.named_config))
    for path in (cfg.data.train_file, cfg.data.eval_file):
        if path:
            readable(path, "a SQuAD JSON file")
    if not cfg.data.train_file:
        _cached(lambda: cache.find_dataset(cfg.data.dataset, cfg.data.cache_dir), planning)


def _cached(find: Callable[[], Path], planning: bool) -> None:
    """`find`'s lookup in the cache; what is not downloaded yet passes in a plan."""
    try:
        find()
    except cache.NotCached:
        if not planning:
            raise


def planning(cfg: RunConfig) -> None:
    """`bert-squad config`'s: a training run's, planned."""
    training(cfg, planning=True)

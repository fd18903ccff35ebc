"""Process-wide set-up, in one place: what running a bert-squad command changes about the whole process.

The command-line entry (`cli`) calls `prepare` once per process, after the command's arguments parsed (so
`--help` and argument errors cost nothing) and before the command imports the Hugging Face libraries or
DeepSpeed, which read some of these settings at import. Library code changes nothing process-wide: a
program that uses `bert_squad.answer.Answerer` keeps its own logging, warnings and network settings.
Scoped changes stay with their
scope: `distributed.process_group` exports the rank variables DeepSpeed reads while the group lives,
`preemption.StopRequest` restores the signal handlers it replaced.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings

from bert_squad.errors import UserError

# 1 for every command but `download`, 0 for it whatever the environment says (an image sets them to 1):
# compute nodes are offline, and the libraries must not try; fetching is the one command that goes online.
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
# DeepSpeed warnings every run printed that tell the user nothing.
DEEPSPEED_NOISE = (
    "scheduler before it has started",  # its warmup schedulers ask themselves for a rate while being built
    "Setting accelerator to CPU",  # at import, on stdout (into job scripts rendered with --dry-run > file)
    "MPU is not provided",  # every load of a universal checkpoint: there is no tensor parallelism here
)


def _not_noise(record: logging.LogRecord) -> bool:
    return not any(text in record.getMessage() for text in DEEPSPEED_NOISE)


def prepare(*, offline: bool = True, deepspeed: bool = False, debug: bool = False) -> None:
    """Set up this process for a command: network (none when `offline`), library verbosity and progress
    bars, warning filters, and DeepSpeed's state when the command starts `deepspeed`."""
    _one_write_a_line()
    os.environ.update(dict.fromkeys(OFFLINE_VARS, "1" if offline else "0"))
    _network_for_loaded_libraries(offline)
    if not offline:  # a login node's hub that does not answer is one line after seconds, not a hang
        os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
        os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "30")
    level = "info" if debug else "warning"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", level)
    os.environ.setdefault("DATASETS_VERBOSITY", level)
    # oneDNN (torch's bf16 matrix products on a CPU) keeps every kernel it built, with its buffers, for each shape
    # it met: 1,024 by default. Padded to each batch's longest, a run meets a shape almost every step; 16 kernels
    # (about one step's) held 0.19 GiB less at no measured cost in time (docs/measurements/2026-12-cpu-defaults.md).
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
    # Batch logs are no terminals: no progress bars (transformers 5 draws one while loading weights).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    _quiet_loaded_libraries(level)
    warnings.filterwarnings("ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor).* is deprecated")
    logging.getLogger("DeepSpeed").addFilter(_not_noise)  # the logger DeepSpeed creates at import, filter kept
    if deepspeed:
        prepare_deepspeed(debug)


def _one_write_a_line() -> None:
    """Every line the process prints reaches its stdout or stderr in one write. The ranks of a job share one
    log (the launcher's output, a Slurm file), and an unbuffered stream (PYTHONUNBUFFERED=1, which the job
    scripts set for live logs) writes a print's text and its newline apart: four ranks printing at once left
    hundreds of their 12,000 lines run into each other. A line-buffered stream writes each line whole. Only
    the interpreter's own streams: a program that replaced them (pytest, a notebook) keeps its own."""
    for own, current in ((sys.__stdout__, sys.stdout), (sys.__stderr__, sys.stderr)):
        if current is own and isinstance(own, io.TextIOWrapper):
            own.reconfigure(line_buffering=True, write_through=False)


def _network_for_loaded_libraries(offline: bool) -> None:
    """The offline switch where a program imported the Hugging Face libraries before: they read it at import."""
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = offline
    if "datasets" in sys.modules:
        datasets_config = sys.modules["datasets"].config
        datasets_config.HF_HUB_OFFLINE = datasets_config.HF_DATASETS_OFFLINE = offline


def _quiet_loaded_libraries(level: str) -> None:
    """The same settings through the libraries' own calls where a program imported them before (they read
    the environment only at import)."""
    if "transformers" in sys.modules:
        transformers = sys.modules["transformers"]
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity(getattr(logging, level.upper()))
    if "datasets" in sys.modules:
        datasets = sys.modules["datasets"]
        datasets.disable_progress_bars()
        datasets.utils.logging.set_verbosity(getattr(logging, level.upper()))


# The table in deepspeed.ops of the ops DeepSpeed may build on this machine, by name (not part of its documented
# interface, so read only where present).
SHM_OPS_TABLE = "__compatible_ops__"


def prepare_deepspeed(debug: bool) -> None:
    """DeepSpeed imported (it picks the accelerator) and set up for a command that starts it; the command line
    does this after the command's inputs are checked (`cli`), `prepare(deepspeed=True)` at once."""
    try:  # its import picks the accelerator, and refuses a DS_ACCELERATOR it does not know
        import deepspeed  # heavy: only the commands that start DeepSpeed import it
    except ValueError as err:
        raise UserError(
            f"DS_ACCELERATOR={os.environ.get('DS_ACCELERATOR')}: not an accelerator DeepSpeed knows "
            f"({str(err).split('. Value')[0]})"
        ) from None
    from deepspeed.accelerator import get_accelerator

    deepspeed.utils.logger.setLevel(logging.INFO if debug else logging.WARNING)
    if get_accelerator().device_name() == "cpu":
        # DeepSpeed JIT-builds a shared-memory all-reduce op when its process group starts that only its
        # inference all-reduce uses. The build costs a minute on a fresh machine, and a build killed half-way
        # leaves a lock file that makes every later run on the machine wait forever. Training needs none of it.
        # DeepSpeed offers no switch for it but its table of the ops it may build: a release without that table
        # costs only this saving.
        compatible = getattr(deepspeed.ops, SHM_OPS_TABLE, None)
        if isinstance(compatible, dict):
            compatible["deepspeed_shm_comm"] = False

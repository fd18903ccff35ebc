"""The command table: each command's words, its parser and its action ("module:function" each), and the
process set-up it needs. Kept apart from cli.py, which runs them, so that help texts can list them."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A command: its parser and its action ("module:function" each), and the process set-up it needs."""

    parse: str  # argv -> options; argparse exits here for --help
    run: str  # options -> exit code
    deepspeed: bool = False  # starts DeepSpeed (its process group or engine)
    offline: bool = True  # the Hugging Face libraries never try the network
    check: str = ""  # options -> None: the inputs that need no library, checked before DeepSpeed loads


# Command words -> Command. The longest match of the first words wins; anything else is training.
COMMANDS = {
    "train": Command(
        "bert_squad.config:parse_run_config", "bert_squad.train:main", True, check="bert_squad.preflight:training"
    ),
    "config": Command(
        "bert_squad.config:parse_print_config",
        "bert_squad.train:print_config",
        True,
        check="bert_squad.preflight:planning",
    ),
    "download": Command("bert_squad.download:parse_download", "bert_squad.download:download", offline=False),
    "check-cache": Command("bert_squad.download:parse_check", "bert_squad.download:check_cache"),
    # evaluate and predict set DeepSpeed up where ranks meet through it (evaluate.on_every_rank); one process needs none
    "evaluate": Command("bert_squad.evaluate:parse", "bert_squad.evaluate:run", check="bert_squad.evaluate:check"),
    "predict": Command("bert_squad.predict:parse", "bert_squad.predict:run", check="bert_squad.predict:check"),
    "export": Command("bert_squad.export:parse", "bert_squad.export:run"),
    "answer": Command("bert_squad.answer:parse", "bert_squad.answer:run"),
    "test": Command("bert_squad.inspect_answers:parse", "bert_squad.inspect_answers:run"),
    "score": Command("bert_squad.score:parse", "bert_squad.score:run"),
    "launch": Command("bert_squad.cluster.launch:parse", "bert_squad.cluster.launch:run"),
    "sweep": Command("bert_squad.cluster.sweep:parse", "bert_squad.cluster.sweep:submit"),
    "sweep run": Command("bert_squad.cluster.sweep:parse_task", "bert_squad.cluster.sweep:run_task", deepspeed=True),
    "summarize": Command("bert_squad.cluster.summarize:parse", "bert_squad.cluster.summarize:run"),
}
# Training flags that run another command on the same arguments, as the docs and job scripts spell them.
ALIASES = {"--download-only": "download", "--print-config": "config"}


def listed() -> list[str]:
    """The command words a user types (not the default, training, nor the job array's internal `sweep run`)."""
    return [name for name in COMMANDS if name not in ("train", "sweep run")]

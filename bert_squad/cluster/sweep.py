"""`bert-squad sweep`: seeds x hyperparameter grid as one Slurm job array, one run directory each.

`sweep.json` in the sweep directory is the manifest: array task i trains combination i (through
`bert-squad sweep run`, inside the job: `run_task`) into `<sweep dir>/<name>/` with `--seed` and `--resume auto`,
then writes `exit_code` there. Submitting again leaves out the runs that have final metrics, and the
others resume from their checkpoints; it is refused while the last submitted array still has tasks in
the queue. `bert-squad summarize` reads the same manifest.
"""

import difflib
import itertools
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional

from bert_squad import config, dsconfig, outputs
from bert_squad.cluster import launch
from bert_squad.cluster.summarize import EXIT_CODE_FILE, MANIFEST, load_manifest
from bert_squad.errors import UserError, exit_code
from bert_squad.files import directory, write_json_atomic, write_text_atomic

JOB_FILE = "job_id"  # the array job last submitted, so a second submission cannot overlap it
# The sweep sets these per run (config.option's sweep="per-run"): seed, output dir, resume; OWN_FLAGS in any spelling.
OWN_OPTIONS = [o for o in config.training_options().values() if o.sweep == "per-run"]
OWN_FLAGS = tuple(flag for o in OWN_OPTIONS for flag in o.spellings)
# Grid keys that are short for a training option's name.
GRID_SHORTHANDS = {"config": "deepspeed_config"}


def parse_seeds(text: str) -> list[int]:
    """'1-10', '1,3,5' or '1-3,7' -> [1, ..]: ascending ranges, no repeats."""
    seeds: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise UserError(f"--seeds {text!r}: use ranges and lists of non-negative integers, e.g. 1-10 or 1,3,5")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if last < first:
            raise UserError(f"--seeds {text!r}: range {part} runs backwards")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds {text!r}: a seed is listed twice")
    return seeds


def grid_flag(key: str) -> str:
    """A grid key as the training flag it sets: learning_rate -> --learning-rate, config -> --deepspeed-config."""
    return "--" + GRID_SHORTHANDS.get(key, key).replace("_", "-")


def parse_grid(items: list[str]) -> list[tuple[str, str, list[str]]]:
    """['learning_rate=3e-5,5e-5', ...] -> [(key, flag, [values])], checked against the training options."""
    options = config.training_options()
    grid: list[tuple[str, str, list[str]]] = []
    for item in items:
        key, sep, listed = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not listed:
            raise UserError(f"--grid {item!r}: use key=value1,value2 (e.g. learning_rate=3e-5,5e-5)")
        option = options.get(grid_flag(key))
        if option is None or option.type is bool:
            keys = [*GRID_SHORTHANDS, *(o.flag[2:].replace("-", "_") for o in options.values() if o.type is not bool)]
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"did you mean {close[0]}?" if close else "see python -m bert_squad --help"
            raise UserError(f"--grid {item!r}: {key} is not a training option that takes a value ({hint})")
        if option.sweep != "grid":
            raise UserError(f"--grid {item!r}: {key} is the same for every run of a sweep (give it after --)")
        if any(k == key for k, _, _ in grid):
            raise UserError(f"--grid: {key} is given twice")
        values = [v.strip() for v in listed.split(",")]
        for v in values:
            try:
                option.type(v)
            except (TypeError, ValueError):
                raise UserError(f"--grid {item!r}: {v!r} is not a valid {option.flag} value") from None
            if v == "":
                raise UserError(f"--grid {item!r}: {v!r} is not a valid {option.flag} value")
        if len(set(values)) != len(values):
            raise UserError(f"--grid {item!r}: a value is listed twice")
        grid.append((key, option.flag, values))
    return grid


def _safe(text: str) -> str:
    """A value as a directory-name word: a path by its file name, anything odd as '_'."""
    return re.sub(r"[^\w.+-]", "_", Path(text).name if "/" in text else text)


def combinations(grid: list[tuple[str, str, list[str]]], seeds: list[int]) -> list[dict[str, Any]]:
    """Every grid point x seed, seeds innermost, each with its run directory name and group."""
    combos: list[dict[str, Any]] = []
    for point in itertools.product(*[[(key, flag, v) for v in values] for key, flag, values in grid]):
        group = ",".join(f"{key}={_safe(v)}" for key, _, v in point) or "default"
        for seed in seeds:
            combos.append(
                {
                    "index": len(combos),
                    "name": "_".join([f"{key}={_safe(v)}" for key, _, v in point] + [f"seed={seed}"]),
                    "group": group,
                    "seed": seed,
                    "params": {key: v for key, _, v in point},
                    "args": [word for _, flag, v in point for word in (flag, v)],
                }
            )
    names = [c["name"] for c in combos]
    if len(set(names)) != len(names):
        raise UserError(
            f"two grid values give the same run directory name: {sorted({n for n in names if names.count(n) > 1})[0]}"
        )
    return combos


def array_spec(indices: list[int], max_parallel: Optional[int] = None) -> str:
    """[0, 1, 2, 5] -> '0-2,5', plus '%M' to run at most M at once."""
    parts = []
    for _, pairs in itertools.groupby(enumerate(indices), key=lambda p: p[1] - p[0]):
        run = [i for _, i in pairs]
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts) + (f"%{max_parallel}" if max_parallel else "")


def common_args(site: launch.Site, train_args: list[str]) -> list[str]:
    """The training arguments every run gets: the user's, or the site's defaults less the sweep's own."""
    if not train_args:
        words = site.default_args
        return [w for i, w in enumerate(words) if w not in OWN_FLAGS and (i == 0 or words[i - 1] not in OWN_FLAGS)]
    clash = next((w for w in train_args if w.split("=", 1)[0] in OWN_FLAGS), None)
    if clash:
        raise UserError(f"{clash}: the sweep sets {', '.join(o.flag for o in OWN_OPTIONS)} for each run; leave it out")
    return list(train_args)


def check_training_args(train_args: list[str], combos: list[dict[str, Any]]) -> None:
    """Typos and bad values in the training arguments of every grid point, a DeepSpeed config the job would not
    find among them, fail here (a dry run too), not in an array task; the grid point is named."""
    for combo in {c["group"]: c for c in combos}.values():
        try:
            cfg = config.parse_run_config([*train_args, *combo["args"]])
            if cfg.train.named_config:  # none named: the job's device chooses a shipped one
                dsconfig.locate(cfg.train.named_config, base=launch.repo_dir())  # the run's rule, where the job starts
        except UserError as err:
            point = f" with {combo['group']}" if combo["params"] else ""
            raise UserError(f"training arguments{point}: {err}") from None


def build_parser() -> config.ArgumentParser:
    p = config.ArgumentParser(
        prog="bert-squad sweep",
        description="Seeds x hyperparameter grid as one Slurm job array: task i trains combination i into "
        "<runs-dir>/<name>/<combination>/. Training arguments after `--` are common to all runs. "
        "Submitting again skips runs with final metrics and resumes the others.",
    )
    p.add_argument("--seeds", required=True, help="e.g. 1-10, 1,3,5 or 1-3,7")
    p.add_argument(
        "--grid",
        nargs="+",
        default=[],
        metavar="KEY=V1,V2",
        help="training options to vary, e.g. learning_rate=3e-5,5e-5 epochs=2,3",
    )
    p.add_argument(
        "--gpus-per-run",
        dest="gpus_per_node",
        type=int,
        default=None,
        help="ranks (and GPUs) per run, on one node (default: the site's GPUs per node)",
    )
    p.add_argument("--max-parallel", type=int, default=None, help="runs at once (default: all)")
    p.add_argument("--name", help="sweep name (default: from the grid)")
    p.add_argument("--runs-dir", default="runs", help="where the sweep directory goes")
    launch.add_job_options(p)
    p.set_defaults(nodes=1)  # each run on one node
    return p


class Sweep(NamedTuple):
    """A sweep, planned and checked before anything is written."""

    job: launch.JobSpec  # each array task's
    submit: bool  # run sbatch, rather than print its command
    max_parallel: Optional[int]
    manifest: dict[str, Any]
    sweep_dir: Path


def plan(own: list[str], user_args: list[str]) -> Sweep:
    """Parse and check everything before anything is written."""
    args = build_parser().parse_args(own)
    if args.max_parallel is not None and args.max_parallel < 1:
        raise UserError(f"--max-parallel {args.max_parallel}: need at least 1")
    seeds = parse_seeds(args.seeds)
    grid = parse_grid(args.grid)
    combos = combinations(grid, seeds)
    train_args = common_args(launch.load_site(args.site), user_args)
    check_training_args(train_args, combos)
    name = args.name or ("-".join(key for key, _, _ in grid) or "seeds")
    if not re.fullmatch(r"[\w.+=-]+", name):
        raise UserError(f"--name {name!r}: letters, digits and . _ + = - only")
    sweep_dir = directory(Path(args.runs_dir).resolve() / name, "--runs-dir and --name give ")
    manifest = {"name": name, "site": args.site, "train_args": train_args, "combinations": combos}
    return Sweep(config.from_args(launch.JobSpec, args), args.submit, args.max_parallel, manifest, sweep_dir)


def parse(argv: list[str]) -> Sweep:
    own, user_args = launch.split_argv(list(argv))
    return plan(own, user_args)


def submit(sweep: Sweep) -> int:
    """Write the manifest and submit the array of the runs not finished yet (or print its script)."""
    manifest, sweep_dir = sweep.manifest, sweep.sweep_dir
    old = sweep_dir / MANIFEST
    check_manifest(sweep_dir, manifest)
    todo = [c["index"] for c in manifest["combinations"] if not outputs.finished(sweep_dir / c["name"])]
    total = len(manifest["combinations"])
    print(
        f"sweep {manifest['name']}: {total} runs in {sweep_dir}, {total - len(todo)} finished, {len(todo)} to run",
        file=sys.stderr,
    )
    if not todo:
        print(f"nothing to run: every run has its final metrics (bert-squad summarize {shlex.quote(str(sweep_dir))})")
        return 0
    extra: dict[str, Optional[str]] = {
        "job-name": f"bert-squad-sweep-{manifest['name']}",
        "array": array_spec(todo, sweep.max_parallel),
        "output": f"{sweep_dir}/slurm-%A_%a.out",
    }
    # Each array task trains its combination into the sweep directory (slurm/job.sh: BERT_SQUAD_SWEEP_DIR).
    submission = launch.sbatch_command(
        sweep.job, manifest["train_args"], extra, {"BERT_SQUAD_SWEEP_DIR": str(sweep_dir)}
    )
    if not sweep.submit:
        return dry_run(sweep, submission)
    launch.check_job_inputs(submission, manifest["train_args"])
    job_file = sweep_dir / JOB_FILE
    if job_file.exists():
        job_id = job_file.read_text().strip()
        busy = launch.active_tasks(job_id)
        if busy:
            # A second array on the same run directories would train them twice, concurrently.
            raise UserError(
                f"{job_file}: the sweep's job {job_id} still has {len(busy)} task(s) queued or running "
                f"({', '.join(busy[:3])}{', ...' if len(busy) > 3 else ''}); submit again when it "
                f"has ended, or scancel {job_id} first"
            )
    sweep_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(old, manifest)
    submitted = launch.submit(submission)
    if submitted:
        write_text_atomic(job_file, submitted + "\n")
    return 0


def dry_run(sweep: Sweep, submission: launch.Submission) -> int:
    """The array's sbatch command, and what --submit would refuse; the manifest written, so that `sweep run
    --index N` trains a combination here as its array task would."""
    manifest, sweep_dir = sweep.manifest, sweep.sweep_dir
    sweep_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(sweep_dir / MANIFEST, manifest)
    sys.stdout.write(submission.shown())
    print(
        f"wrote {sweep_dir / MANIFEST}: try a combination here with bert-squad sweep run "
        f"{shlex.quote(str(sweep_dir))} --index N (N from 0 to {len(manifest['combinations']) - 1}; sweep.json "
        f"names each)",
        file=sys.stderr,
    )
    launch.preview(lambda: launch.check_job_inputs(submission, manifest["train_args"]))
    return 0


def check_manifest(sweep_dir: Path, manifest: dict[str, Any]) -> None:
    """A different sweep (grid, seeds or training arguments) under this name is refused once it has been
    submitted or has run; a manifest nothing has used yet (a dry run's) is only a plan, and gives way."""
    old = sweep_dir / MANIFEST
    if not old.exists():
        return
    previous = load_manifest(sweep_dir)
    if (previous["train_args"], previous["combinations"]) == (manifest["train_args"], manifest["combinations"]):
        return
    runs = [sweep_dir / str(c.get("name", "")) for c in previous.get("combinations", []) if isinstance(c, dict)]
    if (sweep_dir / JOB_FILE).exists() or any(run.is_dir() and run != sweep_dir for run in runs):
        raise UserError(
            f"{old}: a different sweep (other grid, seeds or training arguments) lives here; choose another --name"
        )


@dataclass(frozen=True)
class SweepTask:
    """`bert-squad sweep run`'s command line: one array task."""

    sweep_dir: str
    index: Optional[int]  # None: $SLURM_ARRAY_TASK_ID
    debug: bool  # tracebacks from the training it runs


def parse_task(argv: list[str]) -> SweepTask:
    p = config.ArgumentParser(
        prog="bert-squad sweep run",
        description="Train one combination of a sweep (what each array task runs), on the training arguments "
        "of the sweep's manifest, with its seed, into its run directory.",
    )
    p.add_argument("sweep_dir", help="the sweep's directory, which holds its sweep.json")
    p.add_argument("--index", type=int, default=None, help="combination (default: $SLURM_ARRAY_TASK_ID)")
    args = p.parse_args(argv)
    return SweepTask(args.sweep_dir, args.index, args.debug)


def run_task(task: SweepTask) -> int:
    """Inside the array task, on every rank: train this task's combination, then record how it ended."""
    from bert_squad import distributed, train  # heavy (torch): only inside an array task, not to submit

    manifest = load_manifest(task.sweep_dir)
    index = task.index
    if index is None and "SLURM_ARRAY_TASK_ID" not in os.environ:
        raise UserError("no combination: run inside a Slurm array task or give --index")
    if index is None:
        index = distributed.env_number(os.environ, "SLURM_ARRAY_TASK_ID")
    combos = manifest["combinations"]
    if not 0 <= index < len(combos):
        raise UserError(f"combination {index}: the sweep has {len(combos)} (0-{len(combos) - 1})")
    combo = combos[index]
    run_dir = Path(task.sweep_dir) / combo["name"]
    rank0 = distributed.detect().rank == 0
    code_file = run_dir / EXIT_CODE_FILE
    if rank0:
        run_dir.mkdir(parents=True, exist_ok=True)
        code_file.unlink(missing_ok=True)  # a rerun is "not finished" until it returns, not the old failure
    argv = [
        *manifest["train_args"],
        *combo["args"],
        "--seed",
        str(combo["seed"]),
        "--output-dir",
        str(run_dir),
        "--resume",
        "auto",
    ]
    code = 1  # what a crash (an exception past exit_code) leaves behind
    try:
        code = exit_code(lambda: train.main(config.parse_run_config(argv)), "bert-squad", task.debug)
    finally:
        if rank0:
            write_text_atomic(code_file, f"{code}\n")
    return code

"""`bert-squad launch`: submit a site's job script, slurm/<site>.sbatch, with sbatch, or print the command.

The site scripts are the source a user reads and edits: their #SBATCH lines and environment say what a site
runs, and slurm/job.sh is the shared part they all source. `launch` and `sweep` ask for something else through
sbatch's own options and the environment, never by writing a script; `--dry-run` prints the exact command
and the files it uses. What a script says (its #SBATCH lines, its DEFAULT_ARGS, its PARTIAL_NODE_PARTITION) is
read from the script.
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Optional

from bert_squad import config, dsconfig
from bert_squad.errors import UserError

SLURM_TIMEOUT = 120  # seconds sbatch and squeue may take before a submission gives up with one line
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
TIME_RE = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2})$")


@dataclass(frozen=True)
class JobSpec:
    """Where and how long a job runs; what `sbatch_command` needs besides the training arguments."""

    site: str
    nodes: int = 1
    gpus_per_node: Optional[int] = None  # ranks per node; None: the site's GPUs per node
    cpus_per_node: Optional[int] = None  # a node's cores, shared by its ranks; None: the site's (Site.cores_per_node)
    time: Optional[str] = None  # Slurm wall-clock limit
    account: Optional[str] = None
    partition: Optional[str] = None  # None: the site's
    requeue: bool = False  # requeue the job after a checkpointed stop (bert_squad.preemption.EXIT_STOPPED)


@dataclass(frozen=True)
class Site:
    """A site's job script, as the script itself says it: its #SBATCH options, default training arguments and
    partition for part of a node."""

    name: str
    script: Path
    sbatch: dict[str, Optional[str]]  # option -> value (None for a flag)
    default_args: list[str]
    partial_node_partition: Optional[str] = None  # where a job on part of a node goes (a site that bills whole ones)

    @property
    def gpu_request(self) -> Optional[str]:
        """The #SBATCH option that asks for GPUs (None: the script asks for none)."""
        return next((o for o in ("gpus-per-task", "gpus-per-node") if o in self.sbatch), None)

    @property
    def gpus_per_node(self) -> int:
        """A node's GPUs, one rank each (0: a script without GPUs, which takes any number)."""
        return int(self.sbatch["ntasks-per-node"] or 0) if self.gpu_request else 0

    @property
    def cores_per_node(self) -> Optional[int]:
        """A node's cores, as a script that fills it with a rank per GPU says them: its ranks x cores per rank
        (Daint 4 x 72, LUMI-G 8 x 7); None where the script does not say (no GPUs, or no --cpus-per-task)."""
        per_rank = self.sbatch.get("cpus-per-task")
        return self.gpus_per_node * int(per_rank) if self.gpus_per_node and per_rank else None


def repo_dir() -> Path:
    """The checkout the job runs (the submit directory, or $BERT_SQUAD_REPO): its slurm/ holds the scripts."""
    repo = Path(os.environ.get("BERT_SQUAD_REPO") or os.getcwd())
    if not (repo / "bert_squad" / "__init__.py").is_file():
        raise UserError(
            f"{repo} has no bert_squad/ (the job runs the checkout it is submitted from): submit from "
            f"the repository root or set BERT_SQUAD_REPO to it"
        )
    return repo.resolve()


def load_site(name: str) -> Site:
    """The Site of slurm/<name>.sbatch in the checkout; one line naming the sites there if there is none."""
    slurm = repo_dir() / "slurm"
    script = slurm / f"{name}.sbatch"
    if not re.fullmatch(r"[\w.-]+", name) or not script.is_file():
        sites = ", ".join(sorted(p.stem for p in slurm.glob("*.sbatch"))) or "none"
        raise UserError(f"--site {name}: no {script} (sites there: {sites})")
    text = script.read_text()
    sbatch = {k: v or None for k, v in re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", text, re.M)}
    lines = re.search(r"^DEFAULT_ARGS=\((.*?)\)$", text, re.M | re.S)
    partial = re.search(r"^PARTIAL_NODE_PARTITION=([\w.-]+)[ \t]*(?:#.*)?$", text, re.M)
    return Site(
        name,
        script,
        sbatch,
        shlex.split(lines.group(1), comments=True) if lines else [],
        partial.group(1) if partial else None,
    )


def add_job_options(p: argparse.ArgumentParser) -> None:
    """The options `launch` and `sweep` share: where and how long the job runs, print or submit."""
    p.add_argument("--site", required=True, help="slurm/<site>.sbatch of the checkout: daint, lumi, generic, ...")
    p.add_argument("--time", help="wall-clock limit in a Slurm format, e.g. 12:00:00 or 1-00:00:00")
    p.add_argument("--account", help="project to charge (sbatch --account)")
    p.add_argument("--partition", help="partition (default: the site script's)")
    p.add_argument(
        "--requeue",
        action="store_true",
        help="after a checkpointed stop (e.g. at the time limit) requeue the job to resume",
    )
    p.add_argument(
        "--cpus-per-node",
        type=int,
        help="a node's cores, divided among its ranks as sbatch --cpus-per-task (default: the site script's ranks x "
        "their cores; where it does not say, as generic's: Slurm's defaults, e.g. the partition's DefCpuPerGPU)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the sbatch command and its files (default)")
    mode.add_argument("--submit", action="store_true", help="run that sbatch command")


def build_parser() -> config.ArgumentParser:
    p = config.ArgumentParser(
        prog="bert-squad launch",
        description="Submit slurm/<site>.sbatch with sbatch (--submit), or print the sbatch command (--dry-run, "
        "the default). Training arguments after `--` replace the script's DEFAULT_ARGS.",
    )
    p.add_argument("--nodes", type=int, default=1, help="nodes the job runs on (sbatch --nodes)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="ranks per node (default: the site's GPUs per node)")
    add_job_options(p)
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """Launch options before `--`, training arguments after it."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def check(spec: JobSpec, site: Site) -> int:
    """The spec's values against the site; returns the ranks per node."""
    if spec.nodes < 1:
        raise UserError(f"--nodes {spec.nodes}: need at least 1 node")
    gpus = site.gpus_per_node if spec.gpus_per_node is None else spec.gpus_per_node
    if gpus < 0:
        raise UserError(f"--gpus-per-node {gpus}: cannot be negative")
    if site.gpus_per_node and gpus > site.gpus_per_node:
        raise UserError(f"--gpus-per-node {gpus}: a {site.name} node has {site.gpus_per_node} GPU(s)")
    if site.gpus_per_node and gpus == 0:
        raise UserError(f"--gpus-per-node 0: {site.name} runs on its GPUs")
    if spec.time and not TIME_RE.match(spec.time):
        raise UserError(f"--time {spec.time!r}: use a Slurm time such as 30, 12:00:00 or 1-00:00:00")
    for key, value in (("account", spec.account), ("partition", spec.partition)):
        if value is not None and not re.fullmatch(r"[\w.-]+", value):
            raise UserError(f"--{key} {value!r}: letters, digits, '.', '_' and '-' only")
    if spec.cpus_per_node is not None and spec.cpus_per_node < max(gpus, 1):
        raise UserError(f"--cpus-per-node {spec.cpus_per_node}: fewer cores than the node's {max(gpus, 1)} rank(s)")
    return gpus


def cpus_per_task(spec: JobSpec, site: Site, gpus: int) -> Optional[int]:
    """Each rank's share of the job's cores on a node (None: the site does not say a node's cores). The job has
    the whole node, except on part of one where the site bills parts (its partial-node partition): there it
    has its GPUs' share of the cores."""
    cores = spec.cpus_per_node or site.cores_per_node
    if cores is None:
        return None
    if site.partial_node_partition and 0 < gpus < site.gpus_per_node:
        cores = cores * gpus // site.gpus_per_node
    return max(cores // max(gpus, 1), 1)


def requested(spec: JobSpec, site: Site, extra: Optional[dict[str, Optional[str]]] = None) -> dict[str, Optional[str]]:
    """The sbatch options `spec` asks for beyond the script's #SBATCH lines, then `extra` (a sweep's)."""
    gpus = check(spec, site)
    opts: dict[str, Optional[str]] = {"nodes": str(spec.nodes), "ntasks-per-node": str(max(gpus, 1))}
    cpus = cpus_per_task(spec, site, gpus)
    if cpus is not None:
        opts["cpus-per-task"] = str(cpus)
    if gpus and site.gpu_request != "gpus-per-task":  # per task: one each, whatever the count
        opts["gpus-per-node"] = str(gpus)
    if site.gpus_per_node and gpus < site.gpus_per_node and site.partial_node_partition:
        opts["partition"] = site.partial_node_partition
    opts.update(
        {
            key: value
            for key, value in (("time", spec.time), ("account", spec.account), ("partition", spec.partition))
            if value
        }
    )
    if spec.requeue:
        opts.update({"requeue": None, "open-mode": "append"})  # a requeued run appends to its log
    opts.update(extra or {})
    return {k: v for k, v in opts.items() if k not in site.sbatch or site.sbatch[k] != v}


@dataclass(frozen=True)
class Submission:
    """The exact sbatch command of a job: its environment, its arguments, and the files it uses."""

    env: dict[str, str]
    argv: list[str]
    files: list[Path]  # the site script first
    effective: dict[str, Optional[str]]  # every sbatch option the job gets: the script's, then the command's

    def shown(self) -> str:
        """The command as a shell line, with the files it uses and everything it asks for as comments."""
        words = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()] + [shlex.quote(w) for w in self.argv]
        asks = " ".join(f"--{k}" if v is None else f"--{k}={v}" for k, v in self.effective.items())
        return f"# files: {' '.join(map(str, self.files))}\n# asks for: {asks}\n" + " ".join(words) + "\n"


def sbatch_command(
    spec: JobSpec,
    train_args: list[str],
    extra: Optional[dict[str, Optional[str]]] = None,
    env: Optional[dict[str, str]] = None,
) -> Submission:
    """The Submission of site script `spec.site` with `spec`'s options and these training arguments (none: the
    script's DEFAULT_ARGS); `env` adds to the job's environment (a sweep's directory)."""
    site = load_site(spec.site)
    opts = requested(spec, site, extra)
    env = {**({"BERT_SQUAD_REQUEUE": "1"} if spec.requeue else {}), **(env or {})}
    argv = [
        "sbatch",
        *(f"--{k}" if v is None else f"--{k}={v}" for k, v in opts.items()),
        str(site.script),
        *train_args,
    ]
    used = re.findall(r"^[^#\n]*?\bslurm/([\w.-]+)", site.script.read_text(), re.M)
    files = [site.script, *dict.fromkeys(site.script.parent / name for name in used)]
    return Submission(env, argv, files, {**site.sbatch, **opts})


def training_args(words: list[str]) -> argparse.Namespace:
    """The job's training arguments, parsed as the job will parse them (a $WORD, which the job's shell
    expands, reads as 0); their errors are named as theirs."""
    try:
        return config.training_parser().parse_known_args(["0" if "$" in w else w for w in words])[0]
    except UserError as err:
        raise UserError(f"training arguments: {err}") from None


def check_job_inputs(submission: Submission, train_args: list[str]) -> None:
    """What the job takes from the submit side, checked now rather than in every task hours later: it runs
    `python -m bert_squad` in the checkout it was submitted from (or $BERT_SQUAD_REPO), relative paths in
    its training arguments (a DeepSpeed config, train and eval files) resolve there, and the job's own
    container checks (image, EDF, mount sources, image architecture) pass."""
    repo = repo_dir()
    check_container_inputs(submission, repo)
    args = training_args(train_args)
    missing = [value for value in (args.train_file, args.eval_file) if value and not (repo / value).is_file()]
    try:  # none named: the job's device chooses a shipped one
        if args.deepspeed_config:
            dsconfig.locate(args.deepspeed_config, base=repo)  # the run's own rule, from where the job starts
    except UserError:
        missing.insert(0, args.deepspeed_config)
    if missing:
        raise UserError(f"{missing[0]}: no such file in {repo}, where the job resolves it")


def check_requeue(spec: JobSpec, train_args: list[str]) -> None:
    """A job that requeues itself trains again into the output dir its first part wrote: without --resume the
    run there refuses it (outputs.refuse_used), so it is refused here, at submit time."""
    if spec.requeue and not training_args(train_args).resume:
        raise UserError(
            "--requeue: the requeued job trains again into its --output-dir; add --resume auto to the training "
            "arguments so that it continues there"
        )


def preview(check: Callable[[], None]) -> None:
    """A dry run's look at what --submit would refuse (`check`, --submit's own checks): one line on stderr; the
    dry run still prints its command and succeeds, since it may run where the job's inputs are not."""
    try:
        check()
    except UserError as err:
        print(f"note: --submit would refuse this here: {err}", file=sys.stderr)


def check_container_inputs(submission: Submission, repo: Path) -> None:
    """Run the site script here, with the job's environment, up to the end of slurm/job.sh's `inputs` part
    (BERT_SQUAD_CHECK_ONLY): one definition of what the job needs, refused before sbatch with the line the job
    would print. `module` does nothing here: the site's modules are the compute nodes'."""
    env = {
        **os.environ,
        **submission.env,
        "BERT_SQUAD_REPO": str(repo),
        "BERT_SQUAD_CHECK_ONLY": "1",
        "BASH_FUNC_module%%": "() {  :\n}",
    }
    proc = subprocess.run(
        ["bash", str(submission.files[0])], capture_output=True, text=True, timeout=120, env=env, cwd=repo
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"the job script's input checks failed (exit {proc.returncode})"]
        raise UserError(lines[-1].replace("bert-squad: error: ", "", 1))


def submit(submission: Submission) -> Optional[str]:
    """Run the submission's sbatch command; returns the job id (None if sbatch's reply names none)."""
    if not shutil.which("sbatch"):
        raise UserError("sbatch is not on PATH: submit from a Slurm login node, or use --dry-run")
    try:
        proc = subprocess.run(
            submission.argv, text=True, capture_output=True, timeout=SLURM_TIMEOUT, env={**os.environ, **submission.env}
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"sbatch did not answer in {SLURM_TIMEOUT} s (is slurmctld reachable? scontrol ping)") from None
    if proc.returncode != 0:
        raise UserError(f"sbatch failed: {proc.stderr.strip() or proc.stdout.strip()}")
    print(proc.stdout.strip())
    m = re.search(r"Submitted batch job (\d+)", proc.stdout)
    return m.group(1) if m else None


def active_tasks(job_id: str) -> list[str]:
    """Ids of the job's tasks still pending or running; none once Slurm has forgotten the job."""
    if not shutil.which("squeue"):
        return []  # no Slurm here, so nothing of it can be queued; sbatch then says what is missing
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%i %T"], text=True, capture_output=True, timeout=SLURM_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"squeue did not answer in {SLURM_TIMEOUT} s (is slurmctld reachable? scontrol ping)") from None
    return proc.stdout.splitlines() if proc.returncode == 0 else []


class Launch(NamedTuple):
    """`bert-squad launch`'s command line."""

    job: JobSpec
    submit: bool  # run sbatch, rather than print its command
    train_args: list[str]  # after `--`; none: the script's DEFAULT_ARGS


def parse(argv: list[str]) -> Launch:
    own, train_args = split_argv(list(argv))
    args = build_parser().parse_args(own)
    return Launch(config.from_args(JobSpec, args), args.submit, train_args)


def run(asked: Launch) -> int:
    submission = sbatch_command(asked.job, asked.train_args)
    train_args = asked.train_args or load_site(asked.job.site).default_args

    def checks() -> None:
        check_requeue(asked.job, train_args)
        check_job_inputs(submission, train_args)

    if not asked.submit:
        sys.stdout.write(submission.shown())
        preview(checks)
        return 0
    checks()
    submit(submission)
    return 0

"""`bert-squad launch`: render a Slurm job script for a site, print it or submit it with sbatch.

Site facts live in sites.json and the shell in job_template.sh; slurm/<site>.sbatch are the renders of
each site's defaults (`make slurm-renders`), and a test keeps them equal to this module's output.
A script is rendered from a `JobSpec`, which `launch` builds from its command line and `sweep` directly.
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
from typing import Optional

from bert_squad import config, dsconfig
from bert_squad.cluster import edf
from bert_squad.errors import UserError
from bert_squad.files import read_json

HERE = Path(__file__).resolve().parent
SITES_FILE = HERE / "sites.json"
TEMPLATE_FILE = HERE / "job_template.sh"
SLURM_TIMEOUT = 120  # seconds sbatch and squeue may take before a submission gives up with one line
# The part of a job script that `bert-squad launch --submit` also runs on the submit host.
INPUTS_RE = re.compile(r"^# >>> inputs.*?^# <<< inputs$", re.M | re.S)
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
TIME_RE = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2})$")


@dataclass(frozen=True)
class JobSpec:
    """Where and how long a job runs; what `render` needs besides the training arguments."""

    site: str
    nodes: int = 1
    gpus_per_node: Optional[int] = None  # ranks per node; None: the site's GPUs per node
    time: Optional[str] = None  # Slurm wall-clock limit
    account: Optional[str] = None
    partition: Optional[str] = None  # None: the site's
    requeue: bool = False  # requeue the job after a checkpointed stop (exit 75)


def load_sites():
    sites = read_json(SITES_FILE)
    return {name: site for name, site in sites.items() if not name.startswith("_")}


def add_job_options(p, sites):
    """The options `launch` and `sweep` share: where and how long the job runs, print or submit."""
    p.add_argument("--site", required=True, choices=sorted(sites))
    p.add_argument("--time", help="wall-clock limit in a Slurm format, e.g. 12:00:00 or 1-00:00:00")
    p.add_argument("--account", help="project to charge (#SBATCH --account)")
    p.add_argument("--partition", help="partition (default: the site's)")
    p.add_argument("--requeue", action="store_true",
                   help="after a checkpointed stop (exit 75, e.g. at the time limit) requeue the job to resume")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the job script (default)")
    mode.add_argument("--submit", action="store_true", help="submit the job script with sbatch")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)


def build_parser(sites):
    p = config.ArgumentParser(
        prog="bert-squad launch",
        description="Render a Slurm job script for a site and print it (--dry-run, the default) or submit it "
                    "(--submit). Training arguments after `--` become the script's defaults; arguments given "
                    "to sbatch after the script name replace them.")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=None, help="ranks per node (default: the site's GPUs per node)")
    add_job_options(p, sites)
    return p


def split_argv(argv):
    """Launch options before `--`, training arguments after it."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def sbatch_options(site, spec, gpus, extra=None):
    """#SBATCH lines: the site's, then the options given, then `extra` (e.g. a sweep's --array)."""
    opts = {"job-name": "bert-squad", "nodes": spec.nodes, "ntasks-per-node": max(gpus, 1)}
    # gpus-per-task: Slurm gives each rank its own GPU (CUDA_VISIBLE_DEVICES), as CSCS documents for GH200.
    if gpus:
        opts[site["gpu_request"]] = 1 if site["gpu_request"] == "gpus-per-task" else gpus
    opts.update(site["sbatch"])
    if gpus == 0:
        opts.pop("mem-per-gpu", None)
    opts.update({key: value for key, value in (("time", spec.time), ("account", spec.account),
                                                ("partition", spec.partition)) if value})
    # B: the warning goes to the batch shell only, whose trap forwards it to the launcher.
    opts["signal"] = f"B:USR1@{site['signal_seconds']}"
    opts["output"] = "bert-squad-%j.out"
    if spec.requeue:
        opts["requeue"] = None
        opts["open-mode"] = "append"  # a requeued run appends to the log instead of truncating it
    opts.update(extra or {})
    return "\n".join(f"#SBATCH --{k}" if v is None else f"#SBATCH --{k}={v}" for k, v in opts.items())


def check(spec, site):
    """The spec's values against the site; returns the ranks per node."""
    if spec.nodes < 1:
        raise UserError(f"--nodes {spec.nodes}: need at least 1 node")
    site_name = spec.site
    gpus = site["gpus_per_node"] if spec.gpus_per_node is None else spec.gpus_per_node
    if gpus < 0:
        raise UserError(f"--gpus-per-node {gpus}: cannot be negative")
    if site["gpus_per_node"] and gpus > site["gpus_per_node"]:
        raise UserError(f"--gpus-per-node {gpus}: a {site_name} node has {site['gpus_per_node']} GPU(s)")
    if site["gpus_per_node"] and gpus == 0:
        raise UserError(f"--gpus-per-node 0: {site_name} runs on its GPUs")
    if spec.time and not TIME_RE.match(spec.time):
        raise UserError(f"--time {spec.time!r}: use a Slurm time such as 30, 12:00:00 or 1-00:00:00")
    for key, value in (("account", spec.account), ("partition", spec.partition)):
        if value is not None and not re.fullmatch(r"[\w.-]+", value):
            raise UserError(f"--{key} {value!r}: letters, digits, '.', '_' and '-' only")
    return gpus


def shell_word(text):
    """A site value: double-quoted, so the batch shell expands its $VARIABLES."""
    return '"' + re.sub(r'(["\\`])', r"\\\1", text) + '"'


def render(spec, train_args, command, extra_sbatch=None, rank_command=(), check_args=()):
    """The job script for `spec`; `command` is the command line shown in its header. The ranks run
    `python -m bert_squad <rank_command> <training arguments>` (a sweep's task: `sweep run DIR --`), and the
    job's cache check `check-cache <training arguments> <check_args>`."""
    site = load_sites()[spec.site]
    gpus = check(spec, site)
    # The site's CPU masks map local rank i to the cores next to GCD i: only true on a whole node.
    cpu_bind = site["cpu_bind"] if gpus == site["gpus_per_node"] else ""
    values = {
        "site": spec.site,
        "description": site["description"],
        "command": command,
        "sbatch": sbatch_options(site, spec, gpus, extra_sbatch),
        "modules": "\n".join(f"module {m}" for m in site["modules"]) or "# (no modules: the environment of sbatch)",
        "site_env": "".join(f"export {k}={shell_word(v)}\n" for k, v in site["env"].items()),
        "runtime": site["runtime"],
        "launcher": site["launcher"],
        "requeue": "1" if spec.requeue else "0",
        "scratch": shell_word(site["scratch"]),
        "image": shell_word(site["image"]),
        "runtime_flags": shell_word(site["runtime_flags"]),
        "gpu_env": site["gpu_env"] if gpus else "",
        "arch": shell_word(site["arch"]),
        "network": shell_word(site["network"]),
        "edf": edf.site_tables(site["edf"], f"{SITES_FILE.name}: {spec.site}.edf"),
        "cpu_bind": shell_word(cpu_bind),
        "train_args": " ".join(shlex.quote(a) for a in train_args) if train_args
        else " ".join(shell_word(a) for a in site["train_args"]),
        "rank_command": " ".join(shlex.quote(a) for a in rank_command),
        "check_args": " ".join(shlex.quote(a) for a in check_args),
    }

    def fill(match):
        return values[match.group(1)]

    return re.sub(r"\{\{(\w+)\}\}", fill, TEMPLATE_FILE.read_text())


def training_args(words):
    """The job's training arguments, parsed as the job will parse them (a $WORD, which the job's shell
    expands, reads as 0); their errors are named as theirs."""
    try:
        return config.training_parser().parse_known_args(["0" if "$" in w else w for w in words])[0]
    except UserError as err:
        raise UserError(f"training arguments: {err}") from None


def check_job_inputs(train_args, script):
    """What the job takes from the submit side, checked now rather than in every task hours later: it runs
    `python -m bert_squad` in the checkout it was submitted from (or $BERT_SQUAD_REPO), relative paths in
    its training arguments (a DeepSpeed config, train and eval files) resolve there, and the script's own
    container checks (image, EDF, mount sources, image architecture) pass."""
    repo = Path(os.environ.get("BERT_SQUAD_REPO") or os.getcwd())
    if not (repo / "bert_squad" / "__init__.py").is_file():
        raise UserError(f"{repo} has no bert_squad/ (the job runs the checkout it is submitted from): submit from "
                        f"the repository root or set BERT_SQUAD_REPO to it")
    check_container_inputs(script, repo)
    args = training_args(train_args)
    for value in (args.deepspeed_config, args.train_file, args.eval_file):
        if not value or (repo / value).is_file():
            continue
        if value == args.deepspeed_config and Path(value).parent == Path(".") and (
                Path(value).stem in dsconfig.shipped_names()):
            continue
        raise UserError(f"{value}: no such file in {repo}, where the job resolves it")


def check_container_inputs(script, repo):
    """Run the script's `inputs` part (its paths and `check_inputs`) here, with this environment: one
    definition of what the job needs, refused before sbatch with the line the job would print."""
    section = INPUTS_RE.search(script).group(0)
    proc = subprocess.run(["bash", "-c", f"{section}\ncheck_inputs"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "BERT_SQUAD_REPO": str(repo)})
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"the job script's input checks failed (exit {proc.returncode})"]
        raise UserError(lines[-1].replace("bert-squad: error: ", "", 1))


def submit(script):
    """sbatch the script; returns the job id (None if sbatch's reply names none)."""
    if not shutil.which("sbatch"):
        raise UserError("sbatch is not on PATH: submit from a Slurm login node, or use --dry-run")
    try:
        proc = subprocess.run(["sbatch"], input=script, text=True, capture_output=True, timeout=SLURM_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise UserError(f"sbatch did not answer in {SLURM_TIMEOUT} s (is slurmctld reachable? scontrol ping)") from None
    if proc.returncode != 0:
        raise UserError(f"sbatch failed: {proc.stderr.strip() or proc.stdout.strip()}")
    print(proc.stdout.strip())
    m = re.search(r"Submitted batch job (\d+)", proc.stdout)
    return m and m.group(1)


def active_tasks(job_id):
    """Ids of the job's tasks still pending or running; none once Slurm has forgotten the job."""
    if not shutil.which("squeue"):
        return []  # no Slurm here, so nothing of it can be queued; sbatch then says what is missing
    try:
        proc = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%i %T"], text=True, capture_output=True,
                              timeout=SLURM_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise UserError(f"squeue did not answer in {SLURM_TIMEOUT} s (is slurmctld reachable? scontrol ping)") from None
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def shown_command(prog, own, train_args):
    """The command line that renders the same script, for its header: submit options become --dry-run."""
    shown = [a for a in own if a not in ("--submit", "--debug")]
    if "--dry-run" not in shown:
        shown.append("--dry-run")
    command = " ".join([prog, *map(shlex.quote, shown), *(["--"] if train_args else []),
                        *map(shlex.quote, train_args)])
    return command.replace("\n", "\\n")


def job_spec(args, nodes=None):
    """The JobSpec of parsed `launch` or `sweep` options (a sweep's runs are one node each)."""
    return JobSpec(site=args.site, nodes=args.nodes if nodes is None else nodes, gpus_per_node=args.gpus_per_node,
                   time=args.time, account=args.account, partition=args.partition, requeue=args.requeue)


def parse(argv):
    own, train_args = split_argv(list(argv))
    return own, build_parser(load_sites()).parse_args(own), train_args


def run(parsed):
    own, args, train_args = parsed
    script = render(job_spec(args), train_args, shown_command("bert-squad launch", own, train_args))
    if args.submit:
        check_job_inputs(train_args or load_sites()[args.site]["train_args"], script)
        submit(script)
        return 0
    sys.stdout.write(script)
    return 0

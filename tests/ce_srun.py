"""`srun` as the CSCS Container Engine extends it: `--environment=EDF` runs every task of the step in the
container that EDF defines. The CE (Enroot + Pyxis with EDF parsing and CSCS's hooks) exists only at CSCS;
here Charliecloud's ch-run (Debian's charliecloud-runtime), an unprivileged runtime of the same kind as
Enroot (user namespaces, the host's network and processes, the host's /etc/hosts), stands in for it. The
EDF is checked against the reference's keys and types (`problems`), its ${VAR}s expanded (`expanded`), and
each key carried into ch-run's options (`ch_run`); the real srun then starts one ch-run a task, so a Daint
job runs in real containers on the test Slurm. This is the test's own reading of edf.md, not the CE's code:
it holds the job scripts and EDFs to what edf.md says, and is itself held to edf.md's own examples
(tests/test_edf_reading.py). Where edf.md leaves a choice, it is named here: ${VAR} in [env] takes the host's
and the image's environment like every other entry (edf.md's "Limitations" says only the host's variables
can be referenced there, its "Syntax" that the image's win).

Key by key (the reference: cscs-docs docs/software/container-engine/edf.md):
- image: a local SquashFS file, unpacked for the step into a root file system of its own (as Enroot's
  `create` does), removed when the step ends. A registry reference would need a registry: refused.
- mounts: `ch-run -b SOURCE:DESTINATION`, the destination made in the step's copy if the image lacks it (as
  Enroot does). Mount FLAGS (ro, private) have no ch-run equivalent: refused, not dropped.
- workdir: `ch-run --cd`. writable: `ch-run -w` on the step's copy; false: the image is read-only.
- entrypoint: true runs the command through the image's /etc/rc (Enroot's entrypoint) where it has one.
- env: the host's environment, then the image's (/etc/environment, where Enroot keeps it), then the EDF's
  [env] (edf.md: each wins over the one before): ch-run passes the host's through and applies each
  `--set-env=NAME=VALUE` in that order; an empty value unsets the variable (`--unset-env`).
- annotations drive the CE's own hooks (CXI, the NCCL plugin), which have no meaning without Slingshot:
  accepted, not carried. base_environment (EDF inheritance) is not carried: refused.
The container's /tmp is its own (`--private-tmp`), not the host's, so the host paths a task sees are the
EDF's mounts. CE_SRUN_MOUNTS (comma-separated SOURCE:DESTINATION) adds the test's own mounts to every EDF's:
its Python, which the test image lacks and a real image has. CE_SRUN_WORK is where steps unpack their image.

tests/test_edf_contract.py installs this as `srun`; REAL_SRUN names the real one. It stays srun's parent
and passes on every signal srun handles, so the job's USR1 reaches the ranks. SLURM_NETWORK (CSCS's
`disable_rdzv_get` for Alps Extended Images) is Cray's: the test Slurm has no such network.
"""

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tomllib

# Entry or table -> the TOML types the reference gives it (Python types of a parsed document).
KEYS = {
    "base_environment": (str, list),
    "image": (str,),
    "workdir": (str,),
    "entrypoint": (bool,),
    "writable": (bool,),
    "mounts": (list,),
    "env": (dict,),
    "annotations": (dict,),
}
# What srun passes on to the tasks (its own man page, SIGNALS): the job script forwards USR1 to srun.
FORWARDED = (
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGCONT,
)


class Refused(Exception):
    """What the stand-in cannot start, said in one line."""


def _leaves(table: dict, prefix: str = ""):
    """(dotted key, value) of a table, nested tables flattened (`[annotations.com.hooks]` = dotted keys)."""
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def problems(doc: dict) -> list:
    """What in a parsed EDF is not in the reference, or has the wrong type: one line each."""
    found = []
    for key, value in doc.items():
        if key not in KEYS:
            found.append(f"{key}: not an EDF entry (the reference has {', '.join(KEYS)})")
        elif not isinstance(value, KEYS[key]):
            found.append(
                f"{key}: a {type(value).__name__}, the reference says {' or '.join(t.__name__ for t in KEYS[key])}"
            )
    for i, mount in enumerate(doc.get("mounts", [])):
        if not isinstance(mount, str) or not re.fullmatch(r"[^:]+:[^:]+(:[^:]+)?", mount):
            found.append(f"mounts[{i}]: {mount!r} is not SOURCE:DESTINATION[:FLAGS]")
    for table in ("env", "annotations"):
        for key, value in _leaves(doc.get(table, {}) if isinstance(doc.get(table), dict) else {}):
            if not isinstance(value, str):
                found.append(f"{table}.{key}: values are strings in the reference, not {type(value).__name__}")
    return found


def expanded(value, env: dict):
    """`value` with each ${NAME} replaced from `env`, in strings, lists and tables (edf.md: `${VAR:-}` is
    empty where VAR is undefined, `$${VAR}` is the literal `${VAR}`, any other undefined VAR an error)."""
    if isinstance(value, dict):
        return {k: expanded(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [expanded(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match):
        literal, name, default = match.groups()
        if literal:
            return literal
        if name not in env and default is None:
            raise Refused(f"${{{name}}} is not defined (write ${{{name}:-}} for empty)")
        return env.get(name, default)

    return re.sub(r"\$(\$\{[^}]*\})|\$\{(\w+)(?::-([^}]*))?\}", one, value)


def image_environment(rootfs: Path) -> dict:
    """The image's environment: NAME=VALUE lines of its /etc/environment (Enroot's image format)."""
    path = rootfs / "etc" / "environment"
    found = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, eq, value = line.strip().removeprefix("export ").partition("=")
        if eq and re.fullmatch(r"\w+", name):
            found[name] = value.strip("\"'")
    return found


def unpacked(image: str, work: Path) -> Path:
    """The step's own root file system: the SquashFS `image` unpacked into a new folder of `work`."""
    if not image.startswith("/") or not Path(image).is_file():
        raise Refused(f"image {image}: not a SquashFS file here (a registry reference needs a registry)")
    step = Path(tempfile.mkdtemp(prefix="ce-step-", dir=work))
    proc = subprocess.run(
        ["unsquashfs", "-quiet", "-no-progress", "-d", str(step / "rootfs"), image],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        shutil.rmtree(step, ignore_errors=True)
        raise Refused(f"image {image}: unsquashfs failed: {(proc.stderr.strip().splitlines() or ['no message'])[-1]}")
    return step


def mount_point(rootfs: Path, source: str, destination: str) -> None:
    """Make `destination` in the step's copy (a directory, or a file for a file source), refusing to follow
    the image's symlinks there: an absolute one would lead to the host's own tree."""
    path = rootfs
    parts = Path(destination).parts[1:]
    for i, part in enumerate(parts):
        path = path / part
        if path.is_symlink():
            raise Refused(f"mount destination {destination}: /{'/'.join(parts[: i + 1])} is a symlink in the image")
        if not path.exists():
            if i == len(parts) - 1 and not Path(source).is_dir():
                path.touch()
            else:
                path.mkdir()


def binds(mounts: list, rootfs: Path) -> list:
    """ch-run's -b options for the EDF's mounts and the test's own, their destinations made where needed
    (under /tmp, ch-run makes them in the container's own /tmp)."""
    extra = [m for m in os.environ.get("CE_SRUN_MOUNTS", "").split(",") if m]
    flags = []
    for mount in [*mounts, *extra]:
        source, destination, *options = mount.split(":")
        if options:
            raise Refused(f"mount {mount}: flags ({options[0]}) have no equivalent in ch-run, the stand-in")
        if not Path(source).exists():
            raise Refused(f"mount {mount}: {source} does not exist")
        if Path(destination).parts[1:2] != ("tmp",):
            mount_point(rootfs, source, destination)
        flags.append(f"--bind={source}:{destination}")
    return flags


def ch_run(edf: dict, rootfs: Path) -> list:
    """The ch-run command (up to the task's command) that runs a task as the expanded `edf` says (edf.md:
    writable and entrypoint default to true)."""
    flags = ["ch-run", "--private-tmp", *(["--write"] if edf.get("writable", True) else [])]
    flags += binds(edf.get("mounts", []), rootfs)
    if "workdir" in edf:
        flags.append(f"--cd={edf['workdir']}")
    flags.append("--env-no-expand")  # the values are expanded already
    flags += [f"--set-env={name}={value}" for name, value in image_environment(rootfs).items()]
    flags += [
        f"--set-env={name}={value}" if value != "" else f"--unset-env={name}"
        for name, value in edf.get("env", {}).items()
    ]
    flags += [str(rootfs), "--"]
    if edf.get("entrypoint", True) and (rootfs / "etc" / "rc").is_file():
        flags += ["/bin/sh", "/etc/rc"]
    return flags


def load(path: str, env: dict) -> dict:
    """The EDF at `path`, checked, its image expanded from the host's environment; the rest is expanded once
    the image's environment is known (run_step: edf.md expands from the host's and the image's)."""
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    wrong = problems(doc)
    if wrong:
        raise Refused("; ".join(wrong))
    if "base_environment" in doc:
        raise Refused("base_environment: EDF inheritance is not carried by the stand-in")
    return {**doc, "image": expanded(doc.get("image", ""), env)}


def split(argv: list) -> tuple:
    """(srun's options without --environment, the EDF path or None, the task's command). srun's options
    come first, each one word (`--name=value`, as slurm/job.sh writes them); the command is the rest."""
    options, edf = [], None
    for i, arg in enumerate(argv):
        if arg.startswith("--environment="):
            edf = arg.split("=", 1)[1]
        elif arg == "--":
            return options, edf, argv[i + 1 :]
        elif arg.startswith("-"):
            options.append(arg)
        else:
            return options, edf, argv[i:]
    return options, edf, []


def run_step(options: list, edf_path: str, command: list) -> int:
    """The step in the EDF's containers: the image unpacked, the real srun run with ch-run before the
    command, the signals srun handles passed on, the step's copy removed once srun has ended."""
    env = {**os.environ, "USER": os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name}  # ch-run needs it
    env.pop("SLURM_NETWORK", None)
    started = []  # the real srun, once it runs: a signal before has no task to reach, and must not end this one
    for sig in FORWARDED:
        signal.signal(sig, lambda number, frame: [srun.send_signal(number) for srun in started])
    edf = load(edf_path, env)
    step = unpacked(edf["image"], Path(os.environ.get("CE_SRUN_WORK") or tempfile.gettempdir()))
    try:
        rootfs = step / "rootfs"
        rest = expanded({k: v for k, v in edf.items() if k != "image"}, {**env, **image_environment(rootfs)})
        started.append(subprocess.Popen([os.environ["REAL_SRUN"], *options, *ch_run(rest, rootfs), *command], env=env))
        _, status = os.waitpid(started[0].pid, 0)  # as long as the step runs: the job's time limit bounds it
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_IGN)  # srun is gone; the copy is removed whatever comes now
        return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    finally:
        shutil.rmtree(step, ignore_errors=True)


def main(argv: list) -> int:
    options, edf_path, command = split(argv)
    if edf_path is None:
        os.execv(os.environ["REAL_SRUN"], ["srun", *argv])
    try:
        return run_step(options, edf_path, command)
    except (Refused, OSError, ValueError) as err:  # ValueError: TOML that does not parse
        print(f"ce_srun: {edf_path}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

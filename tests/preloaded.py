"""`python -m bert_squad ...` for the tests, in a process forked from one that has imported the command
modules and their libraries already (multiprocessing's forkserver, preloaded with them).

Each run of the CLI is a process of its own either way: its own pid and process group, its environment,
stdout and stderr in files, its exit code or signal. What a fork saves is the start-up: importing torch,
DeepSpeed, transformers and datasets costs every `python -m bert_squad` 6 to 7 s of CPU, which a suite of
hundreds of runs on two cores pays in its wall time. A fork is taken only where it cannot tell from a fresh
interpreter:
- the command is `python -m bert_squad`, or one of the tap scripts beside this file that run the CLI with a
  hook (`SCRIPTS`), run from the checkout (where `-m` imports the same package);
- it is not `download`, the one command that goes online (the libraries read the offline switch at import);
- its environment differs from the session's (`session_started`, the forkserver's) only in variables read at
  run time (`RUNTIME_VARS`, `RUNTIME_PREFIXES`), never in one a library reads at import.
Anything else, and every launcher's ranks (mpirun, srun, the containers), starts a fresh interpreter, and
`BERT_SQUAD_TESTS_FRESH=1` makes every run start one.
"""

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from bert_squad import runtime
from bert_squad.commands import ALIASES, COMMANDS

ROOT = Path(__file__).resolve().parents[1]
# Read by the package, torch.distributed, tokenizers or pytest when a command runs, not at import: a run may
# differ in these.
RUNTIME_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COLUMNS"}
RUNTIME_VARS |= {"TOKENIZERS_PARALLELISM"}
RUNTIME_VARS |= {"TORCHINDUCTOR_CACHE_DIR"}  # torch sets its default on import: the forkserver's is the same
# Every command but `download` sets the offline switches itself before it uses the libraries (for libraries
# already imported too: runtime.prepare); the hub's timeouts only a download reads. Tests that run `download`
# in their own process leave them changed.
RUNTIME_VARS |= {*runtime.OFFLINE_VARS, "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"}
RUNTIME_PREFIXES = ("BERT_SQUAD_", "SLURM_", "PYTEST_")
# The tests' scripts that run the CLI with a hook, forked as the CLI is.
SCRIPTS = {str(ROOT / "tests" / name) for name in ("state_tap.py", "reduce_tap.py")}
# Every command's modules, which import the libraries.
PRELOAD = sorted({"bert_squad.cli"} | {spec.split(":")[0] for c in COMMANDS.values() for spec in (c.parse, c.run)})
# The commands that go online, by their words and aliases.
ONLINE = {word for word, c in COMMANDS.items() if not c.offline}
ONLINE |= {alias for alias, word in ALIASES.items() if word in ONLINE}
# The session's environment once conftest has set it up, before any test changed it: the forkserver's, and what
# a fork's may differ from only in run-time variables. Empty outside a test session: no forks there.
SESSION_ENV: dict = {}

_context = multiprocessing.get_context("forkserver")
_server_started = False


def session_started() -> None:
    """Record the session's environment, once set up, as the one the forkserver starts with."""
    SESSION_ENV.update(os.environ, PYTHONUNBUFFERED="1")


def can_fork(cmd: list, env: dict, cwd) -> bool:
    """Whether `cmd` run with `env` in `cwd` is a run a fork from the preloaded server reproduces."""
    if not SESSION_ENV or os.environ.get("BERT_SQUAD_TESTS_FRESH") == "1":
        return False
    cli = cmd[:3] == [sys.executable, "-m", "bert_squad"]
    if not (cli or (cmd[:1] == [sys.executable] and cmd[1:2] and cmd[1] in SCRIPTS)):
        return False
    if Path(cwd).resolve() != ROOT or ONLINE & set(cmd[3 if cli else 2 :]):
        return False
    return not read_at_import_differ(env)


def read_at_import_differ(env: dict) -> set:
    """The variables `env` differs in from the session's that a library may read at import."""
    differ = {k for k in env.keys() | SESSION_ENV.keys() if env.get(k) != SESSION_ENV.get(k)}
    return {k for k in differ if k not in RUNTIME_VARS and not k.startswith(RUNTIME_PREFIXES)}


def start(args: list, env: dict, stdout: Path, stderr: Path) -> "Forked":
    """`python *args` (`-m bert_squad ...` or a tap script's) forked from the preloaded server (started on first
    use), its output appended to the files `stdout` and `stderr`."""
    if not _server_started:
        _start_server()
    process = _context.Process(target=_run_cli, args=(args, env, str(stdout), str(stderr)))
    process.start()
    return Forked(process)


def _start_server() -> None:
    """The forkserver, started with the session's environment (not the calling test's changes to it)."""
    global _server_started
    _context.set_forkserver_preload(PRELOAD)
    now = dict(os.environ)
    os.environ.clear()
    os.environ.update(SESSION_ENV)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(now)
    _server_started = True


class Forked:
    """A forked run, with what the tests use of subprocess.Popen: pid, poll, wait, returncode, send_signal.
    Not a child of this process but of the forkserver, which reports its exit."""

    def __init__(self, process):
        self.process, self.pid = process, process.pid

    @property
    def returncode(self):
        return self.process.exitcode

    def poll(self):
        return self.process.exitcode

    def wait(self, timeout=None):
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(["python", "-m", "bert_squad"], timeout)
        return self.process.exitcode

    def send_signal(self, sig):
        os.kill(self.pid, sig)


def _run_cli(args: list, env: dict, stdout: str, stderr: str) -> None:
    """In the forked child: become the process `python *args` would be, run it, and exit as the interpreter exits
    (threads' exit hooks and joins, atexit handlers, streams flushed)."""
    os.setsid()  # a process group of its own, which the tests signal and kill as a whole
    for fd, path in ((1, stdout), (2, stderr)):  # the forkserver's unbuffered sys.stdout and sys.stderr write here
        opened = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(opened, fd)
        os.close(opened)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    module = args[0] == "-m"
    # What the interpreter sets: argv[0] the module's file or the script, sys.path[0] the working directory or
    # the script's folder.
    sys.argv = [str(ROOT / "bert_squad" / "__main__.py"), *args[2:]] if module else list(args)
    sys.path.insert(0, str(ROOT if module else Path(args[0]).parent))
    code = 0
    try:
        if module:
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as e:  # as the interpreter reads it: None is 0, a number the code, anything else printed
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own: executors stopped, threads joined
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

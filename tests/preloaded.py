"""`python -m bert_squad ...` for the tests, in a process forked from one that has imported the command
modules and their libraries already (a forkserver of multiprocessing's, preloaded with them).

Each run of the CLI is a process of its own either way: its own pid and process group, its environment,
stdout and stderr in files, its exit code or signal. What a fork saves is the start-up: importing torch,
DeepSpeed, transformers and datasets costs every `python -m bert_squad` 6 to 7 s of CPU, which a suite of
hundreds of runs on two cores pays in its wall time. A fork is taken only where it cannot tell from a fresh
interpreter:
- no GPU is visible (`session_started`): the servers' imports ask torch whether CUDA is there, which on a GPU
  initialises the driver in them, and a forked child could not use CUDA again;
- the command is `python -m bert_squad`, or one of the tap scripts beside this file that run the CLI with a
  hook (`SCRIPTS`), run from the checkout (where `-m` imports the same package);
- it is not `download`, the one command that goes online (the libraries read the offline switch at import);
- its environment differs from the session's (`session_started`, the servers') only in variables read at
  run time (`RUNTIME_VARS`, `RUNTIME_PREFIXES`), never in one a library reads at import;
- it is rank 0 or 1 of its run (or no rank): rank r forks from a server of its own (`SERVERS`), a fresh
  interpreter with its own hash secret, as the ranks a launcher starts have theirs (a set's or a dict's order
  that differs between ranks shows as it would);
- the server printed nothing as it started and imported (`import_output`): a fresh run, which sets itself up
  as the server does before it imports (`preload_prepare.py`), prints nothing there either, so a forked run's
  stdout and stderr are all a fresh one's.
Anything else, and every launcher's ranks (mpirun, srun, the containers), starts a fresh interpreter, and
`BERT_SQUAD_TESTS_FRESH=1` makes every run start one. A forked run ends as the interpreter ends (`_run_cli`).
"""

import atexit
import contextlib
import ctypes
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
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
# The process set up as the CLI sets itself up before its imports (a module of this folder, which the server's
# PYTHONPATH names until that module has run), then every command's modules, which import the libraries.
PREPARE = str(ROOT / "tests")
PRELOAD = ["preload_prepare"]
PRELOAD += sorted({"bert_squad.cli"} | {spec.split(":")[0] for c in COMMANDS.values() for spec in (c.parse, c.run)})
# The commands that go online, by their words and aliases.
ONLINE = {word for word, c in COMMANDS.items() if not c.offline}
ONLINE |= {alias for alias, word in ALIASES.items() if word in ONLINE}
# The ranks that fork, each from a server of its own: the tests start at most two ranks of a run by hand.
SERVERS = 2
# The session's environment once conftest has set it up, before any test changed it: the servers', and what
# a fork's may differ from only in run-time variables. Empty outside a test session, or where a GPU is
# visible: no forks there.
SESSION_ENV: dict = {}

_context = multiprocessing.get_context("forkserver")
_servers: dict = {}  # rank -> (its ForkServer, the file its stdout and stderr go to)
_lock = threading.Lock()
_libc = ctypes.CDLL(None)


def session_started(gpus: int) -> None:
    """Record the session's environment, once set up, as the one the servers start with; where torch sees
    `gpus` GPUs, none (no run forks)."""
    if not gpus:
        SESSION_ENV.update(os.environ, PYTHONUNBUFFERED="1")


def can_fork(cmd: list, env: dict, cwd) -> bool:
    """Whether `cmd` run with `env` in `cwd` is a run a fork from a preloaded server reproduces (starting the
    server if it has not started)."""
    if not SESSION_ENV or os.environ.get("BERT_SQUAD_TESTS_FRESH") == "1":
        return False
    cli = cmd[:3] == [sys.executable, "-m", "bert_squad"]
    if not (cli or (cmd[:1] == [sys.executable] and cmd[1:2] and cmd[1] in SCRIPTS)):
        return False
    if Path(cwd).resolve() != ROOT or ONLINE & set(cmd[3 if cli else 2 :]):
        return False
    rank = server_of(env)
    return rank is not None and not read_at_import_differ(env) and not import_output(rank)


def server_of(env: dict) -> "int | None":
    """The server a run with `env` forks from: its rank's (RANK, 0 where unset), None for a rank beyond them."""
    rank = env.get("RANK", "0")
    return int(rank) if rank.isdigit() and int(rank) < SERVERS else None


def read_at_import_differ(env: dict) -> set:
    """The variables `env` differs in from the session's that a library may read at import."""
    differ = {k for k in env.keys() | SESSION_ENV.keys() if env.get(k) != SESSION_ENV.get(k)}
    return {k for k in differ if k not in RUNTIME_VARS and not k.startswith(RUNTIME_PREFIXES)}


def import_output(rank: int) -> str:
    """What server `rank` printed as it started and imported: its preload is over once it has forked a
    process, as here the first time."""
    if rank not in _servers:
        with _forking_by(rank):
            probe = _context.Process(target=os.getpid)
            probe.start()
        probe.join()
    return os.pread(_servers[rank][1].fileno(), 1 << 16, 0).decode(errors="replace")


def start(args: list, env: dict, stdout: Path, stderr: Path, umask: "int | None" = None) -> "Forked":
    """`python *args` (`-m bert_squad ...` or a tap script's) forked from the server of its rank (started on first
    use), its output appended to the files `stdout` and `stderr`, under `umask` where given (else the server's,
    the session's)."""
    process = _context.Process(target=_run_cli, args=(args, env, str(stdout), str(stderr), umask))
    with _forking_by(server_of(env)):
        process.start()
    return Forked(process)


@contextlib.contextmanager
def _forking_by(rank: int) -> Iterator[None]:
    """While a process starts: forked by server `rank`, which starts here where it has not (or has died) as the
    session's, with its environment, not the calling test's changes to it, and its stdout and stderr in a file
    of its own (what it prints at import)."""
    with _lock:
        if rank not in _servers:
            server = multiprocessing.forkserver.ForkServer()
            server.set_forkserver_preload(PRELOAD)
            _servers[rank] = server, tempfile.TemporaryFile(prefix=f"bert-squad-server{rank}-")
        server, output = _servers[rank]
        now, fds, cwd = dict(os.environ), [os.dup(1), os.dup(2)], os.getcwd()
        sys.stdout.flush()
        sys.stderr.flush()
        path = [PREPARE, *filter(None, [SESSION_ENV.get("PYTHONPATH")])]
        _set_environ({**SESSION_ENV, "PYTHONPATH": os.pathsep.join(path)})
        os.chdir(ROOT)  # where `import bert_squad` finds the checkout's
        for fd in (1, 2):
            os.dup2(output.fileno(), fd)
        forkserver = multiprocessing.forkserver  # popen_forkserver asks the module, which asks its one server
        default, forkserver.connect_to_new_process = forkserver.connect_to_new_process, server.connect_to_new_process
        try:
            yield
        finally:
            forkserver.connect_to_new_process = default
            for fd, saved in zip((1, 2), fds):
                os.dup2(saved, fd)
                os.close(saved)
            os.chdir(cwd)
            _set_environ(now)


def _set_environ(env: dict) -> None:
    """The process's environment made `env`, also where libraries set a variable in C alone, which os.environ does
    not see (readline: LINES, COLUMNS) and a process started from here would inherit."""
    _libc.clearenv()
    os.environ.clear()
    os.environ.update(env)


def cuda_untouched(rank: int) -> bool:
    """Whether server `rank` (started here if it has not) left CUDA alone: a process forked from it finds torch's
    CUDA not initialised, and not poisoned by the fork (where using it would raise "Cannot re-initialize CUDA
    in forked subprocess")."""
    import_output(rank)
    with _forking_by(rank):
        probe = _context.Process(target=_exit_by_cuda_state)
        probe.start()
    probe.join()
    return probe.exitcode == 0


def _exit_by_cuda_state() -> None:
    import torch  # the server's, imported already

    sys.exit(int(torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork()))


def server_pid(rank: int) -> int:
    """The process id of server `rank` (started)."""
    return _servers[rank][0]._forkserver_pid


class Forked:
    """A forked run, with what the tests use of subprocess.Popen: pid, poll, wait, returncode, send_signal.
    Not a child of this process but of its server, which reports its exit."""

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


def _run_cli(args: list, env: dict, stdout: str, stderr: str, umask: "int | None") -> None:
    """In the forked child: become the process `python *args` would be, run it, and end as the interpreter ends
    it: the exit code of a SystemExit as the interpreter reads it, a traceback from the run's own frames and 1
    for any other exception, then the interpreter's finalization (Py_Exit: threads joined, atexit handlers,
    streams flushed, every object freed, then C's exit with its handlers). An uncaught KeyboardInterrupt ends
    it by SIGINT, as the interpreter does, but after the threads and atexit handlers alone."""
    os.setsid()  # a process group of its own, which the tests signal and kill as a whole
    if umask is not None:
        os.umask(umask)
    for fd, path in ((1, stdout), (2, stderr)):  # the server's sys.stdout and sys.stderr write here
        opened = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(opened, fd)
        os.close(opened)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    module = args[0] == "-m"
    # What the interpreter sets: argv[0] the module's file or the script, sys.path the server's own (not the
    # test session's, which multiprocessing gave the child) with the working directory or the script's folder
    # first.
    sys.argv = [str(ROOT / "bert_squad" / "__main__.py"), *args[2:]] if module else list(args)
    sys.path[:] = [str(ROOT if module else Path(args[0]).parent), *sys.modules["preload_prepare"].SYS_PATH[1:]]
    code = 0
    try:
        # What the interpreter runs, in __main__ (whose objects its finalization frees first), so that a
        # traceback shows the frames a fresh one shows after this one.
        if module:
            runpy._run_module_as_main(args[1], alter_argv=False)  # type: ignore[attr-defined]
        else:
            main = sys.modules["__main__"].__dict__
            main.update(__name__="__main__", __file__=args[0], __cached__=None, __spec__=None, __package__=None)
            exec(compile(Path(args[0]).read_bytes(), args[0], "exec"), main)
    except SystemExit as e:  # as the interpreter reads it: None is 0, a number the code, anything else printed
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # not this function's frame
        code = 1
        if isinstance(e, KeyboardInterrupt):
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    ctypes.pythonapi.Py_Exit(ctypes.c_int(code))

"""Files on a file system that many ranks share: what one rank writes or probes must not be another's."""

import io
import os
import re
import shutil
import subprocess
import sys
import time
import tokenize

import pytest
from helpers import PYTHON, ROOT

from bert_squad.errors import UserError
from bert_squad.files import scratch, umask, umask_mode, undone_if_refused, write_text_atomic

# The arguments of the scripts below: where they say their PID, the file whose existence tells them to go, then
# their own (`args`).
ARGS = r"""
import os, sys, time
from pathlib import Path
go, said, args = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
"""
# Once prepared, a script says its PID, then waits until it is told to go.
TOGETHER = r"""
said.write_text(str(os.getpid()))
deadline = time.monotonic() + 120
while not go.exists():  # all start together
    assert time.monotonic() < deadline, "never told to go"
    time.sleep(0.001)
"""
# Probes the folder args[0] args[1] times.
PROBER = r"""
from bert_squad.files import probe_write
for _ in range(int(args[1])):
    probe_write(args[0])
"""
# Loads the tokenizer args[0] and the questions args[1] (before it is told to go) ...
LOADER = r"""
from bert_squad.config import WindowConfig
from bert_squad.data import read_squad
from bert_squad.features import build_features
from bert_squad.model import load_tokenizer
tokenizer, examples = load_tokenizer(args[0]), read_squad(args[1])
"""
# ... then builds their training features into the cache args[2] under each window length of args[3:].
BUILDER = r"""
for n in args[3:]:
    build_features(examples, tokenizer, WindowConfig(int(n), 32, 24), args[2], True, workers=1)
"""


def same_pid_at_once(tmp_path, prepare, script, *args):
    """Two processes of `prepare` then `script` (with `args`), each PID 1 of a PID namespace of its own, as ranks
    on two nodes booted alike or in two containers are: `script` run by both at the same moment. Their outputs
    ((stdout, stderr) each), once both exited 0 with PID 1."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare (util-linux; make test installs it as root)")
    go = tmp_path / "go"
    said = [tmp_path / f"pid-{i}" for i in range(2)]
    in_own_pid_namespace = ["unshare", "--user", "--map-root-user", "--pid", "--fork"]
    code = ARGS + prepare + TOGETHER + script
    started = [
        subprocess.Popen(
            [*in_own_pid_namespace, PYTHON, "-c", code, str(go), str(path), *map(str, args)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in said
    ]
    try:
        while not all(path.exists() and path.read_text() for path in said):
            assert all(p.poll() is None for p in started), [p.communicate(timeout=60) for p in started]
            time.sleep(0.01)
        go.touch()
        done = [p.communicate(timeout=300) for p in started]
    finally:
        for p in started:
            p.kill()
    if any("unshare failed" in err for _, err in done):
        pytest.skip(f"no PID namespace here: {done}")
    assert [p.returncode for p in started] == [0, 0], done
    assert [path.read_text() for path in said] == ["1", "1"]  # the same PID
    return done


@pytest.mark.slow
def test_two_processes_of_the_same_pid_probe_one_folder_at_once(tmp_path):
    """Ranks on two nodes booted alike, or in containers with PID namespaces of their own, can have the same PID
    and probe the same shared output dir at the same moment: here two processes, each PID 1 of a PID namespace
    of its own, probe one folder a thousand times each, together. Neither fails, and nothing is left behind."""
    folder = tmp_path / "shared"
    folder.mkdir()
    same_pid_at_once(tmp_path, "", PROBER, folder, 1000)
    assert list(folder.iterdir()) == []


@pytest.mark.slow
def test_two_processes_of_the_same_pid_build_features_into_one_cache_at_once(tiny_model, sample_train, tmp_path):
    """Two jobs of one PID (nodes booted alike, containers) build the same features into one shared cache at the
    same moment, under two window lengths, each a cache file of its own. Both succeed, each cache file holds the
    features built in memory, and no scratch is left behind."""
    from bert_squad.config import WindowConfig
    from bert_squad.data import read_squad
    from bert_squad.features import build_features
    from bert_squad.model import load_tokenizer

    lengths = [96, 128]
    cache = tmp_path / "cache"
    same_pid_at_once(tmp_path, LOADER, BUILDER, tiny_model, sample_train, cache, *lengths)
    built = sorted(os.listdir(cache / "features"))
    assert len(built) == len(lengths) and all(name.endswith(".arrow") for name in built), built
    tokenizer, examples = load_tokenizer(tiny_model), read_squad(sample_train)
    for n in lengths:
        cached = build_features(examples, tokenizer, WindowConfig(n, 32, 24), cache, train=True)
        assert cached.cache_files and cached.cache_files[0]["filename"].startswith(str(cache))  # found, not built
        in_memory = build_features(examples, tokenizer, WindowConfig(n, 32, 24), None, train=True)
        assert cached.to_dict() == in_memory.to_dict(), n
    assert sorted(os.listdir(cache / "features")) == built


def test_scratch_and_what_is_written_through_it_take_the_umask_as_new_files_do(tmp_path):
    """tempfile makes files and folders the owner's alone; what moves out of scratch into a shared output dir
    or cache reads as anything else written there: the mode a plain file or folder gets under the umask."""
    old = os.umask(0o027)
    try:
        (tmp_path / "plain").write_text("x")
        (tmp_path / "plain-dir").mkdir()
        write_text_atomic(tmp_path / "atomic", "x")
        made = [scratch(tmp_path, "file"), scratch(tmp_path, "dir", directory=True)]
    finally:
        os.umask(old)
    mode = {path.name: path.stat().st_mode & 0o777 for path in tmp_path.iterdir()}
    assert mode["atomic"] == mode[made[0].name] == mode["plain"] == 0o640
    assert mode[made[1].name] == mode["plain-dir"] == 0o750
    assert made[0].name.startswith(".file-") and made[1].name.startswith(".dir-")


def test_the_umask_is_read_without_changing_it(tmp_path):
    """Reading the umask (`umask_mode`, for every file moved out of scratch) leaves it as it is: a file another
    thread creates at any moment of the read, here at the return of each call the read makes, gets the umask's
    mode, never 0666. And the value read is the process's umask."""
    modes, old = [], os.umask(0o027)

    def create_a_file(frame, event, arg):  # a profile hook: no call of its own is profiled
        if event == "c_return":
            path = tmp_path / f"made-{len(modes)}"
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o666))
            modes.append(path.stat().st_mode & 0o777)

    try:
        target = scratch(tmp_path, "target")
        sys.setprofile(create_a_file)
        try:
            umask_mode(target)
        finally:
            sys.setprofile(None)
        assert umask() == 0o027 == os.umask(0o027)
    finally:
        os.umask(old)
    assert modes and set(modes) == {0o640}, [oct(m) for m in modes]
    assert target.stat().st_mode & 0o777 == 0o640


# What says that a statement makes a file's name or path.
FILE_NAME = re.compile(r"path|file|dir|tmp|temp|open\(|\.(log|json|txt|pid|lock)\b", re.IGNORECASE)


def pid_file_names(source):
    """The numbers of the lines where a statement of `source` makes a file name with os.getpid(): each
    statement (its logical line, comments left out) that calls getpid and names a path or file."""
    found, words, first = [], [], None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NEWLINE:
            text = " ".join(words)
            if "getpid" in text and FILE_NAME.search(text):
                found.append(first)
            words, first = [], None
        elif token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            words.append(token.string)
            first = first or token.start[0]
    return found


def test_no_file_of_the_package_is_named_by_a_pid():
    """Where processes meet (/tmp, an output dir, the cache), a PID names no process's own file: nodes booted
    alike, and containers with PID namespaces of their own sharing /tmp, run ranks of one PID. Those files are
    `scratch`'s. The package calls getpid in what it prints only, never in a file name: the check finds the
    name the NCCL debug file once had, and none in bert_squad/."""
    once = 'def log_path():\n    return os.path.join(tempfile.gettempdir(), f"bert-squad-nccl-{os.getpid()}.log")\n'
    assert pid_file_names(once) == [2]
    assert pid_file_names('print(f"rank {rank} pid {os.getpid()}")  # not a file\n') == []
    named = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "bert_squad").rglob("*.py"))
        if (lines := pid_file_names(path.read_text()))
    }
    assert named == {}, f"file names made from a PID (use files.scratch): {named}"


def test_what_a_refused_command_made_is_removed_and_nothing_else(tmp_path):
    """`undone_if_refused`: a UserError before `keep` removes what the body made (the folder and the parents it
    made, or the entries new in a folder that was there) and leaves the user's own files; after `keep`, or for any
    other error (a bug, whose files tell what happened), everything stays."""
    new = tmp_path / "runs" / "a"
    with pytest.raises(UserError), undone_if_refused(new):
        new.mkdir(parents=True)
        (new / "deepspeed_config.json").write_text("{}")
        raise UserError("refused")
    assert not (tmp_path / "runs").exists()
    used = tmp_path / "mine"
    (used / "notes").mkdir(parents=True)
    (used / "data.json").write_text("{}")
    with pytest.raises(UserError), undone_if_refused(used):
        (used / "monitor" / "tb").mkdir(parents=True)
        (used / "deepspeed_config.json").write_text("{}")
        (used / "notes" / "kept.txt").write_text("")  # inside a folder of the user's: the folder is theirs
        raise UserError("refused")
    assert sorted(p.name for p in used.iterdir()) == ["data.json", "notes"]
    with pytest.raises(UserError), undone_if_refused(used) as keep:
        (used / "model.safetensors").write_text("")
        keep()
        raise UserError("stopped later")
    with pytest.raises(ZeroDivisionError), undone_if_refused(used):
        (used / "trace.txt").write_text("")
        raise ZeroDivisionError
    assert {"model.safetensors", "trace.txt"} <= {p.name for p in used.iterdir()}

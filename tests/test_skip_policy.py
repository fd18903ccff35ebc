"""The suite's skip policy (conftest.py), run for real in a pytest of its own: in a run that must run everything,
a missing program fails the tests that need it, naming it, while a skip for this host's hardware stays a skip;
and make test's whole suite (tests/run.sh) is such a run unless a partial one is asked for. It holds on a CPU
host and on a GPU host alike: which tier the hardware skips follows helpers.gpu_count()."""

import os
import shutil
from pathlib import Path

import pytest
from helpers import PYTHON, gpu_count, run_in_checkout


def path_without(programs, folder):
    """A PATH of links to every program on this one's but `programs`."""
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        for entry in os.scandir(directory) if os.path.isdir(directory) else ():
            target = folder / entry.name
            if entry.name not in programs and not target.exists() and os.access(entry.path, os.X_OK):
                target.symlink_to(entry.path)
    return str(folder)


def hardware_skipped():
    """(a test this host skips for its hardware, the reason it gives): the `gpu` tier's on a host where torch
    sees no GPU, the `cpu` tier's where it sees one. Either is skipped before its fixtures are built."""
    if gpu_count():
        return "tests/test_train.py::test_one_rank_cpu_training_loss_falls", "assumes a CPU-only host"
    return "tests/test_gpu.py::test_one_gpu_trains_evaluates_and_exports[ds_fp16]", "needs a CUDA or ROCm GPU"


@pytest.mark.slow
def test_without_mpirun_the_mpi_tests_fail_naming_it_and_a_hardware_skip_stays_a_skip(tmp_path):
    """`cpu`+`mpi` tests used to be exempt by their marker; now only the hardware cause is: a missing mpirun
    fails the mpi test on any host, while the hardware tier this host cannot run (`gpu` here without a GPU,
    `cpu` on a GPU host) stays skipped."""
    skipped, reason = hardware_skipped()
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed, so hiding it shows nothing (make test installs Open MPI)")
    env = dict(
        os.environ,
        BERT_SQUAD_REQUIRE_ALL="1",
        PATH=path_without({"mpirun", "mpiexec", "orterun", "oshrun"}, tmp_path / "bin"),
    )
    pytest_run = [PYTHON, "-m", "pytest", "-q", "-rfs", "-p", "no:cacheprovider", MPI_TEST, skipped]
    done = run_in_checkout(*pytest_run, env=env, timeout=300)
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    # Skipped in its set-up, the mpi test is reported as an error there: the run fails all the same.
    assert "1 skipped, 1 error" in out, out[-3000:]
    assert "ERROR at setup of test_ranks_leave_the_process_group_together" in out
    assert "mpirun is not installed" in out
    assert "SKIPPED" in out and reason in out and "this host's hardware: " in out


def suite_with(folder, require_all=None):
    """`tests/run.sh` (make test's whole suite) over the mpi test alone, without mpirun (a set-up, not hardware,
    cause of a skip) and without make (so the compat line installs nothing), in a venv of its own whose
    programs are this one's: (exit code, output). Outside CI; BERT_SQUAD_REQUIRE_ALL as given."""
    venv = folder / "venv"
    (venv / "bin").mkdir(parents=True)
    for program in ("python", "ruff", "mypy"):
        wrapper = venv / "bin" / program
        wrapper.write_text(f'#!/bin/sh\nexec {Path(PYTHON).parent / program} "$@"\n')
        wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BERT_SQUAD_REQUIRE_ALL", "PYTEST_ADDOPTS")}
    env.update(
        VENV=str(venv),
        PATH=path_without({"mpirun", "mpiexec", "orterun", "oshrun", "make"}, folder / "bin"),
        PYTEST_ADDOPTS=f"{MPI_TEST} -k {MPI_TEST.split('::')[1]}",
        **({"BERT_SQUAD_REQUIRE_ALL": require_all} if require_all is not None else {}),
    )
    done = run_in_checkout("tests/run.sh", "all", env=env, timeout=900)
    return done.returncode, done.stdout + done.stderr


MPI_TEST = "tests/test_distributed.py::test_ranks_leave_the_process_group_together"


@pytest.mark.slow
def test_make_test_fails_on_a_skip_unless_asked_for_a_partial_run(tmp_path):
    """make test's whole suite, outside CI, with the mpi test's set-up missing: it fails naming the cause, so a
    person without root cannot pass it by skipping the cluster tiers; asked for a partial run
    (BERT_SQUAD_REQUIRE_ALL=0), the same test skips and the session passes."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed, so hiding it shows nothing (make test installs Open MPI)")
    code, out = suite_with(tmp_path / "whole")
    assert code != 0 and "rest: exit 1," in out, out[-3000:]
    assert "skipped in a run that must run every tier (make test" in out and "mpirun is not installed" in out
    code, out = suite_with(tmp_path / "partial", require_all="0")
    assert "rest: exit 0," in out and "SKIPPED" in out and "mpirun is not installed" in out, out[-3000:]

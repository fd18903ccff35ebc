"""Reading which network NCCL/RCCL came up on (bert_squad/transport.py), on real debug lines:
tests/nccl_debug_lines.txt quotes each case from its source."""

import os
import re
import tempfile

import pytest
from helpers import ROOT, run_bert_squad

from bert_squad import transport

LINES = ROOT / "tests" / "nccl_debug_lines.txt"


def cases():
    """{name: [lines]} from the fixture file."""
    found, name = {}, None
    for line in LINES.read_text().splitlines():
        if line.startswith("## "):
            name = line[3:].split(" | ")[0]
            found[name] = []
        elif name and line.strip() and not line.startswith("#"):
            found[name].append(line)
    return found


EXPECTED = {
    "cscs-alps-plugin-found": dict(network="AWS Libfabric"),
    "cscs-alps-plugin-missing": dict(missing="AWS Libfabric"),
    "aws-ofi-nccl-1.6-cxi": dict(network="AWS Libfabric", provider="cxi", plugin="aws-ofi-nccl 1.6.0"),
    "aws-ofi-nccl-1.19-cxi": dict(provider="cxi", plugin="aws-ofi-nccl 1.19.0"),
    "lumi-aws-ofi-rccl": dict(provider="cxi", plugin="aws-ofi-rccl 1.4.0"),
    "aws-ofi-nccl-1.11-efa": dict(plugin="aws-ofi-nccl 1.11.0-aws"),
    "sockets-nccl-2.19": dict(network="Socket", interfaces="[0]ens7:10.128.0.31<0>"),
    # NCCL 2.4 printed NET/Socket even where IB came up after it: no "Using network", so no guess.
    "sockets-nccl-2.4": dict(interfaces="[0]lo:127.0.0.1<0>"),
}


def test_every_case_is_expected():
    assert sorted(cases()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reading_real_debug_lines(name):
    assert transport.parse(cases()[name]) == transport.Transport(**EXPECTED[name])


@pytest.mark.parametrize(
    "name,ofi,text",
    [
        (
            "aws-ofi-nccl-1.6-cxi",
            True,
            "network AWS Libfabric (the libfabric plugin: aws-ofi-nccl 1.6.0, provider cxi)",
        ),
        ("lumi-aws-ofi-rccl", True, "network OFI (the libfabric plugin: aws-ofi-rccl 1.4.0, provider cxi)"),
        ("sockets-nccl-2.19", False, "network Socket (TCP sockets on [0]ens7:10.128.0.31<0>)"),
        ("cscs-alps-plugin-missing", False, "no network: NCCL did not find network 'AWS Libfabric' (NCCL_NET)"),
        ("sockets-nccl-2.4", False, "an unknown network (no 'Using network' line in NCCL's debug output)"),
    ],
)
def test_what_the_log_says(name, ofi, text):
    found = transport.parse(cases()[name])
    assert found.ofi is ofi and found.describe() == text


def test_a_rank_asks_for_a_debug_file_of_its_own_while_its_group_starts_on_a_gpu():
    """Each ask is a new file of its own in the temporary directory (`files.scratch`'s, named by no PID: two
    ranks of one PID, in containers of their own PID namespace, share /tmp), which its process group reports
    on; on the way out, however the group's start ended, the file is gone and the variables are as they were.
    None on a CPU, none where the user set NCCL_DEBUG."""
    env, other = {"PATH": "/bin", "NCCL_DEBUG_SUBSYS": "ALL"}, {}
    with transport.debug_file(True, env) as path, transport.debug_file(True, other) as second:
        assert env == {"PATH": "/bin", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": path}
        assert os.path.dirname(path) == os.path.dirname(second) == tempfile.gettempdir() and path != second
        assert os.path.isfile(path) and str(os.getpid()) not in os.path.basename(path)
    assert env == {"PATH": "/bin", "NCCL_DEBUG_SUBSYS": "ALL"} and other == {}
    assert not os.path.exists(path) and not os.path.exists(second)
    with pytest.raises(RuntimeError), transport.debug_file(True, env) as path:  # a rendezvous refused, say
        raise RuntimeError("the group did not start")
    assert not os.path.exists(path) and env == {"PATH": "/bin", "NCCL_DEBUG_SUBSYS": "ALL"}
    for on_gpu, mine in ((False, {}), (True, {"NCCL_DEBUG": "WARN"})):
        before = dict(mine)
        with transport.debug_file(on_gpu, mine) as path:
            assert path is None and mine == before


def test_a_refusal_on_a_gpu_node_leaves_no_debug_file(tmp_path):
    """A command refused before any process group starts makes no debug file, where DeepSpeed's accelerator is
    a GPU's (DS_ACCELERATOR=cuda, which DeepSpeed takes on this machine without one): the file is made as a
    group starts, not when the command prepares the process."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {"DS_ACCELERATOR": "cuda", "TMPDIR": str(scratch)}
    r = run_bert_squad("--model", tmp_path / "no-model", "--output-dir", tmp_path / "out", env=env)
    assert r.returncode == 2 and "no-model" in r.stderr, r.stderr[-2000:]
    assert list(scratch.glob(".bert-squad-nccl-*")) == []  # (torch's own caches may be there)


@pytest.mark.parametrize(
    "name,site,warned",
    [("sockets-nccl-2.19", "ofi", True), ("aws-ofi-nccl-1.6-cxi", "ofi", False), ("sockets-nccl-2.19", "", False)],
)
def test_a_fall_back_to_sockets_on_an_ofi_site_is_a_warning(tmp_path, capsys, name, site, warned):
    log = tmp_path / "nccl.log"
    log.write_text("\n".join(cases()[name]) + "\n")
    transport.report(3, log, {transport.SITE_NETWORK_VAR: site})
    out, err = capsys.readouterr()
    assert out == f"rank 3: collectives over {transport.parse(cases()[name]).describe()}\n"
    assert (
        bool(re.match(r"rank 3: warning: this site's collectives should run over its libfabric plugin", err)) is warned
    )


def test_the_job_script_says_which_network_the_site_configures():
    """A site script's network reaches the ranks under the name transport.py reads (slurm/job.sh exports it)."""
    for site in ("daint", "lumi"):
        assert f" {transport.SITE_NETWORK_VAR}=ofi" in (ROOT / "slurm" / f"{site}.sbatch").read_text()
    assert (
        f"export {transport.SITE_NETWORK_VAR}=${{{transport.SITE_NETWORK_VAR}:-}}"
        in (ROOT / "slurm" / "job.sh").read_text()
    )

"""tests/ce_srun.py's reading of the Container Engine's EDF reference, cscs-docs docs/software/container-engine/
edf.md (at commit 80abed1), held to the reference's own examples: the reading is the test's own code, so what the
EDF contract tests (tests/test_edf_contract.py) prove rests on it reading edf.md as edf.md reads."""

import re
from pathlib import Path

import pytest
import tomllib
from ce_srun import Refused, ch_run, expanded, load, problems, unpacked

# The environment the examples name: a user's, on a Daint node.
HOST = {"USER": "amadonna", "SCRATCH": "/capstor/scratch/cscs/amadonna", "VAR_FROM_HOST": "nid001", "PATH": "/usr/bin"}
SCRATCH = HOST["SCRATCH"]
ON = {"enabled": "true"}
# edf.md's examples, section by section ("EDF entries", "EDF tables"): (its heading, the example's TOML, the entry
# as the CE sees it in HOST's environment).
EXAMPLES = [
    ("base_environment", 'base_environment = "common_env"', {"base_environment": "common_env"}),
    (
        "base_environment",
        'base_environment = ["common_env", "ml_pytorch_env1"]',
        {"base_environment": ["common_env", "ml_pytorch_env1"]},
    ),
    ("image", 'image = "library/ubuntu:24.04"', {"image": "library/ubuntu:24.04"}),
    ("image", 'image = "docker.io#library/ubuntu:24.04"', {"image": "docker.io#library/ubuntu:24.04"}),
    ("image", 'image = "nvcr.io#nvidia/pytorch:22.12-py3"', {"image": "nvcr.io#nvidia/pytorch:22.12-py3"}),
    (
        "image",
        'image = "quay.io#madeeks/osu-mb:6.2-mpich4.1-ubuntu22.04-arm64"',
        {"image": "quay.io#madeeks/osu-mb:6.2-mpich4.1-ubuntu22.04-arm64"},
    ),
    ("image", 'image = "/path/to/image.squashfs"', {"image": "/path/to/image.squashfs"}),
    ("workdir", 'workdir = "/home/user/projects"', {"workdir": "/home/user/projects"}),
    ("workdir", 'workdir = "/tmp"', {"workdir": "/tmp"}),
    ("entrypoint", "entrypoint = true", {"entrypoint": True}),
    ("writable", "writable = true", {"writable": True}),
    ("mounts", f'mounts = ["{SCRATCH}:{SCRATCH}"]', {"mounts": [f"{SCRATCH}:{SCRATCH}"]}),
    (
        "mounts",
        'mounts = ["/capstor/scratch/cscs/${USER}:/capstor/scratch/cscs/${USER}"]',
        {"mounts": [f"{SCRATCH}:{SCRATCH}"]},
    ),
    ("mounts", 'mounts = ["${SCRATCH}:${SCRATCH}"]', {"mounts": [f"{SCRATCH}:{SCRATCH}"]}),
    ("mounts", 'mounts = ["${SCRATCH}/data.sqsh:/data:sqsh"]', {"mounts": [f"{SCRATCH}/data.sqsh:/data:sqsh"]}),
    (
        "mounts",
        'mounts = ["${SCRATCH}:${SCRATCH}", "${SCRATCH}/data.sqsh:/data:sqsh"]',
        {"mounts": [f"{SCRATCH}:{SCRATCH}", f"{SCRATCH}/data.sqsh:/data:sqsh"]},
    ),
    ("env", '[env]\nMY_RUN = "production"\nDEBUG = "false"', {"env": {"MY_RUN": "production", "DEBUG": "false"}}),
    (
        "env",
        '[env]\nMY_NODE = "${VAR_FROM_HOST}"\nPATH = "${PATH}:/custom/bin"\nDEBUG = "true"',
        {"env": {"MY_NODE": "nid001", "PATH": "/usr/bin:/custom/bin", "DEBUG": "true"}},
    ),
    (
        "annotations",
        '[annotations]\ncom.hooks.cxi.enabled = "false"',
        {"annotations": {"com": {"hooks": {"cxi": {"enabled": "false"}}}}},
    ),
    (
        "annotations",
        '[annotations.com.hooks.ssh]\nauthorize_ssh_key = "/capstor/scratch/cscs/${USER}/tests/edf/authorized_keys"\n'
        'enabled = "true"',
        {
            "annotations": {
                "com": {
                    "hooks": {"ssh": {"authorize_ssh_key": f"{SCRATCH}/tests/edf/authorized_keys", "enabled": "true"}}
                }
            }
        },
    ),
    (
        "annotations",
        '[annotations]\ncom.hooks.ssh.authorize_ssh_key = "/path/to/authorized_keys"\ncom.hooks.ssh.enabled = "true"',
        {
            "annotations": {
                "com": {"hooks": {"ssh": {"authorize_ssh_key": "/path/to/authorized_keys", "enabled": "true"}}}
            }
        },
    ),
]


@pytest.mark.parametrize("heading, text, seen", EXAMPLES, ids=[f"{h}-{i}" for i, (h, _, _) in enumerate(EXAMPLES)])
def test_the_references_own_examples_read_as_it_says(heading, text, seen):
    """Each example of edf.md's sections on the EDF's entries and tables is an EDF the reading takes (the
    reference's entries, each of its type) and expands as the reference says (${VAR} from the environment)."""
    doc = tomllib.loads(text)
    assert list(doc) == [heading]
    assert problems(doc) == []
    assert expanded(doc, HOST) == seen


def test_what_the_stand_in_cannot_carry_of_the_examples_is_refused_by_name(tmp_path):
    """Three of those examples the stand-in cannot carry into ch-run, and refuses in one line rather than drop:
    EDF inheritance (base_environment), an image from a registry, and a SquashFS mount (the `sqsh` flag)."""
    inherits = tmp_path / "inherits.toml"
    inherits.write_text('base_environment = "common_env"\n')
    with pytest.raises(Refused, match=r"^base_environment: EDF inheritance is not carried by the stand-in$"):
        load(str(inherits), HOST)
    with pytest.raises(Refused, match="a registry reference needs a registry"):
        unpacked("nvcr.io#nvidia/pytorch:22.12-py3", tmp_path)
    with pytest.raises(Refused, match=re.escape("flags (sqsh) have no equivalent in ch-run")):
        ch_run({"mounts": [f"{SCRATCH}/data.sqsh:/data:sqsh"]}, tmp_path)
    assert not Path("/data").exists()


def test_edf_problems_name_what_the_reference_does_not_have():
    """What no EDF of the reference has (it shows none such): an unknown entry, an entry or value of another type,
    a mount without a destination, each named in a line of its own."""
    doc = {
        "image": 3,
        "mount": [],
        "mounts": ["/a"],
        "env": {"A": 1},
        "annotations": {"x": {"y": True}},
        "writable": True,
    }
    assert problems(doc) == [
        "image: a int, the reference says str",
        "mount: not an EDF entry (the reference has base_environment, image, "
        "workdir, entrypoint, writable, mounts, env, annotations)",
        "mounts[0]: '/a' is not SOURCE:DESTINATION[:FLAGS]",
        "env.A: values are strings in the reference, not int",
        "annotations.x.y: values are strings in the reference, not bool",
    ]


def test_edf_expansion_follows_the_reference():
    """edf.md, "Environment variable expansion": ${VAR} from the environment, ${VAR:-} empty where undefined,
    $${VAR} the literal text, and any other undefined variable an error naming it (${B:-x}, a default other
    than empty, is the shell's form, which the reference does not mention: the reading takes it as the shell)."""
    doc = {"mounts": ["${A}:/d"], "env": {"K": "$${A}", "L": "${B:-}", "M": "${B:-x}-${A}"}, "writable": True}
    assert expanded(doc, {"A": "a"}) == {
        "mounts": ["a:/d"],
        "env": {"K": "${A}", "L": "", "M": "x-a"},
        "writable": True,
    }
    with pytest.raises(Refused, match=r"^\$\{B\} is not defined"):
        expanded("${B}", {"A": "a"})


def test_each_edf_key_becomes_a_ch_run_option(tmp_path, monkeypatch):
    """tests/ce_srun.py, the Container Engine's stand-in: the EDF's mounts as binds (their destinations made in
    the step's copy of the image), workdir, a read-only image, the image's environment and then the EDF's (an
    empty value unsets), the image's entrypoint (Enroot's /etc/rc) before the command."""
    monkeypatch.delenv("CE_SRUN_MOUNTS", raising=False)
    rootfs, data = tmp_path / "rootfs", tmp_path / "data"
    (rootfs / "etc").mkdir(parents=True)
    data.mkdir()
    (rootfs / "etc" / "environment").write_text('X=image\nexport Y="image"\n# not a variable\n')
    (rootfs / "etc" / "rc").write_text('exec "$@"\n')
    edf = {
        "mounts": [f"{data}:/data/in", f"{data}:/tmp/in"],
        "workdir": "/data",
        "writable": False,
        "entrypoint": True,
        "env": {"Y": "edf", "Z": ""},
        "annotations": {"com.hooks.cxi.enabled": "false"},
    }
    assert ch_run(edf, rootfs) == [
        "ch-run",
        "--private-tmp",
        f"--bind={data}:/data/in",
        f"--bind={data}:/tmp/in",
        "--cd=/data",
        "--env-no-expand",
        "--set-env=X=image",
        "--set-env=Y=image",
        "--set-env=Y=edf",
        "--unset-env=Z",
        str(rootfs),
        "--",
        "/bin/sh",
        "/etc/rc",
    ]
    assert (rootfs / "data" / "in").is_dir() and not (rootfs / "tmp").exists()  # /tmp: the container's own
    assert (
        ch_run({"entrypoint": False}, rootfs)[:2] == ["ch-run", "--private-tmp"] and ch_run({}, rootfs)[2] == "--write"
    )
    (rootfs / "opt").symlink_to("/")
    for mount, why in (
        (f"{data}:/d:ro", "flags (ro) have no equivalent in ch-run"),
        (f"{data}:/opt/x", "/opt is a symlink"),
        (f"{tmp_path}/absent:/x", "absent does not exist"),
    ):
        with pytest.raises(Refused, match=re.escape(why)):
            ch_run({"mounts": [mount]}, rootfs)
    assert not Path("/x").exists()

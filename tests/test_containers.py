"""Container recipes: the Dockerfile (BASE_IMAGE picks the CUDA or ROCm base) parses and installs this package
against the base's torch, and the documented base images and image names agree with the recipes and the site
settings. (Images are not built here.)"""

import re
import shlex
import subprocess
import sys

from helpers import ROOT

CONTAINERS = ROOT / "containers"
DOCKERFILE = CONTAINERS / "Dockerfile"
INSTRUCTIONS = {"FROM", "RUN", "ENV", "COPY", "ARG", "WORKDIR", "LABEL", "ENTRYPOINT", "CMD", "USER", "SHELL"}


def instructions(path):
    """(INSTRUCTION, arguments) pairs, with comments dropped and `\\` continuations joined like Docker does."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        full, pending = pending + line, ""
        word, _, args = full.strip().partition(" ")
        out.append((word, args.strip()))
    assert not pending, f"{path.name}: dangling line continuation"
    return out


def documented_bases():
    """The documented builds, from the Dockerfile's header: {"cuda": base image, "rocm": base image}."""
    found = dict(
        (tag, base)
        for base, tag in re.findall(
            r"^#\s+docker build -f containers/Dockerfile --build-arg BASE_IMAGE=(\S+) -t bert-squad:(\w+) \.$",
            DOCKERFILE.read_text(),
            re.M,
        )
    )
    assert set(found) == {"cuda", "rocm"}, found
    return found


def docs_text():
    return [(CONTAINERS / "README.md").read_text(), (ROOT / "docs" / "clusters.md").read_text()]


def test_dockerfile_parses_and_installs_the_package_without_torch():
    steps = instructions(DOCKERFILE)
    words = [w for w, _ in steps]
    assert set(words) <= INSTRUCTIONS, words
    assert words[:2] == ["ARG", "FROM"] and words.count("FROM") == 1
    # `$BASE_IMAGE`, not `${BASE_IMAGE}`: Charliecloud 0.31's ch-image cannot parse braces in FROM.
    assert steps[1][1] == "$BASE_IMAGE" and steps[0][1] == f"BASE_IMAGE={documented_bases()['cuda']}"
    copied = " ".join(a for w, a in steps if w == "COPY")
    for needed in ("setup.cfg", "pyproject.toml", "bert_squad", "configs"):
        assert needed in copied, f"{needed} is not copied into the image"
    runs = [a for w, a in steps if w == "RUN"]
    assert any("pip install --no-deps /opt/bert_squad" in r for r in runs)
    for run in runs:
        for command in re.split(r"&&|;", run):
            tokens = shlex.split(command.replace("\\n", " "), posix=True) if "pip" in command else []
            if tokens[:2] in (["pip", "install"], ["python", "-m"]):
                assert not any(re.match(r"torch($|[<>=!~\[])", t) for t in tokens), command
    envs = " ".join(a for w, a in steps if w == "ENV")
    assert "PIP_CONSTRAINT=/etc/bert-squad-constraints.txt" in envs and "HF_HUB_OFFLINE=1" in envs


def test_install_steps_run_against_this_checkout(tmp_path):
    """The torch pin and the dependency list the Dockerfile computes, run here with this environment."""
    runs = [a for w, a in instructions(DOCKERFILE) if w == "RUN"]
    pin_step = next(r for r in runs if "bert-squad-constraints.txt" in r)
    pin = tmp_path / "constraints.txt"
    subprocess.run(
        ["sh", "-c", pin_step.replace("/etc/bert-squad-constraints.txt", str(pin)).replace("/opt/bert_squad/", "")],
        env={"PATH": f"{sys.executable.rsplit('/', 1)[0]}:/usr/bin:/bin"},
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    from importlib.metadata import version

    assert pin.read_text().splitlines()[-2:] == [f"torch=={version('torch')}", f"deepspeed=={version('deepspeed')}"]
    deps_step = next(r for r in runs if "requires('bert_squad')" in r)
    listing = re.search(r'(python -c ".*?") +>', deps_step).group(1)
    deps = subprocess.run(
        ["sh", "-c", listing.replace("python", sys.executable, 1)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    names = {re.match(r"[\w.-]+", d).group(0).lower() for d in deps}
    assert "torch" not in names and {"deepspeed", "transformers", "datasets"} <= names
    assert not names & {"pytest", "hypothesis", "matplotlib"}  # extras stay out of the image


def test_base_images_match_the_docs():
    bases = documented_bases()
    assert bases["cuda"].startswith("nvcr.io/nvidia/pytorch:") and bases["rocm"].startswith("rocm/pytorch:")
    for text in docs_text():
        for base in bases.values():
            assert base in text, f"{base} is not what the docs say"
        for tag in re.findall(r"(?:nvcr\.io/nvidia/pytorch|rocm/pytorch):[\w.-]+", text):
            assert tag in bases.values(), f"the docs name {tag}, the Dockerfile documents {sorted(bases.values())}"
    # Both bases ship a Python the package supports: the ROCm tag's, and what the docs say of each.
    setup = (ROOT / "setup.cfg").read_text()
    minimum = tuple(map(int, re.search(r"python_requires = >=(\d+)\.(\d+)", setup).groups()))
    assert tuple(map(int, re.search(r"py(\d)\.(\d+)", bases["rocm"]).groups())) >= minimum
    rows = re.findall(r"^\| `Dockerfile` → `bert-squad:(?:cuda|rocm)` \|.*$", docs_text()[0], re.M)
    said = [tuple(map(int, v)) for row in rows for v in re.findall(r"Python (\d+)\.(\d+)", row)]
    assert len(said) == 2 and all(py >= minimum for py in said), rows


def test_apptainer_definition():
    text = (CONTAINERS / "bert-squad.def").read_text()
    header = dict(re.findall(r"^(Bootstrap|From):\s*(.+)$", text, re.M))
    assert header == {"Bootstrap": "docker-daemon", "From": "{{ IMAGE }}"}
    sections = re.findall(r"^%(\w+)", text, re.M)
    assert {"arguments", "environment", "runscript", "test"} <= set(sections)
    default = re.search(r"^\s+IMAGE=(\S+)$", text, re.M).group(1)
    assert default == "bert-squad:rocm" and "-t bert-squad:rocm" in (CONTAINERS / "README.md").read_text()
    assert 'exec python -m bert_squad "$@"' in text


def test_site_images_are_the_documented_ones():
    daint, lumi = ((ROOT / "slurm" / f"{site}.sbatch").read_text() for site in ("daint", "lumi"))
    readme = (CONTAINERS / "README.md").read_text()
    # Daint: the CE image that `enroot import` writes where the job looks ($BERT_SQUAD_WORK = $SCRATCH/bert-squad).
    assert "BERT_SQUAD_IMAGE=${BERT_SQUAD_IMAGE:-$BERT_SQUAD_WORK/bert-squad-alps.sqsh}" in daint
    assert "enroot import -x mount -o $SCRATCH/bert-squad/bert-squad-alps.sqsh podman://bert-squad:alps" in readme
    # ... built on CSCS's Alps Extended Image, as the Dockerfile's header documents it.
    alps = re.search(
        r"^#\s+podman build -f containers/Dockerfile --build-arg BASE_IMAGE=(\S+) -t bert-squad:alps \.$",
        DOCKERFILE.read_text(),
        re.M,
    ).group(1)
    assert alps.startswith("jfrog.svc.cscs.ch/docker-group-csstaff/alps-images/ngc-pytorch:") and alps in readme
    # `sarus load X.tar bert-squad:cuda` lists as load/library/bert-squad:cuda.
    assert re.search(r"sarus load \S+ bert-squad:cuda", readme) and "load/library/bert-squad:cuda" in readme
    # LUMI: LUMI AI Factory's image, the package in a venv squashed to where the site's bind expects it.
    image = re.search(r"BERT_SQUAD_IMAGE:-(/appl/local/laifs/containers/\S+\.sif)\}", lumi).group(1)
    assert image in readme
    assert "-B $BERT_SQUAD_WORK/bert-squad-env.sqsh:/user-software:image-src=/}" in lumi
    assert "mksquashfs bert-squad-env $BERT_SQUAD_WORK/bert-squad-env.sqsh" in readme
    assert "build bert-squad-rocm.sif" in readme.replace("--build-arg IMAGE=bert-squad:rocm ", "")


def test_a_base_below_a_floor_is_refused_in_one_line_before_any_install(tmp_path):
    """tools/base_pins.py, the first step of every install on a base (the Dockerfile, a uenv's or LUMI's venv): the
    base's torch and DeepSpeed as pins, or one line naming the release and the floor it is below, exit 1."""
    from importlib.metadata import version

    ours = subprocess.run(
        [sys.executable, "tools/base_pins.py"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    assert ours.stdout.splitlines() == [f"torch=={version('torch')}", f"deepspeed=={version('deepspeed')}"]
    cfg = tmp_path / "setup.cfg"
    cfg.write_text("[options]\ninstall_requires =\n    torch>=2.0\n    deepspeed>=99.1.0\n")
    low = subprocess.run(
        [sys.executable, "tools/base_pins.py", cfg], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (low.returncode, low.stdout) == (1, "") and low.stderr == (
        f"the base's deepspeed {version('deepspeed')} is below the floor deepspeed>=99.1.0 ({cfg}): take a newer "
        "base (containers/README.md)\n"
    )


def test_a_base_meets_a_floor_as_pip_reads_the_requirement():
    """base_pins' comparison against packaging's, the oracle pip uses: NGC's builds are pre-releases with a local
    label (2.8.0a0+5228986c39), which setup.cfg's torch>=2.8.0a0 admits and torch>=2.8.0a0 of 2.9 too."""
    from packaging.specifiers import SpecifierSet

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from base_pins import release
    finally:
        sys.path.remove(str(ROOT / "tools"))
    have = ["2.7.1", "2.8.0a0+5228986c39", "2.8.0", "2.8.0+cu128", "2.10.0a0+b4e4ee81d3", "2.13.0+cpu", "0.19.2"]
    for floor in ("2.8.0", "2.10.0", "0.19.2", "0.19.8"):
        spec = SpecifierSet(f">={floor}a0", prereleases=True)
        assert [release(v) >= release(floor) for v in have] == [v in spec for v in have], floor

#!/usr/bin/env python3
"""Stand-in for `sarus` and `singularity`/`apptainer` (installed under those names by the tests).

Sarus and Singularity cannot be installed on the test machines. This records each call as one JSON
line in $STANDIN_LOG (name, argv, the rank variables it saw), answers `sarus images` with
$STANDIN_SARUS_IMAGE, and runs the command after the image on the host, as the real runtimes would
inside the container. Options are split off with the same arities the real CLIs use, so a wrong
option shape shows up as a wrong image or command in the record.
"""

import json
import os
import sys

# The variables the ranks need from the batch shell and the launcher. The stand-in records them as it
# sees them; tests/test_charliecloud.py checks the same lists inside a real (Charliecloud) container.
RANK_ENV = {
    "job": (
        "SLURM_JOB_ID",
        "SLURM_JOB_NODELIST",
        "SLURM_NTASKS",
        "BERT_SQUAD_REPO",
        "BERT_SQUAD_SCRATCH",
        "BERT_SQUAD_IMAGE",
        "BERT_SQUAD_WORK",
        "BERT_SQUAD_CACHE",
        "BERT_SQUAD_GPU_ENV",
        "BERT_SQUAD_NETWORK",
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "OMP_NUM_THREADS",
        "PYTHONUNBUFFERED",
        "PATH",
    ),
    "mpirun": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    "srun": ("SLURM_PROCID", "SLURM_LOCALID"),
}
RECORDED_ENV = tuple(name for names in RANK_ENV.values() for name in names)

# Options that take a separate value (`-B src:dst`); `--opt=value` forms need no entry.
VALUED = {
    "sarus": {
        "-e",
        "--env",
        "--entrypoint",
        "-w",
        "--workdir",
        "--mount",
        "--pid",
        "--device",
        "--annotation",
        "--mpi-type",
        "-n",
        "--name",
    },
    "singularity": {
        "-B",
        "--bind",
        "--pwd",
        "--env",
        "--mount",
        "-H",
        "--home",
        "-W",
        "--workdir",
        "--env-file",
        "-o",
        "--overlay",
    },
}


def main(argv):
    name = os.path.basename(argv[0])
    kind = "sarus" if name == "sarus" else "singularity"
    args = argv[1:]
    if kind == "sarus" and args[:1] == ["images"]:
        print("REPOSITORY   TAG   IMAGE ID   CREATED   SIZE   SERVER")
        repo, _, tag = os.environ["STANDIN_SARUS_IMAGE"].rpartition(":")
        print(f"{repo}   {tag}   0123456789ab   2024-01-01T00:00:00   9.9GB   load")
        return 0
    sub, rest = args[0], args[1:]
    options = []
    while rest and rest[0].startswith("-"):
        opt = rest.pop(0)
        options.append(opt)
        if opt in VALUED[kind] and rest:
            options.append(rest.pop(0))
    image, command = rest[0], rest[1:]
    record = {
        "name": name,
        "sub": sub,
        "options": options,
        "image": image,
        "command": command,
        "env": {k: os.environ.get(k) for k in RECORDED_ENV},
    }
    with open(os.environ["STANDIN_LOG"], "a") as log:
        log.write(json.dumps(record) + "\n")
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

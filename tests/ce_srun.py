"""`srun` as the CSCS Container Engine extends it: `--environment=EDF` runs the task in the environment that
EDF defines. The CE is Enroot + Pyxis plus EDF parsing and CSCS's hooks, and exists only at CSCS; here the
EDF is checked against the reference's keys and types (bert_squad.cluster.edf), translated key by key into
the Pyxis flags that mean the same (tests/pyxis.py), and the real srun runs them, so a Daint job runs in a
real container on the test Slurm. tests/test_pyxis.py installs it as `srun` (exec'd: the launcher's pid and
signals are srun's); REAL_SRUN names the real one.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import tomllib  # noqa: E402
from pyxis import edf_to_pyxis, merged  # noqa: E402

from bert_squad.cluster import edf  # noqa: E402


def main(argv):
    args = []
    for arg in argv:
        if not arg.startswith("--environment="):
            args.append(arg)
            continue
        path = arg.split("=", 1)[1]
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        wrong = edf.problems(doc)
        if wrong:
            print(f"ce_srun: {path}: {'; '.join(wrong)}", file=sys.stderr)
            return 2
        flags, env = edf_to_pyxis(doc)
        os.environ.update(env)
        args += flags
    os.execv(os.environ["REAL_SRUN"], ["srun", *merged(args)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

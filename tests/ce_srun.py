"""`srun` as the CSCS Container Engine extends it: `--environment=EDF` runs the task in the environment that
EDF defines. The CE is Enroot + Pyxis plus EDF parsing and CSCS's hooks, and exists only at CSCS; here the
EDF is checked against the reference's keys and types (`problems`), its ${VAR}s expanded from the task's
environment as the CE does, translated key by key into the Pyxis flags that mean the same (tests/pyxis.py),
and the real srun runs them, so a Daint job runs in a real container on the test Slurm. tests/test_pyxis.py
installs it as `srun` (exec'd: the launcher's pid and signals are srun's); REAL_SRUN names the real one.
SLURM_NETWORK (CSCS's `disable_rdzv_get` for Alps Extended Images) is Cray's: the test Slurm has no such network.

The reference is cscs-docs docs/software/container-engine/edf.md (EDF entries and tables, TOML).
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import tomllib  # noqa: E402
from pyxis import edf_to_pyxis, merged  # noqa: E402

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


def _leaves(table, prefix=""):
    """(dotted key, value) of a table, nested tables flattened (`[annotations.com.hooks]` = dotted keys)."""
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def problems(doc):
    """What in a parsed EDF is not in the reference, or has the wrong type: one line each."""
    found = []
    for key, value in doc.items():
        if key not in KEYS:
            found.append(f"{key}: not an EDF entry (the reference has {', '.join(KEYS)})")
        elif not isinstance(value, KEYS[key]):
            found.append(f"{key}: a {type(value).__name__}, the reference says {' or '.join(t.__name__ for t in KEYS[key])}")
    for i, mount in enumerate(doc.get("mounts", [])):
        if not isinstance(mount, str) or not re.fullmatch(r"[^:]+:[^:]+(:[^:]+)?", mount):
            found.append(f"mounts[{i}]: {mount!r} is not SOURCE:DESTINATION[:FLAGS]")
    for table in ("env", "annotations"):
        for key, value in _leaves(doc.get(table, {}) if isinstance(doc.get(table), dict) else {}):
            if not isinstance(value, str):
                found.append(f"{table}.{key}: values are strings in the reference, not {type(value).__name__}")
    return found


def expanded(value, env):
    """`value` with each ${NAME} replaced from `env` (edf.md: "use curly braces"), in strings, lists and tables."""
    if isinstance(value, dict):
        return {k: expanded(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [expanded(v, env) for v in value]
    if isinstance(value, str):
        return re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], value)
    return value


def main(argv):
    args = []
    for arg in argv:
        if not arg.startswith("--environment="):
            args.append(arg)
            continue
        path = arg.split("=", 1)[1]
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        wrong = problems(doc)
        if wrong:
            print(f"ce_srun: {path}: {'; '.join(wrong)}", file=sys.stderr)
            return 2
        flags, env = edf_to_pyxis(expanded(doc, os.environ))
        os.environ.update(env)
        args += flags
    os.environ.pop("SLURM_NETWORK", None)
    os.execv(os.environ["REAL_SRUN"], ["srun", *merged(args)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

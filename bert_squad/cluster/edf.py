"""The CSCS Container Engine's Environment Definition File (EDF): the keys its reference defines, and the
site's fixed part of the EDF a job writes.

The reference is cscs-docs `docs/software/container-engine/edf.md` (EDF entries and tables, TOML). The job
script writes the EDF itself at start-up (the image, mounts and workdir are only known there), from the
TOML text `site_tables` renders here; tests parse it and hold it to `problems`.
"""

import json
import re

from bert_squad.errors import UserError

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
# What the site data may give: the job writes the rest, the [env] table included (a site's variables go in
# its `env`, which the batch shell exports and the container inherits).
SITE_TABLES = ("annotations",)
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


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


def site_tables(edf, where):
    """TOML text of a site's EDF tables (`edf` in sites.json); `where` names it in the error."""
    unknown = sorted(set(edf) - set(SITE_TABLES))
    wrong = problems(edf)
    if unknown or wrong:
        raise UserError(f"{where}: " + "; ".join([f"{k}: the job writes it, not the site data" for k in unknown] + wrong))
    lines = []
    for table in SITE_TABLES:
        if edf.get(table):
            lines.append(f"[{table}]")
            for key, value in _leaves(edf[table]):
                if not all(BARE_KEY.fullmatch(part) for part in key.split(".")):
                    raise UserError(f"{where}: {table}.{key}: use letters, digits, '_' and '-' between the dots")
                lines.append(f"{key} = {json.dumps(value)}")  # a JSON string is a TOML basic string
    return "\n".join(lines)

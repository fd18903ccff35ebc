"""Atomic writes: a reader (or a crash) sees the old file or the new one, never half of one."""

import json
import os
from pathlib import Path


def write_text_atomic(path, text):
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(path, obj, indent=2):
    write_text_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")

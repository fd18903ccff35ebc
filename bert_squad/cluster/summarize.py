"""`bert-squad summarize runs/<sweep>`: one table for a sweep, mean and spread over seeds.

Reads the sweep's manifest (`sweep.json`, written by `bert-squad sweep`) and each run's
`train_metrics.json` / `eval_metrics.json`. Runs that failed or have not finished are listed as such,
never silently dropped. Writes summary.csv, summary.md and f1_by_combination.png beside the manifest.
"""

import csv
import io
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from bert_squad import config, outputs, plots
from bert_squad.errors import UserError
from bert_squad.files import PathLike, read_json, write_text_atomic
from bert_squad.preemption import EXIT_STOPPED

MANIFEST = "sweep.json"
EXIT_CODE_FILE = "exit_code"  # written by the array task after the training returns


def run_status(run_dir: PathLike) -> tuple[str, Optional[dict[str, Any]]]:
    """('finished', metrics) or ('failed'|'stopped'|'not finished', None); a run trained with
    --no-eval is finished too, with no EM/F1 in its metrics."""
    run_dir = Path(run_dir)
    if outputs.finished(run_dir):
        eval_file = run_dir / outputs.EVAL_METRICS
        scores = read_json(eval_file) if eval_file.exists() else {}
        return "finished", {**read_json(run_dir / outputs.TRAIN_METRICS), **scores}
    code_file = run_dir / EXIT_CODE_FILE
    if code_file.exists():
        code = code_file.read_text().strip()
        return ("stopped (checkpointed, resumes)" if code == str(EXIT_STOPPED) else f"failed (exit {code})"), None
    return "not finished", None


def _score(metrics: dict[str, Any], key: str) -> Optional[float]:
    """EM/F1 under either SQuAD version's key names; None for a run without evaluation."""
    names = {"em": ("exact_match", "exact"), "f1": ("f1",)}[key]
    return next((metrics[n] for n in names if n in metrics), None)


def load_manifest(sweep_dir: PathLike) -> Any:
    path = Path(sweep_dir) / MANIFEST
    if not path.exists():
        raise UserError(f"{path}: no sweep manifest here (is {sweep_dir} the directory of a `bert-squad sweep`?)")
    return read_json(path, what="a sweep manifest")


def collect(sweep_dir: PathLike) -> tuple[Any, list[dict[str, Any]], list[tuple[str, int, str]]]:
    manifest = load_manifest(sweep_dir)
    groups: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    problems: list[tuple[str, int, str]] = []
    for combo in manifest["combinations"]:
        status, metrics = run_status(Path(sweep_dir) / combo["name"])
        if metrics is None:
            problems.append((combo["name"], combo["seed"], status))
            groups.setdefault(combo["group"], [])
        else:
            groups.setdefault(combo["group"], []).append((combo["seed"], metrics))
    rows = []
    for group, runs in groups.items():
        row: dict[str, Any] = {
            "combination": group,
            "seeds": " ".join(str(s) for s, _ in sorted(runs, key=lambda r: r[0])),
            "finished": len(runs),
            "runs": sum(1 for c in manifest["combinations"] if c["group"] == group),
        }
        for key in ("em", "f1"):
            values = [v for v in (_score(m, key) for _, m in runs) if v is not None]
            row.update(
                {
                    f"{key}_mean": statistics.fmean(values) if values else None,
                    f"{key}_std": statistics.stdev(values) if len(values) > 1 else None,  # one seed: no spread
                    f"{key}_min": min(values, default=None),
                    f"{key}_max": max(values, default=None),
                }
            )
        row["samples_per_second"] = statistics.fmean(m["run_samples_per_second"] for _, m in runs) if runs else None
        row["wall_time_s"] = statistics.fmean(m["wall_time_s"] for _, m in runs) if runs else None
        row["f1_values"] = [v for v in (_score(m, "f1") for _, m in runs) if v is not None]
        rows.append(row)
    return manifest, rows, problems


COLUMNS = [
    "combination",
    "seeds",
    "finished",
    "runs",
    "em_mean",
    "em_std",
    "em_min",
    "em_max",
    "f1_mean",
    "f1_std",
    "f1_min",
    "f1_max",
    "samples_per_second",
    "wall_time_s",
]


def fmt(value: Any) -> str:
    return "" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: fmt(r[k]) for k in COLUMNS})
    return buf.getvalue()


def to_markdown(rows: list[dict[str, Any]], problems: list[tuple[str, int, str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in COLUMNS) + " |" for r in rows]
    if problems:
        lines += ["", "Runs without results:", ""] + [
            f"- {name} (seed {seed}): {status}" for name, seed, status in problems
        ]
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> Path:
    """The sweep directory to summarize."""
    p = config.ArgumentParser(prog="bert-squad summarize", description=(__doc__ or "").splitlines()[0])
    p.add_argument("sweep_dir", help="the sweep's directory, which holds its sweep.json")
    return Path(p.parse_args(argv).sweep_dir)


def table_of(title: str, rows: list[dict[str, Any]]) -> Table:
    """The summary as the terminal shows it: a row per combination."""
    table = Table(title=title)
    for col in (
        "combination",
        "seeds",
        "done",
        "EM mean ± std",
        "EM min–max",
        "F1 mean ± std",
        "F1 min–max",
        "samples/s",
        "wall s",
    ):
        table.add_column(col, justify="left" if col in ("combination", "seeds") else "right")

    def pair(a: Optional[float], b: Optional[float], sep: str) -> str:
        """A dash for what no run measured: no value (not finished, or trained with --no-eval), or no spread
        (one seed)."""
        return "-" if a is None else f"{a:.2f}{sep}{'-' if b is None else f'{b:.2f}'}"

    for r in rows:
        speed, wall = r["samples_per_second"], r["wall_time_s"]
        table.add_row(
            r["combination"],
            r["seeds"] or "-",
            f"{r['finished']}/{r['runs']}",
            pair(r["em_mean"], r["em_std"], " ± "),
            pair(r["em_min"], r["em_max"], "–"),
            pair(r["f1_mean"], r["f1_std"], " ± "),
            pair(r["f1_min"], r["f1_max"], "–"),
            "-" if speed is None else f"{speed:.1f}",
            "-" if wall is None else f"{wall:.0f}",
        )
    return table


def run(sweep_dir: Path) -> int:
    manifest, rows, problems = collect(sweep_dir)
    write_text_atomic(sweep_dir / "summary.csv", to_csv(rows))
    write_text_atomic(sweep_dir / "summary.md", to_markdown(rows, problems))
    written = [sweep_dir / "summary.csv", sweep_dir / "summary.md"]
    try:
        plots.f1_by_combination(rows, sweep_dir / "f1_by_combination.png")
        written.append(sweep_dir / "f1_by_combination.png")
    except ImportError:
        print(f"bert-squad summarize: {plots.MISSING.format('plot')}", file=sys.stderr)
    table = table_of(f"sweep {manifest.get('name', sweep_dir.name)}", rows)
    console = Console()
    if not console.is_terminal:  # a file or a pipe: whole columns, as a wide terminal shows them, not rich's 80
        console.width = Measurement.get(console, console.options.update(max_width=sys.maxsize), table).maximum
    console.print(table)
    for name, seed, status in problems:
        console.print(f"[yellow]{name}[/] (seed {seed}): {status}", soft_wrap=True)
    console.print(f"wrote {', '.join(map(str, written))}", soft_wrap=True)
    return 0

"""Tables of results: rich tables for the terminal, JSON and CSV files for scripts.

Importing it loads only rich (the experiments are imported by the functions that need them), so that the
command line can share :func:`key_value_table` without loading the simulator for ``--help``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from mcdla.units import format_seconds

if TYPE_CHECKING:
    from mcdla.report.experiments import Record

__all__ = ["key_value_table", "speedup_table", "sweep_table", "write_records"]


def key_value_table(rows: Sequence[tuple[str, str]]) -> Table:
    """Two left-aligned columns (name, value) without borders: the summary a command prints. The cells are
    plain text (a value such as a file name with ``[...]`` in it is not read as markup)."""
    table = Table.grid(padding=(0, 3))
    table.add_column(no_wrap=True)
    table.add_column()
    for name, value in rows:
        table.add_row(Text(name), Text(value))
    return table


def speedup_table(rows: Sequence[dict[str, Any]], title: str = "MC-DLA vs DC-DLA") -> Table:
    """Per workload and parallelism: the three iteration times, the speedup and the gap to the oracle."""
    from mcdla.report.experiments import mean_speedup

    table = Table(title=title, title_justify="left")
    for col in ("workload", "parallel", "dc-dla", "mc-dla", "oracle", "speedup", "gap to oracle"):
        table.add_column(col, justify="left" if col in ("workload", "parallel") else "right")
    for r in rows:
        times = [format_seconds(r[k]) if r[k] != float("inf") else "infeasible" for k in ("dc-dla_s", "mc-dla_s", "oracle_s")]
        feasible = r["speedup"] is not None
        table.add_row(
            r["workload"],
            r["parallel"],
            *times,
            f"{r['speedup']:.2f}x" if feasible else "-",
            f"{100 * r['gap_to_oracle']:+.1f}%" if feasible else "-",
        )
    for parallel in (*dict.fromkeys(r["parallel"] for r in rows), "all"):
        sub = [r for r in rows if parallel in ("all", r["parallel"])]
        n = sum(r["speedup"] is not None for r in sub)
        table.add_row("[b]geo. mean[/b]", parallel, "", "", "", f"[b]{mean_speedup(sub):.2f}x[/b]", f"{n} feasible")
    return table


def write_records(records: Sequence[Record], json_path: Path, csv_path: Path | None = None) -> None:
    """Write records as JSON ``{"meta", "rows"}`` and optionally a CSV with the same columns, both under the
    results header of :mod:`mcdla.report.meta`."""
    from mcdla.report.meta import results_meta, write_results_csv, write_results_json

    data = [r.to_dict() for r in records]
    meta = results_meta()
    write_results_json(json_path, data, meta)
    if csv_path is not None and data:
        write_results_csv(csv_path, data, list(data[0]), meta)


def sweep_table(records: Sequence[Record]) -> Table:
    """mc-dla's geo-mean speedup over dc-dla: rows are device compute (x V100), columns PCIe generations."""
    from mcdla.report.experiments import sweep_speedups

    speedups = sweep_speedups(records)
    table = Table(title="MC-DLA speedup as compute grows (data-parallel; dc-dla at each PCIe generation)", title_justify="left")
    table.add_column("compute", justify="right")
    for gen in speedups:
        table.add_column(f"PCIe {gen}.0", justify="right")
    scales = sorted({s for by in speedups.values() for s in by})
    for scale in scales:
        table.add_row(f"{scale:g}x", *(f"{speedups[g].get(scale, float('nan')):.2f}x" for g in speedups))
    return table

"""Print the zoo table of ``docs/zoo.md``: ``python -m mcdla.workload.zoo [--precision fp16]``."""

from __future__ import annotations

import argparse

from mcdla.workload.zoo import build, names

__all__ = ["table"]

_GIB = 2**30


def table(precision: str = "fp16") -> str:
    """A Markdown table of every zoo workload at its default batch and full scale."""
    head = (
        "| workload | layers | default batch | params (M) | fwd GFLOP/sample | fwd+bwd GFLOP/sample "
        "| saved MiB/sample | saved GiB @batch | footprint GiB @batch |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = [head]
    for name in names():
        w = build(name, precision=precision)
        element = 4 if precision == "fp32" else 2
        rows.append(
            f"| {name} | {len(w)} | {w.batch} | {w.param_bytes / element / 1e6:.2f} "
            f"| {w.fwd_flops / w.batch / 1e9:.3f} | {(w.fwd_flops + w.bwd_flops) / w.batch / 1e9:.3f} "
            f"| {w.saved_bytes / w.batch / 2**20:.2f} | {w.saved_bytes / _GIB:.2f} | {w.footprint_bytes() / _GIB:.2f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m mcdla.workload.zoo", description=__doc__)
    parser.add_argument("--precision", default="fp16", choices=("fp16", "bf16", "fp32"))
    print(table(parser.parse_args().precision))


if __name__ == "__main__":
    main()

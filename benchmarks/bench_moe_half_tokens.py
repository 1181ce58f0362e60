"""The GEMM curve's token term against the MoE family: each validation family's error as ``half_tokens`` grows.

The routed experts' grouped GEMMs run at the curve's point for their own tokens per local expert
(``mcdla.sim.llm_moe.tokens_per_local_expert``, 2048 x MBS for Qwen3-30B-A3B on EP 8), the dense GEMMs at ``b s
/ cp``; the token term ``t / (t + half_tokens)`` is 0 in every preset. This sweeps it, set on every run's cluster
(as a device-independent figure would be), over every family of ``validate-llm --family all``; the baseline,
measured in the same run, is ``half_tokens`` 0. It is the check behind ``docs/llm.md`` "Megatron-Bridge MoE":
whether the MoE family identifies a token term the dense families tolerate. Run::

    .venv/bin/python -m benchmarks.bench_moe_half_tokens               # run, print and record in RESULTS.md
    .venv/bin/python -m benchmarks.bench_moe_half_tokens --no-record   # print only
"""

from __future__ import annotations

import dataclasses
import statistics

from benchmarks._results import markdown_table, run_table
from mcdla.report.llm_validation import FAMILIES, run_cluster
from mcdla.sim.llm import llm_step
from mcdla.workload.transformer import preset

HALF_TOKENS = (0.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0)
"""Tokens at which a GEMM reaches half the curve's efficiency; 0 (no token dependence) is the baseline."""


def sweep() -> dict[float, dict[str, list[float]]]:
    """Each family's signed relative errors at every ``half_tokens`` of :data:`HALF_TOKENS`."""
    runs = [(run, run_cluster(run, None)) for runs in FAMILIES.values() for run in runs]
    out: dict[float, dict[str, list[float]]] = {}
    for half_tokens in HALF_TOKENS:
        by_family = out[half_tokens] = {}
        for run, cluster in runs:
            curve = dataclasses.replace(cluster.gemm_efficiency, half_tokens=half_tokens)
            step = llm_step(preset(run.model), run.execution, cluster.with_gemm_efficiency(curve),
                            precision=run.precision)
            by_family.setdefault(run.family, []).append(step.iteration_s / run.measured_s - 1.0)
    return out


def _table(result: dict[float, dict[str, list[float]]]) -> str:
    families = list(result[0.0])
    base = {f: statistics.fmean(map(abs, result[0.0][f])) for f in families}
    rows = []
    for half_tokens, by_family in result.items():
        cells = [f"{statistics.fmean(map(abs, by_family[f])):.1%} / {max(map(abs, by_family[f])):.1%}"
                 for f in families]
        moe = statistics.fmean(map(abs, by_family["megatron-bridge-moe"])) / base["megatron-bridge-moe"]
        rows.append((f"{half_tokens:g}", *cells, f"{moe:.2f}x"))
    head = ("half_tokens", *(f"{f} mean / max" for f in families), "MoE mean / baseline")
    return markdown_table(head, rows)


def main(argv: list[str] | None = None) -> None:
    run_table(argv, __doc__, "moe-half-tokens",
              "GEMM token term against the MoE family (half_tokens sweep, every family)",
              ".venv/bin/python -m benchmarks.bench_moe_half_tokens", lambda: _table(sweep()))


if __name__ == "__main__":
    main()

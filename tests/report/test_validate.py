"""``ValidationResult.summary()``: the same tables ``mcdla validate`` prints, as plain text."""

from __future__ import annotations

import re

from mcdla.hardware import PoolLink
from mcdla.report.validate import ValidationResult
from mcdla.units import format_bytes, format_seconds

PREDICTED_S, MEASURED_S = 0.125, 0.1
PREDICTED_SAVED, MEASURED_SAVED = 3 * 2**20, 4 * 2**20


def _result(**changes: object) -> ValidationResult:
    fields = dict(model="mlp", pool="file:/tmp/pool", planner="lp", budget_bytes=2**30, threads=1, layers=5,
                  offloaded_layers=("0", "2"), planned_offload_bytes=2**20, measured_offload_bytes=2**20,
                  offloaded_bytes_by_layer={"0": 2**19, "2": 2**19}, predicted_step_s=PREDICTED_S,
                  engine_step_s=0.12, copy_cost_s_per_byte=1e-10, measured_step_s=MEASURED_S, plain_step_s=0.09,
                  profiled_step_s=0.095, measured_step_samples_s=(MEASURED_S,),
                  predicted_peak_saved_bytes=PREDICTED_SAVED, measured_peak_saved_bytes=MEASURED_SAVED,
                  saved_bytes=2**22, unpack_wait_s=0.002, pack_wait_s=0.001, predicted_wait_s=0.004,
                  link=PoolLink(offload_bytes_per_s=2e9, prefetch_bytes_per_s=3e9, source="probe"),
                  notes=("a [bracketed] note",))
    fields.update(changes)
    return ValidationResult(**fields)


def test_summary_puts_predicted_measured_and_error_in_separate_cells() -> None:
    """Step time and peak saved bytes are table rows: predicted, measured, error (by hand) in their own cells."""
    text = _result().summary()
    for row, predicted, measured, error in (
            ("step time", format_seconds(PREDICTED_S), format_seconds(MEASURED_S), "+25.0%"),
            ("peak saved bytes", format_bytes(PREDICTED_SAVED), format_bytes(MEASURED_SAVED), "-25.0%")):
        pattern = rf"│ {row}\s+│\s+{re.escape(predicted)} │\s+{re.escape(measured)} │\s+{re.escape(error)} │"
        assert re.search(pattern, text), row


def test_summary_keeps_long_values_and_markup_whole() -> None:
    """A long note stays on one line, and text in brackets is printed as written (not read as markup)."""
    note = "x" * 300
    text = _result(notes=(note, "a [bracketed] note")).summary()
    assert any(line.rstrip().endswith(note) for line in text.splitlines())
    assert "a [bracketed] note" in text and "\x1b[" not in text

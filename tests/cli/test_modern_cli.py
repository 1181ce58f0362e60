"""``mcdla reproduce --modern``, run in-process on a reduced grid."""

import json

from mcdla.report import modern

ONE = (modern.Scenario(model="gpt3-175b", global_batch=1536, gpus=1152),)


def test_reproduce_modern_cli(tmp_path, run_cli, monkeypatch) -> None:
    real = modern.run_modern
    monkeypatch.setattr(modern, "run_modern", lambda **kw: real(grid=modern.SMALL_GRID, scenarios=ONE, **kw))
    code, out, _ = run_cli("reproduce", "--modern", "--out", str(tmp_path))
    assert code == 0 and "Modern reproduction" in out
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(rows) == len(modern.VARIANTS)
    csv_lines = [line for line in (tmp_path / "results.csv").read_text().splitlines() if not line.startswith("#")]
    assert len(csv_lines) == len(rows) + 1
    assert (tmp_path / "modern.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

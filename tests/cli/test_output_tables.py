"""What the commands print to a pipe or a file: separated columns, whole names, no progress bar."""

import re

from mcdla.report import modern

ONE = (modern.Scenario(model="gpt3-175b", global_batch=1536, gpus=1152),)


def test_simulate_summary_separates_names_from_values(run_cli):
    """Every summary row has its name, at least two spaces, then its value (no 'virtualization46.54 ms')."""
    code, out, _ = run_cli("simulate", "--system", "mc-dla", "--workload", "vgg-e")
    assert code == 0
    for name in ("iteration time", "compute", "recompute", "exposed virtualization", "exposed communication",
                 "peak device", "offloaded", "busiest links"):
        assert re.search(rf"^\s*{name}\s{{2,}}\S", out, flags=re.M), name
    assert not re.search(r"[a-z]\d", out.replace("gpu", "").replace("mem", ""))


def test_modern_table_to_a_file_keeps_every_system_name_whole(run_cli, tmp_path, monkeypatch):
    """reproduce --modern with stdout not a terminal prints each system name whole with its best
    configuration on one row (no cut at 120 columns), and no progress bar on stderr."""
    real = modern.run_modern
    monkeypatch.setattr(modern, "run_modern", lambda **kw: real(grid=modern.SMALL_GRID, scenarios=ONE, **kw))
    code, out, err = run_cli("reproduce", "--modern", "--out", str(tmp_path))
    assert code == 0 and err == ""
    rows = [line for line in out.splitlines() if "gpt3-175b" in line]
    for variant in modern.VARIANTS:
        assert sum(f"│ {variant.key} " in line for line in rows) == 1, variant.key
    assert max(len(line) for line in rows) > 120


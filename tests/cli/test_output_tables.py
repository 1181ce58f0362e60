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



SEARCH = ("search", "--model", "megatron-1.7b", "--system", "dgx-a100", "--gpus", "8", "--global-batch", "16",
          "--max-virtual-stages", "2", "--workers", "1", "--top", "2")


def _search_enumeration():
    from mcdla.hardware.cluster import load_cluster
    from mcdla.plan.llm_search import enumerate_executions
    from mcdla.workload.transformer import preset

    return enumerate_executions(preset("megatron-1.7b"), load_cluster("dgx-a100").for_gpus(8), gpus=8,
                                global_batch=16, max_virtual_stages=2)


def test_search_rejected_candidates_are_a_table_of_count_and_reason(run_cli):
    """search prints each rejection reason once in a bordered table row with its count, as enumerated."""
    code, out, _ = run_cli(*SEARCH, "--quiet")
    assert code == 0
    section = out[out.index("rejected candidates"):out.index("fastest 2 of")]
    rows = {m.group(2).strip(): int(m.group(1)) for m in re.finditer(r"^│\s+(\d+) │ (.+?)│$", section, flags=re.M)}
    assert rows == _search_enumeration().rejected


def test_search_progress_goes_through_the_shared_bar(run_cli, monkeypatch):
    """search draws its progress with progress_bar (off with --quiet, by terminal otherwise), counting the
    evaluated configurations up to the number of valid ones."""
    import contextlib

    from mcdla.profile import progress

    calls = []

    @contextlib.contextmanager
    def recording_bar(what, *, enabled=None, console=None):
        calls.append(("open", enabled))
        yield lambda done, total, what="": calls.append((done, total))

    monkeypatch.setattr(progress, "progress_bar", recording_bar)
    assert run_cli(*SEARCH, "--quiet")[0] == 0
    assert calls[0] == ("open", False)
    calls.clear()
    code, _, err = run_cli(*SEARCH)
    assert code == 0 and err == ""
    valid = len(_search_enumeration().executions)
    assert calls[0] == ("open", None) and calls[1] == (0, valid) and calls[-1] == (valid, valid)

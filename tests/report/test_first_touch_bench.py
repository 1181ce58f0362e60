"""``benchmarks.bench_first_touch``: its fresh pass really faults pages in and its second pass does not, and it
refuses a size below one page."""

import mmap

import psutil
import pytest
import torch

from benchmarks.bench_first_touch import _fresh, main, measure

SIZE = 64 * mmap.PAGESIZE * 16  # 4 MiB on 4 KiB pages


def test_fresh_mapping_becomes_resident_on_the_first_copy_only():
    """The measured 'fresh' copy is the one that makes the mapping resident (the process's RSS grows by its
    size); copying into it again adds nothing: the two passes differ by page faults alone."""
    process = psutil.Process()
    region, target = _fresh(SIZE)
    source = torch.ones(SIZE, dtype=torch.uint8)
    before = process.memory_info().rss
    target.copy_(source)
    after_first = process.memory_info().rss
    target.copy_(source)
    after_second = process.memory_info().rss
    assert after_first - before >= 0.9 * SIZE
    assert abs(after_second - after_first) < 0.1 * SIZE
    assert bool((target == 1).all())
    del target, region


def test_measure_reports_the_host_path_with_positive_rates():
    rows = measure(SIZE, 2, repeats=2)
    assert rows[0][0].startswith("host thread copy")
    assert all(len(f) == len(w) == 2 and min(f) > 0 and min(w) > 0 for _n, f, w in rows)


def test_a_size_below_one_page_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--size", "100", "--no-record"])
    assert exit_info.value.code == 2 and "--size must be at least one page" in capsys.readouterr().err

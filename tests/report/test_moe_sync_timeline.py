"""The host-synchronised stream timeline of ``benchmarks/bench_moe_host_models.py`` against hand computations: a
worked example with one sync, and without syncs the closed form of an in-order stream fed by one host thread,
``max_j (h_1 + ... + h_j + g_j + ... + g_n)``, with ``max(H, G) <= T <= H + G`` around it."""

import random

import pytest

from benchmarks.bench_moe_host_models import SYNC, stream_s


def test_worked_example_with_one_sync():
    # host issues at 1 (GPU 1-6), at 4 (GPU 6-7); the sync holds the host until 7; issue at 9, GPU 9-11
    assert stream_s([(1.0, 5.0), (3.0, 1.0), SYNC, (2.0, 2.0)]) == pytest.approx(11.0)
    # without the sync the host issues the last block at 6 and the GPU runs it 7-9
    assert stream_s([(1.0, 5.0), (3.0, 1.0), (2.0, 2.0)]) == pytest.approx(9.0)


def test_without_syncs_the_closed_form_and_its_bounds():
    rng = random.Random(7)
    for _ in range(200):
        blocks = [(rng.uniform(0, 2), rng.uniform(0, 2)) for _ in range(rng.randint(1, 12))]
        hosts, gpus = [h for h, _ in blocks], [g for _, g in blocks]
        closed = max(sum(hosts[: j + 1]) + sum(gpus[j:]) for j in range(len(blocks)))
        got = stream_s(blocks)
        assert got == pytest.approx(closed)
        assert max(sum(hosts), sum(gpus)) - 1e-12 <= got <= sum(hosts) + sum(gpus) + 1e-12


def test_a_sync_splits_the_stream_into_segments_that_add():
    """After a sync the GPU has run everything issued, so the time is the two segments' closed forms added."""
    rng = random.Random(11)
    for _ in range(100):
        a = [(rng.uniform(0, 2), rng.uniform(0, 2)) for _ in range(rng.randint(1, 6))]
        b = [(rng.uniform(0, 2), rng.uniform(0, 2)) for _ in range(rng.randint(1, 6))]
        assert stream_s(a + [SYNC] + b) == pytest.approx(stream_s(a) + stream_s(b))

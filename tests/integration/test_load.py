"""Load: 16 writer processes, 2 samplers and a priority updater against one replay process
for 60 s over loopback (benchmarks/replay_load.py; its docstring has the details).

The soak variant is the same script run longer, on demand, not in CI:
    .venv/bin/python benchmarks/replay_load.py --seconds 3600
"""

from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# Resident memory of the replay may move this much over the at-capacity window (end minus
# start, and max minus min). Measured on a 2-core shared machine over 7-58 s windows: at
# most 0.9 MiB either way (allocator and gRPC buffers settling; at most 19 calls in flight).
# An injected leak of a 100-byte object per table call (~1,000 calls/s) grew it 8.9-9.6 MiB
# in 58 s; anything that keeps a request, response or call object (KBs each) fails it even
# at a tenth of that rate.
RSS_SLACK_MIB = 4.0
# Calls each RPC must complete, summed over its workers: under 2 per second, while a 2-core
# machine starved by 8 busy loops still did 16-80 per second; a stalled RPC does none.
MIN_CALLS = 100
# gRPC's EventEngine pool starts a thread whenever all its threads are busy (a CPU-starved
# machine; at most one a second, no upper bound) and ends one beyond its reserve after 20 s
# without work, which a connected client's pings and calls keep providing: under load its
# count may rise and stay up. Every other thread may not grow under load; and once no
# client is left, every thread by name, this pool included, and every fd must be back to
# the replay's figures before its first client (report["after_load"]): a leaked thread
# never ends, whatever its name.
DEMAND_POOLS = {"event_engine"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sixteen_writers_two_samplers_and_an_updater_for_60_s(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # spawned workers inherit sys.path
    import replay_load

    report = replay_load.run_load(60)
    print("\n" + replay_load.format_report(report))

    assert not report["worker_failures"]
    for rpc, figures in report["rpcs"].items():
        assert figures["errors"] == 0, (rpc, figures["error_codes"], report["error_messages"])
        assert figures["calls"] >= MIN_CALLS, (rpc, figures)
    assert all(n > 0 for n in report["min_calls_per_worker"].values()), report
    # Every item a successful call carried was counted once by the server.
    assert report["server_counts_match"], (report["rpcs"], report["server"])
    # Every sampled row was checked, and each is a row a writer had sent, intact.
    rows = report["sampled_rows"]
    assert rows["checked"] == report["rpcs"]["Sample"]["items"], (rows, report["rpcs"])
    assert rows["mismatches"] == 0, (rows, report["error_messages"])

    memory, seconds = report["memory"], report["load_seconds"]
    # The table filled early, so the flat-memory check covers most of the run.
    assert memory["capacity_reached_s"] is not None, "the table never reached capacity"
    assert memory["window_s"] >= seconds / 2, memory
    assert memory["rss_growth_mib"] < RSS_SLACK_MIB, memory
    assert memory["rss_window_max_minus_min_mib"] < RSS_SLACK_MIB, memory

    # No growth after warm-up: every connection is open by then and nothing else is spawned.
    fds = report["fds"]
    assert fds["end"] <= fds["after_warmup"] and fds["max_after_warmup"] <= fds["after_warmup"], fds
    threads = report["threads"]
    for name, count in threads["names_end"].items():
        if name not in DEMAND_POOLS:
            assert count <= threads["names_after_warmup"].get(name, 0), (name, threads)
    idle, after = report["idle"], report["after_load"]
    for name, count in after["thread_names"].items():
        assert count <= idle["thread_names"].get(name, 0), (name, after, idle)
    assert after["fds"] <= idle["fds"], (after, idle)

    assert report["replay_alive_at_end"]
    assert report["replay_exit_code"] == 0
    assert not report["replay_log_problems"]


def test_row_check_counts_rows_no_writer_sent(monkeypatch):
    """The load test's data check is not vacuous: it finds each kind of foreign row."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import replay_load

    sent = np.array([0, 0, 0, 64], np.int64)  # writer 3 has sent rows 0..63
    columns = replay_load.transitions(replay_load.row_ids(3, 0, 64))
    assert replay_load.check_rows(columns, sent)["mismatches"] == 0

    columns["action"][:3] = replay_load.row_ids(3, 64, 1)[0], -1, replay_load.row_ids(9, 0, 1)[0]
    columns["reward"][10] += 1  # a changed value
    columns["next_obs"][20] = columns["next_obs"][21]  # a value from another row
    counts = replay_load.check_rows(columns, sent)
    assert counts == {
        "checked": 64,
        "mismatches": 5,
        "unknown_writer": 2,  # writer -1 (id -1) and writer 9
        "unsent": 1,  # seq 64 of writer 3
        "wrong_columns": 5,  # a changed id changes every other column
    }

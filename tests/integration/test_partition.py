"""A silent network partition between the actor and replay + learner.

Two network namespaces joined by a veth pair: "srv" runs replay and the learner, "act" the
actor, all as real processes. An nftables drop rule on both sides cuts the link for 30 s
without telling either end (no RST, no ICMP: the way a real partition looks). Unlike a replay
outage (tests/integration/test_learner_actor.py), replay stays up and keeps its data.

What the actor must do: keep acting on the weights it holds, hold at most buffer-limit (+ one
insert batch) transitions, count what it drops, and insert again soon after the link heals.
A silent drop makes calls hang rather than fail, so this needs the client to notice a dead
connection on its own (HTTP/2 keepalive pings) well before a call's deadline.
"""

import time
from contextlib import ExitStack

from tests.conftest import start_service, wait_for
from tests.integration import netns

PARTITION_SECONDS = 30.0
RECOVERY_SECONDS = 30.0  # after healing, replay must see inserts again within this
OBSERVE_SECONDS = 60.0  # how long to watch after healing (past the bound, for the report)
LONGEST_STALL = 10.0  # during the partition, the actor never stops stepping for longer
INSERT_BATCH, BUFFER_LIMIT, NUM_ENVS = 16, 300, 2
DRAINED = 4 * INSERT_BATCH  # buffered at or below this: the backlog is gone


def _stop(proc) -> None:
    if proc.process.poll() is None:
        proc.kill()


def test_actor_buffers_drops_and_recovers_across_a_silent_partition(tmp_path):
    netns.require_netns()
    with ExitStack() as stack:
        link = stack.enter_context(netns.linked_namespaces("srv", "act"))
        srv, act = link.a, link.b

        def start(ns, host, command, *flags):
            proc = start_service(tmp_path, command, *flags, host=host, prefix=ns.prefix)
            stack.callback(_stop, proc)  # before the namespaces go (LIFO)
            return proc

        replay = start(srv, link.a_addr, "replay", "--min-size-to-sample", "1")
        replay_address = replay.address
        learner = start(srv, link.a_addr, "learner", "--replay", replay_address,
                        "--batch-size", "32")  # fmt: skip
        actor = start(act, "127.0.0.1", "actor", "--replay", replay_address,
                      "--learner", learner.address,
                      "--num-envs", str(NUM_ENVS), "--insert-batch", str(INSERT_BATCH),
                      "--buffer-limit", str(BUFFER_LIMIT))  # fmt: skip

        def replay_inserts() -> float:
            return netns.metrics(srv, link.a_addr, replay.metrics_port)[
                "apexrl_replay_inserts_total"
            ]

        def actor_metrics() -> dict[str, float]:
            values = netns.metrics(act, "127.0.0.1", actor.metrics_port)
            return {
                key: values[f"apexrl_actor_{name}"]
                for key, name in [
                    ("steps", "env_steps_total"),
                    ("buffered", "transitions_buffered"),
                    ("dropped", "transitions_dropped_total"),
                    ("inserted", "transitions_inserted_total"),
                ]
            }

        def alive() -> dict[str, bool]:
            procs = {"replay": replay, "learner": learner, "actor": actor}
            return {name: proc.process.poll() is None for name, proc in procs.items()}

        # The link works: the actor's transitions reach replay through it.
        wait_for(lambda: actor_metrics()["inserted"] >= 4 * INSERT_BATCH, 90,
                 "actor's first inserts through the link")  # fmt: skip
        before = actor_metrics()

        netns.partition(act, link.a_addr)
        netns.partition(srv, link.b_addr)
        cut = time.monotonic()
        timeline = []  # (seconds since the cut, actor metrics, processes alive)
        while (now := time.monotonic()) - cut < PARTITION_SECONDS:
            timeline.append((now - cut, actor_metrics(), alive()))
            time.sleep(0.5)
        during = timeline[-1][1]
        inserts_at_heal = replay_inserts()
        tcp = act.sh("ss", "-tnoi", "dst", link.a_addr, check=False)
        dropped_packets = netns.dropped_packets(act) + netns.dropped_packets(srv)

        netns.heal(act)
        netns.heal(srv)
        healed = time.monotonic()
        recovered_after = drained_after = None
        while (since := time.monotonic() - healed) < OBSERVE_SECONDS:
            if recovered_after is None and replay_inserts() > inserts_at_heal:
                recovered_after = since
            if drained_after is None and actor_metrics()["buffered"] <= DRAINED:
                drained_after = since
            if recovered_after is not None and drained_after is not None:
                break
            time.sleep(0.25)
        after = actor_metrics()

        stalls, last_change = [], (0.0, before["steps"])
        for t, values, _ in timeline:
            if values["steps"] != last_change[1]:
                last_change = (t, values["steps"])
            stalls.append(t - last_change[0])
        max_buffered = max(values["buffered"] for _, values, _ in timeline)
        report = (
            f"partition {PARTITION_SECONDS:.0f} s ({dropped_packets} packets dropped): "
            f"env steps {before['steps']:.0f} -> {during['steps']:.0f} "
            f"(longest stall {max(stalls):.1f} s), "
            f"transitions dropped {during['dropped'] - before['dropped']:.0f}, "
            f"max buffered {max_buffered:.0f} (bound {BUFFER_LIMIT + INSERT_BATCH}); "
            f"after healing: replay inserts again after "
            f"{'never' if recovered_after is None else f'{recovered_after:.1f} s'}, "
            f"buffer <= {DRAINED} after "
            f"{'never' if drained_after is None else f'{drained_after:.1f} s'} "
            f"(watched {OBSERVE_SECONDS:.0f} s), actor inserted "
            f"{after['inserted'] - during['inserted']:.0f}, dropped in all "
            f"{after['dropped'] - before['dropped']:.0f}"
        )
        print(report)
        print("timeline (s, env steps, buffered, dropped, inserted):")
        print("  " + "; ".join(f"{t:.1f} {v['steps']:.0f} {v['buffered']:.0f} "
                               f"{v['dropped']:.0f} {v['inserted']:.0f}"
                               for t, v, _ in timeline[::4]))  # fmt: skip
        print(f"actor's TCP to {link.a_addr} at the end of the partition:\n{tcp}")
        context = f"{report}\nactor log tail:\n{actor.log()[-3000:]}"

        for t, _, up in timeline:
            assert all(up.values()), f"{up} at {t:.1f} s into the partition\n{context}"
        assert max(stalls) < LONGEST_STALL, f"the actor stopped acting\n{context}"
        assert max_buffered <= BUFFER_LIMIT + INSERT_BATCH, context
        assert during["dropped"] > before["dropped"], f"no drops counted\n{context}"
        assert recovered_after is not None and recovered_after <= RECOVERY_SECONDS, context
        assert drained_after is not None and drained_after <= RECOVERY_SECONDS, context
        assert all(alive().values()), context
        for proc in (actor, learner, replay):
            proc.stop()

"""A silent network partition between the actor and replay + learner.

Two network namespaces joined by a veth pair: "srv" runs replay and the learner, "act" the
actor, all as real processes. An nftables drop rule on both sides cuts the link for 30 s
without telling either end (no RST, no ICMP: the way a real partition looks). Unlike a replay
outage (tests/integration/test_learner_actor.py), replay stays up and keeps its data.

What the actor must do: keep acting on the weights it holds, hold at most buffer-limit (+ one
insert batch) transitions, count what it drops, and insert again soon after the link heals.
A silent drop makes calls hang rather than fail, so this needs the client to notice a dead
connection on its own (HTTP/2 keepalive pings) well before a call's deadline.

Checked from outside the actor too: the drop rules' own counters show packets were dropped,
replay's insert count shows nothing but the insert in flight got through the cut, and in the
end the actor's env steps balance against what replay holds plus what the actor dropped or
still buffers (see the books below).
"""

import time
from contextlib import ExitStack

from tests.conftest import start_service, wait_for
from tests.integration import netns

PARTITION_SECONDS = 30.0
RECOVERY_SECONDS = 30.0  # after healing, replay must see inserts again within this
OBSERVE_SECONDS = 60.0  # how long to watch after healing (past the bound, for the report)
LONGEST_STALL = 10.0  # during the partition, the actor never stops stepping for longer
INSERT_BATCH, BUFFER_LIMIT, NUM_ENVS, N_STEP = 16, 300, 2, 3
DRAINED = 4 * INSERT_BATCH  # buffered at or below this: the backlog is gone
FREEZE_SECONDS = 20.0  # the second cut must freeze the books within this
# The largest insert: fewer than INSERT_BATCH transitions pending, then one env step ends up
# to N_STEP windows per env (all of them when the episode ends).
MAX_BATCH = INSERT_BATCH - 1 + NUM_ENVS * N_STEP
# Env steps not yet transitions in the buffer: each env step opens one n-step window per env
# and every window becomes one transition, but up to N_STEP - 1 per env are still open and up
# to MAX_BATCH finished ones wait in the batch being assembled.
NOT_YET_BUFFERED = NUM_ENVS * (N_STEP - 1) + MAX_BATCH


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
                      "--n-step", str(N_STEP), "--buffer-limit", str(BUFFER_LIMIT))  # fmt: skip

        def replay_metrics() -> dict[str, float]:
            values = netns.metrics(srv, link.a_addr, replay.metrics_port)
            return {"inserts": values["apexrl_replay_inserts_total"],
                    "size": values["apexrl_replay_size"]}  # fmt: skip

        def replay_inserts() -> float:
            return replay_metrics()["inserts"]

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
        inserts_at_cut = replay_inserts()
        timeline = []  # (seconds since the cut, actor metrics, processes alive)
        while (now := time.monotonic()) - cut < PARTITION_SECONDS:
            timeline.append((now - cut, actor_metrics(), alive()))
            time.sleep(0.5)
        during = timeline[-1][1]
        inserts_at_heal = replay_inserts()
        tcp = act.sh("ss", "-tnoi", "dst", link.a_addr, check=False)
        dropped_at = {"act": netns.dropped_packets(act), "srv": netns.dropped_packets(srv)}
        dropped_packets = sum(dropped_at.values())

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

        # The books: what the actor produced against what replay holds plus what the actor
        # dropped or still buffers. They balance only at one instant, so a second cut freezes
        # them: the actor's insert hangs, its loop blocks on the full hand-off queue
        # (backpressure) until keepalive declares the link dead (3-7 s), and with no packet
        # crossing, replay stands still too. Two equal actor scrapes around a replay read
        # are one snapshot.
        netns.partition(act, link.a_addr)
        netns.partition(srv, link.b_addr)

        def frozen_books() -> tuple[dict[str, float], dict[str, float]] | None:
            first, held, second = actor_metrics(), replay_metrics(), actor_metrics()
            return (second, held) if first == second else None

        books, held = wait_for(frozen_books, FREEZE_SECONDS,
                               "the actor to block on its hung insert (books frozen)")  # fmt: skip
        freeze_packets = netns.dropped_packets(act) + netns.dropped_packets(srv)
        netns.heal(act)
        netns.heal(srv)
        # Delivery is at-least-once (the buffer re-sends a batch until it is acked), so a
        # transition can be counted twice: (a) an insert that landed in replay but whose ack was
        # lost is later re-sent or dropped; only the one insert in flight when a cut starts can
        # do that (inserts go one at a time, none sent during a cut gets through), and with
        # no packet crossing, replay's inserts minus the actor's acks measure it exactly at the
        # end of each cut. (b) The insert that ends an outage may be dropped from the full
        # buffer while in flight and still land: at most one batch, not measurable from outside.
        lost_in_first_cut = inserts_at_heal - during["inserted"]
        acks_lost = held["inserts"] - books["inserted"]  # both cuts
        # Env steps not in replay, dropped or buffered: up to NOT_YET_BUFFERED, or negative by
        # what (a) and (b) count twice.
        unaccounted = books["steps"] - (held["size"] + books["dropped"] + books["buffered"])
        books_report = (
            f"books frozen by a second cut ({freeze_packets} packets dropped): env steps "
            f"{books['steps']:.0f} = replay holds {held['size']:.0f} + dropped "
            f"{books['dropped']:.0f} + buffered {books['buffered']:.0f} + {unaccounted:.0f} "
            f"(allowed {-(acks_lost + MAX_BATCH):.0f} .. {NOT_YET_BUFFERED}); replay inserts "
            f"{held['inserts']:.0f}, acked to the actor {books['inserted']:.0f}: acks lost "
            f"{acks_lost:.0f}, {lost_in_first_cut:.0f} of them in the first cut (allowed "
            f"{MAX_BATCH} per cut); replay inserts during the first cut "
            f"{inserts_at_heal - inserts_at_cut:.0f} (allowed {MAX_BATCH}); first cut's "
            f"packets dropped per side {dropped_at}"
        )
        print(books_report)

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
        context = f"{report}\n{books_report}\nactor log tail:\n{actor.log()[-3000:]}"

        for t, _, up in timeline:
            assert all(up.values()), f"{up} at {t:.1f} s into the partition\n{context}"
        assert max(stalls) < LONGEST_STALL, f"the actor stopped acting\n{context}"
        assert max_buffered <= BUFFER_LIMIT + INSERT_BATCH, context
        assert during["dropped"] > before["dropped"], f"no drops counted\n{context}"
        assert recovered_after is not None and recovered_after <= RECOVERY_SECONDS, context
        assert drained_after is not None and drained_after <= RECOVERY_SECONDS, context
        # The cut was real: each side's drop rule counted packets, and replay took in nothing
        # but (at most) the insert already in flight.
        assert all(n > 0 for n in dropped_at.values()), f"a rule dropped nothing\n{context}"
        assert inserts_at_heal - inserts_at_cut <= MAX_BATCH, context
        assert freeze_packets > 0, f"the second cut dropped nothing\n{context}"
        # Replay holds every acked insert, and beyond them at most one lost ack per cut.
        assert 0 <= lost_in_first_cut <= MAX_BATCH, f"acks lost in the first cut\n{context}"
        assert 0 <= acks_lost - lost_in_first_cut <= MAX_BATCH, f"acks lost\n{context}"
        assert held["size"] == held["inserts"], f"replay evicted or lost items\n{context}"
        # Nothing lost, nothing counted twice beyond what at-least-once delivery explains.
        assert -(acks_lost + MAX_BATCH) <= unaccounted <= NOT_YET_BUFFERED, context
        assert all(alive().values()), context
        for proc in (actor, learner, replay):
            proc.stop()

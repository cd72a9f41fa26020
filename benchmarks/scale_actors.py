"""Simulated actors for benchmarks/scale.py: many per process, no env and no torch.

Each simulated actor is what a real actor is to the services: its own random actor_id, its
own LearnerClient (one channel and connection: leases, parameter pulls, change sets applied
as the actor applies them) and its own replay client (`connect`, as the actor builds it from the replay
setting), driven by a clock instead of envs. Two threads per actor, as the real one has:

- pulls: the first at the actor's start, then one every pull_interval / steps_per_s seconds
  (the actor's ParameterPuller, asked every pull_interval env steps), each sending back the
  version and lineage held; with relays, from its relay (actor i: relay i mod R) with its
  lease renewed at the learner (a lease_only call), as an actor whose `parameters` names one;
- inserts: once it holds parameters, a batch of insert_batch recorded transitions (packed as
  the actor packs them) every insert_batch / steps_per_s seconds, each call waiting for the
  last (the actor's InsertBuffer under backpressure). A late actor catches up: what the
  schedule offered is counted apart from what replay accepted.

Actors start spread evenly over one pull period (a fleet in its steady state, not one burst).
Every call is recorded: (kind, start, seconds, bytes, ok) and, for pulls, the lease answer.

Churn (`churn`, a fraction of the fleet a second): from one pull period after the start, each
process replaces one of its actors every 1 / (churn x its actors) seconds, a random one but
the paused: the actor leaves (stops pulling and inserting, its calls in flight finished, its
channels closed: its lease lapses at the learner) and a new one joins in its slot with a new
index and actor_id, pulling at once.
"""

import dataclasses
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from apexrl.common.learner_client import LearnerClient
from apexrl.replay.sharded import connect
from apexrl.v1 import learner_pb2

# Channels of one process to one address share one connection unless each has its own
# subchannel pool: an actor process has its own connections, so each simulated actor too.
OWN = (("grpc.use_local_subchannel_pool", 1),)


@dataclass(frozen=True)
class Fleet:
    """What every simulated actor of a run shares."""

    learner: str
    replay: str
    steps_per_s: float
    pull_interval: int
    insert_batch: int
    actors: int  # in the whole fleet, for the spread of start times
    paused: int = 0  # actors 0 .. paused - 1 fall silent over `pause` (their leases expire)
    pause: tuple[float, float] = (0.0, 0.0)  # from, until: seconds after `start`
    start: float = 0.0  # monotonic time the first actor starts (one clock for all processes)
    relays: tuple[str, ...] = ()  # parameter relays' addresses; empty: pull from the learner
    churn: float = 0.0  # the fraction of the fleet that leaves a second, replaced by new actors

    @property
    def pull_period(self) -> float:
        return self.pull_interval / self.steps_per_s

    @property
    def insert_period(self) -> float:
        return self.insert_batch / self.steps_per_s


@dataclass
class Record:
    """One actor's calls: pulls (start, seconds, bytes, ok, index, count, exploration) and
    inserts (start, seconds, items, ok); errors' messages (the first few)."""

    pulls: list = field(default_factory=list)
    inserts: list = field(default_factory=list)
    offered: list = field(default_factory=list)  # the times inserts were due
    errors: list = field(default_factory=list)
    joined: float | None = None  # when it joined, for an actor that replaced one that left
    left: float | None = None  # when it left, for one that churn took away


def counting(client: LearnerClient) -> LearnerClient:
    """The shipping client, its GetParameters answers' sizes kept in client.last_bytes."""

    def decode(data: bytes) -> learner_pb2.GetParametersResponse:
        client.last_bytes = len(data)
        return learner_pb2.GetParametersResponse.FromString(data)

    client.last_bytes = 0
    client.stub.GetParameters = client.channel.unary_unary(
        "/apexrl.v1.Learner/GetParameters",
        request_serializer=learner_pb2.GetParametersRequest.SerializeToString,
        response_deserializer=decode,
    )
    return client


class SimulatedActor:
    def __init__(self, index: int, fleet: Fleet, batches: list[dict], joined: float | None = None):
        self.index, self.fleet, self.batches = index, fleet, batches
        self.stop = threading.Event()
        self.actor_id = f"sim-{index}-{uuid.uuid4().hex[:8]}"
        self.record = Record()
        self.learner = counting(
            LearnerClient(fleet.learner, retry_seconds=1.0, retry_cap=0.1, channel_options=OWN)
        )
        self.relay = None
        if fleet.relays:
            address = fleet.relays[index % len(fleet.relays)]
            self.relay = counting(
                LearnerClient(address, retry_seconds=1.0, retry_cap=0.1, channel_options=OWN)
            )
        self.replay = connect(fleet.replay, timeout=30.0, retry_seconds=1.0, channel_options=OWN)
        self.held = threading.Event()  # set once it holds parameters: it may act
        self.offset = fleet.pull_period * index / fleet.actors  # its start, after fleet.start
        self.record.joined = joined
        self.rng = np.random.default_rng(index)
        self.threads = [
            threading.Thread(target=self._pulls, daemon=True),
            threading.Thread(target=self._inserts, daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        """Stops it: the calls in flight finish, then its channels close."""
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        self.learner.close()
        if self.relay is not None:
            self.relay.close()
        self.replay.close()

    def _next(self, due: float) -> float:
        """`due`, or the end of this actor's pause when it falls in it."""
        silent, back = (self.fleet.start + t for t in self.fleet.pause)
        return back if self.index < self.fleet.paused and silent <= due < back else due

    def _wait_until(self, due: float) -> bool:
        """Sleeps until `due`; False once the run stops."""
        return not self.stop.wait(max(0.0, due - time.monotonic()))

    def _pulls(self) -> None:
        version, lineage = 0, 0
        due = self.fleet.start + self.offset if self.record.joined is None else self.record.joined
        while self._wait_until(due := self._next(due)):
            started = time.monotonic()
            source = self.relay or self.learner
            try:
                params = source.get_parameters(version, self.actor_id, lineage)
                if self.relay is not None:  # the place in the ladder comes from the learner
                    lease = self.learner.renew_lease(self.actor_id)
                    params.actor_index, params.num_actors = lease.actor_index, lease.num_actors
                    params.exploration = lease.exploration
            except Exception as err:  # counted: the run reports every failed call
                self._failed("pull", started, err)
            else:
                if params.arrays:
                    version, lineage = params.version, params.lineage
                    self.held.set()
                self.record.pulls.append(
                    (
                        started,
                        time.monotonic() - started,
                        source.last_bytes,
                        True,
                        params.actor_index,
                        params.num_actors,
                        params.exploration,
                    )
                )
            # Behind (a pull slower than the period): the next one at once, as the actor's
            # puller does with a request that came while it pulled.
            due = max(due + self.fleet.pull_period, time.monotonic())

    def _inserts(self) -> None:
        while not self.held.is_set():
            if self.stop.wait(0.05):
                return
        due = time.monotonic()
        n = self.fleet.insert_batch
        while self._wait_until(due := self._next(due)):
            self.record.offered.append(due)
            batch = self.batches[int(self.rng.integers(len(self.batches)))]
            priorities = self.rng.uniform(0.1, 2.0, n).astype(np.float32)
            started = time.monotonic()
            try:
                self.replay.insert(batch, priorities)
            except Exception as err:
                self._failed("insert", started, err)
            else:
                self.record.inserts.append((started, time.monotonic() - started, n, True))
            due += self.fleet.insert_period

    def _failed(self, kind: str, started: float, err: Exception) -> None:
        elapsed = time.monotonic() - started
        if kind == "pull":
            self.record.pulls.append((started, elapsed, 0, False, -1, 0, 0.0))
        else:
            self.record.inserts.append((started, elapsed, 0, False))
        if len(self.record.errors) < 5:
            details = getattr(err, "details", None)
            self.record.errors.append(f"{kind}: {details() if callable(details) else err!r}")


def run_process(indices: list[int], fleet: Fleet, batches, ready, start, stop, results) -> None:
    """A process's actors: channels open, then `ready`; they start from the monotonic time
    the parent puts in `start` (a shared double, 0 until then), and end at `stop`; with
    churn, actors leave and join meanwhile. Every actor's record goes to `results` (one dict
    per actor that ran, the ones that left included)."""
    actors = {i: SimulatedActor(i, fleet, batches) for i in indices}
    ready.release()
    while not start.value:
        time.sleep(0.01)
    fleet = dataclasses.replace(fleet, start=start.value)
    for actor in actors.values():
        actor.fleet = fleet
        actor.start()
    gone = churn(actors, fleet, batches, stop) if fleet.churn else []
    stop.wait()
    for actor in actors.values():
        actor.join()
    ran = gone + list(actors.values())
    results.put([{"index": a.index, **a.record.__dict__} for a in ran])


def churn(actors: dict, fleet: Fleet, batches, stop) -> list[SimulatedActor]:
    """Replaces a random actor of `actors` (slot -> actor; the paused stay) every
    1 / (churn x len(actors)) seconds until `stop`; returns the ones that left. The actor
    that joins slot i takes index i + g x fleet.actors, g its slot's generation: unique
    over the fleet's processes without a word between them."""
    slots = sorted(i for i in actors if i >= fleet.paused)
    if not slots:
        return []
    rng = np.random.default_rng(slots[0])
    period = 1.0 / (fleet.churn * len(actors))
    due = fleet.start + fleet.pull_period + period * rng.uniform()
    generation = dict.fromkeys(slots, 0)
    gone = []
    while not stop.wait(max(0.0, due - time.monotonic())):
        slot = int(rng.choice(slots))
        generation[slot] += 1
        index = slot + generation[slot] * fleet.actors
        joining = SimulatedActor(index, fleet, batches, joined=time.monotonic())
        joining.start()
        leaving, actors[slot] = actors[slot], joining
        leaving.record.left = time.monotonic()
        leaving.join()
        gone.append(leaving)
        due += period
    return gone

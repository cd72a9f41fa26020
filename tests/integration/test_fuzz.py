"""Bad input, property-based (issue 5): hypothesis drives every RPC with malformed requests.

One real replay server (capacity 64, max_batch_size 32, 4 MiB messages, no checkpoint
directory) whose signature the first insert fixes, and one real learner parameter server
(LearnerServicer behind the shared `serve` bootstrap, 1 MiB messages) serve the whole module.
For every generated request:
- the status code is the one replay.proto / learner.proto documents for it (OK where the
  contract says so, e.g. stale or never-written keys), never UNKNOWN or INTERNAL;
- a refusal's message starts with the offending field's path (`batch.columns["obs"].data`,
  `priorities`, `keys`, `batch_size`, `beta`, `table`, `actor_id`, ...);
- a refused request leaves the table's digest unchanged; an accepted one changes exactly what
  the contract says (checked against an independent model of the stored state);
- the server still answers the health check.

The number of cases tried per RPC is printed at the end (`pytest -s`). The tests at the
bottom reproduce the bugs this suite found on its first run (all fixed since).
"""

import copy
import math
import string
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from apexrl.algorithms.exploration import epsilon_ladder
from apexrl.common import tensors
from apexrl.config import LearnerConfig
from apexrl.replay.client import insert_request
from apexrl.v1 import learner_pb2, learner_pb2_grpc, replay_pb2, replay_pb2_grpc, tensor_pb2
from tests.conftest import (
    InProcessReplay,
    in_process_replay,
    serve_learner,
    wait_for,
)

CAPACITY = 64
MAX_BATCH = 32
MAX_MESSAGE_MB = 4
LEARNER_MAX_MESSAGE_MB = 1
LEARNER_ARRAYS = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}
LEARNER_ENV = "CartPole-v1"
TABLE = "default"
ALPHA = 0.6
# Column name -> (dtype, item shape): the signature the module's first insert fixes.
SIGNATURE = {
    "obs": (np.dtype("<f4"), (4,)),
    "action": (np.dtype("<i8"), ()),
    "reward": (np.dtype("<f4"), ()),
    "done": (np.dtype("?"), ()),
    "frame": (np.dtype("u1"), (2, 3)),
}
WIRE_DTYPES = {
    tensor_pb2.FLOAT32: np.dtype("<f4"),
    tensor_pb2.FLOAT64: np.dtype("<f8"),
    tensor_pb2.FLOAT16: np.dtype("<f2"),
    tensor_pb2.INT8: np.dtype("i1"),
    tensor_pb2.INT16: np.dtype("<i2"),
    tensor_pb2.INT32: np.dtype("<i4"),
    tensor_pb2.INT64: np.dtype("<i8"),
    tensor_pb2.UINT8: np.dtype("u1"),
    tensor_pb2.UINT16: np.dtype("<u2"),
    tensor_pb2.UINT32: np.dtype("<u4"),
    tensor_pb2.UINT64: np.dtype("<u8"),
    tensor_pb2.BOOL: np.dtype("?"),
}
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
FAILED = grpc.StatusCode.FAILED_PRECONDITION
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
REPLAY_METHODS = {
    "Insert": replay_pb2.InsertRequest,
    "Sample": replay_pb2.SampleRequest,
    "SampleStream": replay_pb2.SampleStreamRequest,
    "UpdatePriorities": replay_pb2.UpdatePrioritiesRequest,
    "Info": replay_pb2.InfoRequest,
    "Checkpoint": replay_pb2.CheckpointRequest,
}

# Cases (requests sent) per RPC, printed when the module ends.
CASES: Counter[str] = Counter()


def fuzz(max_examples: int):
    """Reproducible in CI: derandomized, no example database, no per-example deadline."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=False,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )


# --- servers ---------------------------------------------------------------------------------


@dataclass
class Replay:
    harness: InProcessReplay
    channel: grpc.Channel
    stub: replay_pb2_grpc.ReplayStub

    @property
    def table(self):
        return self.harness.table

    def raw(self, method: str):
        """A callable sending raw bytes to a replay method (no client-side serialization)."""
        path = f"/apexrl.v1.Replay/{method}"
        if method == "Insert":
            return lambda data, **kw: list(self.channel.stream_stream(path)(iter([data]), **kw))
        if method == "SampleStream":
            return lambda data, **kw: list(self.channel.unary_stream(path)(data, **kw))
        return self.channel.unary_unary(path)


def client_channel(address: str) -> grpc.Channel:
    # The client sends and receives far more than the servers accept, so the servers' limits
    # are what the oversized cases meet.
    limit = 64 * 1024 * 1024
    return grpc.insecure_channel(
        address,
        options=[
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
        ],
    )


def healthy(channel: grpc.Channel, service: str) -> bool:
    stub = health_pb2_grpc.HealthStub(channel)
    status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
    return status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module", autouse=True)
def _report_cases():
    yield
    print(f"\nbad-input cases tried per RPC ({sum(CASES.values())} in all):")
    for rpc, count in sorted(CASES.items()):
        print(f"  {rpc:<22} {count}")


@pytest.fixture(scope="module")
def replay(tmp_path_factory) -> Iterator[Replay]:
    settings_ = dict(capacity=CAPACITY, max_batch_size=MAX_BATCH, max_message_mb=MAX_MESSAGE_MB)
    with in_process_replay(
        tmp_path_factory.mktemp("fuzz-replay"), alpha=ALPHA, seed=11, **settings_
    ) as harness:
        channel = client_channel(harness.address)
        server = Replay(harness, channel, replay_pb2_grpc.ReplayStub(channel))
        # The first insert fixes the signature (and fills most of the table).
        rng = np.random.default_rng(0)
        for _ in range(2):
            request = insert_request(TABLE, valid_columns(rng, 30), None)
            list(server.stub.Insert(iter([request]), timeout=10))
        assert {s.name: (s.dtype, s.shape) for s in harness.table.signature} == SIGNATURE
        try:
            yield server
        finally:
            channel.close()


@pytest.fixture
def refilled(replay) -> Replay:
    """The table full of items with priority 1, so sampling tests never meet all-zero priorities
    left by earlier (accepted, valid) priority updates."""
    rng = np.random.default_rng(1)
    for _ in range(2):
        request = insert_request(TABLE, valid_columns(rng, MAX_BATCH), np.ones(MAX_BATCH))
        list(replay.stub.Insert(iter([request]), timeout=10))
    return replay


@contextmanager
def learner_server(tmp_path, publish: bool) -> Iterator[tuple[str, object, object]]:
    """The real LearnerServicer for LEARNER_ARRAYS (no training loop); yields (address, store,
    servicer)."""
    from apexrl.common.parameters import ParameterStore

    store = ParameterStore()
    if publish:
        store.publish(LEARNER_ARRAYS, update_step=7)
    config = LearnerConfig(checkpoint_dir=str(tmp_path / "checkpoints"), env=LEARNER_ENV)
    with serve_learner(
        tmp_path, store, LEARNER_ARRAYS, config, max_message_mb=LEARNER_MAX_MESSAGE_MB
    ) as (address, servicer):
        yield address, store, servicer


@dataclass
class Learner:
    channel: grpc.Channel
    stub: learner_pb2_grpc.LearnerStub
    store: object
    folder: Path


@pytest.fixture(scope="module")
def learner(tmp_path_factory) -> Iterator[Learner]:
    folder = tmp_path_factory.mktemp("fuzz-learner")
    with learner_server(folder, publish=True) as (address, store, _):
        channel = client_channel(address)
        try:
            yield Learner(channel, learner_pb2_grpc.LearnerStub(channel), store, folder)
        finally:
            channel.close()


# --- the expected state of the table (a model independent of table.py) -----------------------

COUNTERS = ("inserts", "samples", "priority_updates", "stale_priority_updates", "max_priority")


@dataclass
class State:
    counters: dict
    slot_keys: np.ndarray
    priorities: np.ndarray
    columns: dict[str, np.ndarray]


def read_state(table) -> State:
    table.apply_priorities()  # what the server left for after its answer
    return State(
        {name: getattr(table, name) for name in COUNTERS},
        table.slot_keys.copy(),
        table.priorities.copy(),
        {name: column.copy() for name, column in table.columns.items()},
    )


def assert_state(table, expected: State) -> None:
    """Byte-for-byte: the table holds exactly the expected state, and its tree agrees."""
    actual = read_state(table)
    assert actual.counters == expected.counters
    assert actual.slot_keys.tobytes() == expected.slot_keys.tobytes()
    assert actual.priorities.tobytes() == expected.priorities.tobytes()
    assert set(actual.columns) == set(expected.columns)
    for name, column in actual.columns.items():
        assert column.tobytes() == expected.columns[name].tobytes(), name
    leaves = np.asarray(table.tree.values)
    np.testing.assert_allclose(leaves, expected.priorities**ALPHA, rtol=1e-12, atol=0)


def apply_insert(state: State, columns: dict[str, np.ndarray], priorities) -> State:
    state = copy.deepcopy(state)
    n = len(next(iter(columns.values())))
    inserts = state.counters["inserts"]
    if priorities is None:
        p = np.full(n, state.counters["max_priority"])
    else:
        p = np.asarray(priorities, dtype=np.float64)
    for i in range(n):
        slot = (inserts + i) % CAPACITY
        state.slot_keys[slot] = inserts + i
        state.priorities[slot] = p[i]
        for name, array in columns.items():
            state.columns[name][slot] = array[i]
    state.counters["inserts"] += n
    state.counters["max_priority"] = max(state.counters["max_priority"], float(p.max()))
    return state


def live_keys(keys: np.ndarray, inserts: int) -> np.ndarray:
    """A key is live while its slot still holds it: the newest `capacity` keys written."""
    k = keys.astype(object)  # uint64 keys above 2^63: exact comparisons
    return np.array([max(0, inserts - CAPACITY) <= key < inserts for key in k], dtype=bool)


# --- shared strategies and checks ------------------------------------------------------------


def names() -> st.SearchStrategy[str]:
    """Table / column / actor names: any unicode (controls, NUL, quotes, emoji), or long ASCII.

    Kept under 300 characters: longer ones hit the message-length bug reproduced below.
    """
    return st.one_of(
        st.text(max_size=40),
        st.text(alphabet=string.printable, min_size=250, max_size=300),
    )


def column(name: str) -> str:
    return f'batch.columns["{name}"]'


def random_array(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Any values of a wire dtype (NaN and inf included for floats; 0/1 for bool)."""
    if dtype == np.dtype("?"):
        return rng.integers(0, 2, size=shape).astype(bool)
    size = math.prod(shape) * dtype.itemsize
    return np.frombuffer(rng.bytes(size), dtype=dtype).reshape(shape).copy()


def valid_columns(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        name: random_array(rng, dtype, (n, *shape)) for name, (dtype, shape) in SIGNATURE.items()
    }


def raw_tensor(dtype: int, shape, data: bytes) -> tensor_pb2.Tensor:
    tensor = tensor_pb2.Tensor(dtype=dtype, data=data)
    tensor.shape[:] = list(shape)
    return tensor


def bad_dtype_codes() -> st.SearchStrategy[int]:
    """DType values no receiver accepts: UNSPECIFIED, past the last one, negative (open enum)."""
    return st.one_of(
        st.just(0),
        st.integers(max(WIRE_DTYPES) + 1, 2**31 - 1),
        st.integers(-(2**31), -1),
    )


def wrong_length(expected: int) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=max(64, expected + 16)).filter(lambda b: len(b) != expected)


@dataclass
class Expect:
    code: grpc.StatusCode
    fields: tuple[str, ...] = ()  # the message starts with one of these, then ':'
    mention: tuple[str, ...] = ()  # and mentions each of these


def check_status(error: grpc.RpcError | None, expect: Expect) -> None:
    code = OK if error is None else error.code()
    details = "" if error is None else error.details() or ""
    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), details
    assert code == expect.code, f"got {code.name} {details!r}, expected {expect.code.name}"
    if expect.code != OK and expect.fields:
        assert any(details.startswith(f"{f}:") for f in expect.fields), (
            f"{details!r} does not start with any of {expect.fields}"
        )
    for word in expect.mention:
        assert word in details, f"{details!r} does not mention {word!r}"


def call(fn, *args, **kwargs):
    """(result, None) or (None, the RpcError)."""
    try:
        return fn(*args, timeout=10, **kwargs), None
    except grpc.RpcError as error:
        return None, error


def check_served(replay: Replay) -> None:
    assert healthy(replay.channel, "") and healthy(replay.channel, "apexrl.v1.Replay")


# --- Insert ------------------------------------------------------------------------------------


@dataclass
class InsertCase:
    kind: str
    request: replay_pb2.InsertRequest
    expect: Expect
    columns: dict | None = None  # the decoded items, when the insert is valid
    priorities: np.ndarray | None = None


INSERT_KINDS = [
    "valid",
    "wrong dtype",
    "wrong item shape",
    "ragged columns",
    "missing columns",
    "extra column",
    "scalar column",
    "random bytes",
    "invalid dtype enum",
    "negative dim",
    "huge dims",
    "many dims",
    "bad priority values",
    "priorities length",
    "priorities dtype",
    "priorities ndim",
    "priorities random bytes",
    "priorities dtype enum",
    "priorities negative dim",
    "empty batch",
    "oversized batch",
    "unknown table",  # on top of any of the above: the table is checked first
]


@st.composite
def insert_cases(draw, kind: str) -> InsertCase:
    unknown_table = kind == "unknown table"
    if unknown_table:
        kind = draw(st.sampled_from(INSERT_KINDS[:-1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 8))
    if kind == "empty batch":
        n = 0
    elif kind == "oversized batch":
        n = draw(st.integers(MAX_BATCH + 1, 3 * CAPACITY))
    columns = valid_columns(rng, n)
    priorities = None
    if draw(st.booleans()):
        priorities = rng.uniform(0.01, 10.0, n)
        priorities[rng.random(n) < 0.2] = 0.0  # zero is a valid priority
        priorities = priorities.astype(draw(st.sampled_from(["<f4", "<f8"])))
    request = insert_request(TABLE, columns, priorities)
    c = draw(st.sampled_from(sorted(SIGNATURE)))
    dtype, shape = SIGNATURE[c]
    tensor = request.batch.columns[c]
    expect = Expect(INVALID, (column(c),))

    if kind == "valid":
        expect = Expect(OK)
    elif kind == "wrong dtype":
        other = draw(st.sampled_from([d for d in WIRE_DTYPES.values() if d != dtype]))
        tensors.to_proto(random_array(rng, other, (n, *shape)), tensor)
    elif kind == "wrong item shape":
        item = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        item = (*item, 1) if item == shape else item
        tensors.to_proto(random_array(rng, dtype, (n, *item)), tensor)
    elif kind == "ragged columns":
        m = draw(st.integers(0, 40).filter(lambda m: m != n))
        tensors.to_proto(random_array(rng, dtype, (m, *shape)), tensor)
        # Reported on whichever of the two disagreeing columns the server meets second.
        expect = Expect(INVALID, tuple(column(name) for name in SIGNATURE), (c,))
    elif kind == "missing columns":
        removed = draw(st.lists(st.sampled_from(sorted(SIGNATURE)), min_size=1, unique=True))
        for name in removed:
            del request.batch.columns[name]
        fields = ("batch.columns",) if len(removed) == len(SIGNATURE) else ()
        expect = Expect(INVALID, fields or tuple(column(name) for name in removed))
    elif kind == "extra column":
        name = draw(names().filter(lambda s: s not in SIGNATURE))
        other = draw(st.sampled_from(list(WIRE_DTYPES.values())))
        item = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
        tensors.to_proto(random_array(rng, other, (n, *item)), request.batch.columns[name])
        expect = Expect(INVALID, (column(name),))
    elif kind == "scalar column":
        tensors.to_proto(random_array(rng, dtype, ()), tensor)
    elif kind == "random bytes":
        tensor.data = draw(wrong_length(len(tensor.data)))
        expect = Expect(INVALID, (f"{column(c)}.data",))
    elif kind == "invalid dtype enum":
        tensor.dtype = draw(bad_dtype_codes())
        expect = Expect(INVALID, (f"{column(c)}.dtype",))
    elif kind == "negative dim":
        dims = list(tensor.shape)
        dims[draw(st.integers(0, len(dims) - 1))] = draw(st.integers(-(2**63), -1))
        tensor.shape[:] = dims
        expect = Expect(INVALID, (f"{column(c)}.shape",))
    elif kind == "huge dims":
        # No zero dimension (that is the reshape bug reproduced below): the sizes can't match.
        huge = draw(st.lists(st.integers(2**31, 2**63 - 1), min_size=1, max_size=3))
        small = draw(st.lists(st.integers(1, 2**63 - 1), max_size=2))
        dims = draw(st.permutations([*huge, *small]))
        tensor.shape[:] = [n, *dims] if draw(st.booleans()) else dims
        # Dimensions above 2^48 are refused by shape, the others because the bytes can't match.
        expect = Expect(INVALID, (f"{column(c)}.data", f"{column(c)}.shape"))
    elif kind == "many dims":
        # Up to numpy's 64 dimensions: more is the reshape bug reproduced below.
        ones = draw(st.integers(1, 64 - 1 - len(shape)))
        at = draw(st.integers(1, len(shape) + 1))
        dims = [n, *shape]
        tensor.shape[:] = dims[:at] + [1] * ones + dims[at:]
        if len(tensor.shape) > 32:  # apexrl.common.tensors.MAX_DIMS
            expect = Expect(INVALID, (f"{column(c)}.shape",))
    elif kind == "bad priority values":
        p = np.asarray(rng.uniform(0.0, 10.0, n))
        bad = st.one_of(
            st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1e-30, -3e38, -1e300]),
            st.floats(max_value=-1e-30),
            st.floats(allow_nan=True, allow_infinity=True),  # the oracle below decides
        )
        for i in draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n)):
            p[i] = draw(bad)
        with np.errstate(over="ignore"):
            p = p.astype(draw(st.sampled_from(["<f4", "<f8"])))
        tensors.to_proto(p, request.priorities)
        ok = bool(np.all(np.isfinite(p) & (p >= 0)))
        expect = Expect(OK) if ok else Expect(INVALID, ("priorities",))
        priorities = p
    elif kind == "priorities length":
        m = draw(st.integers(0, 40).filter(lambda m: m != n))
        tensors.to_proto(np.ones(m), request.priorities)
        expect = Expect(INVALID, ("priorities",))
    elif kind == "priorities dtype":
        other = draw(
            st.sampled_from([d for d in WIRE_DTYPES.values() if d.kind != "f" or d.itemsize == 2])
        )
        tensors.to_proto(random_array(rng, other, (n,)), request.priorities)
        expect = Expect(INVALID, ("priorities",))
    elif kind == "priorities ndim":
        dims = draw(st.sampled_from([(), (n, 1), (1, n), (n, 1, 1)]))
        tensors.to_proto(np.ones(dims), request.priorities)
        expect = Expect(INVALID, ("priorities",))
    elif kind == "priorities random bytes":
        request.priorities.CopyFrom(tensors.to_proto(np.ones(n)))
        request.priorities.data = draw(wrong_length(8 * n))
        expect = Expect(INVALID, ("priorities.data",))
    elif kind == "priorities dtype enum":
        request.priorities.CopyFrom(tensors.to_proto(np.ones(n)))
        request.priorities.dtype = draw(bad_dtype_codes())
        expect = Expect(INVALID, ("priorities.dtype",))
    elif kind == "priorities negative dim":
        request.priorities.CopyFrom(tensors.to_proto(np.ones(n)))
        request.priorities.shape[:] = [draw(st.integers(-(2**63), -1))]
        expect = Expect(INVALID, ("priorities.shape",))
    elif kind in ("empty batch", "oversized batch"):
        expect = Expect(INVALID, ("batch",))

    if unknown_table:
        request.table = draw(names().filter(lambda s: s != TABLE))
        expect = Expect(NOT_FOUND, ("table",))
    if expect.code == OK:
        return InsertCase(kind, request, expect, columns, priorities)
    return InsertCase(kind, request, expect)


@st.composite
def valid_inserts(draw) -> InsertCase:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 4))
    columns = valid_columns(rng, n)
    priorities = rng.uniform(0.1, 5.0, n) if draw(st.booleans()) else None
    return InsertCase(
        "valid", insert_request(TABLE, columns, priorities), Expect(OK), columns, priorities
    )


@pytest.mark.parametrize("kind", INSERT_KINDS)
@fuzz(14)
@given(data=st.data())
def test_insert(replay, kind, data):
    """A stream of valid inserts then one generated request: the valid ones are acked and stay,
    the generated one gets its documented status; nothing else changes."""
    prefix = data.draw(st.lists(valid_inserts(), max_size=2), "valid inserts before it")
    case = data.draw(insert_cases(kind), "request")
    table = replay.table
    state, before = read_state(table), table.digest()
    acks = []
    CASES["Insert"] += 1
    try:
        for ack in replay.stub.Insert(
            iter([*(p.request for p in prefix), case.request]), timeout=10
        ):
            acks.append(ack)
        error = None
    except grpc.RpcError as err:
        error = err
    event(case.expect.code.name)
    check_status(error, case.expect)
    accepted = [*prefix, case] if case.expect.code == OK else prefix
    assert len(acks) == len(accepted)
    for ack, item in zip(acks, accepted, strict=True):
        n = len(next(iter(item.columns.values())))
        assert (ack.inserted, ack.first_key) == (n, state.counters["inserts"])
        state = apply_insert(state, item.columns, item.priorities)
        assert ack.table_size == min(state.counters["inserts"], CAPACITY)
    assert_state(table, state)
    assert (table.digest() == before) == (not accepted)
    check_served(replay)


# --- Sample and SampleStream -------------------------------------------------------------------


SAMPLE_TARGETS = ["valid", "table", "batch_size", "beta", "anything"]


def sample_requests(target: str) -> st.SearchStrategy[replay_pb2.SampleRequest]:
    """Requests with `target` malformed (and the rest valid), or with anything anywhere."""
    good = {
        "table": st.just(TABLE),
        "batch_size": st.integers(1, MAX_BATCH),
        "beta": st.one_of(st.floats(0.0, 1.0), st.sampled_from([-0.0, 0.0, 1.0, 5e-324])),
    }
    bad = {
        "table": names().filter(lambda s: s != TABLE),
        "batch_size": st.one_of(
            st.sampled_from([0, MAX_BATCH + 1, CAPACITY, CAPACITY + 1, 2**31, 2**32 - 1]),
            st.integers(MAX_BATCH + 1, 2**32 - 1),
        ),
        "beta": st.one_of(
            st.sampled_from([math.nextafter(1.0, 2.0), -5e-324, -1.0, 2.0, 1e308, -1e308]),
            st.sampled_from([math.nan, -math.nan, math.inf, -math.inf]),
            st.floats(allow_nan=True, allow_infinity=True).filter(lambda b: not 0 <= b <= 1),
        ),
    }
    fields = {
        name: st.one_of(good[name], bad[name])
        if target == "anything"
        else (bad if name == target else good)[name]
        for name in good
    }
    return st.builds(replay_pb2.SampleRequest, **fields)


def sample_expect(request: replay_pb2.SampleRequest) -> Expect:
    if request.table != TABLE:
        return Expect(NOT_FOUND, ("table",))
    if not 1 <= request.batch_size <= MAX_BATCH:
        return Expect(INVALID, ("batch_size",))
    if not 0.0 <= request.beta <= 1.0:
        return Expect(INVALID, ("beta",))
    return Expect(OK)


def check_sampled(table, response: replay_pb2.SampleResponse, batch_size: int) -> None:
    """A sampled batch: live keys, each row the stored item, P > 0, weights in (0, 1], max 1."""
    keys = tensors.from_proto(response.keys, "keys")
    probabilities = tensors.from_proto(response.probabilities, "probabilities")
    weights = tensors.from_proto(response.weights, "weights")
    assert keys.shape == probabilities.shape == weights.shape == (batch_size,)
    assert live_keys(keys, table.inserts).all()
    assert response.table_size == min(table.inserts, CAPACITY)
    for name, array in tensors.batch_from_proto(response.batch).items():
        assert array.tobytes() == table.columns[name][keys % CAPACITY].tobytes()
    assert np.all(probabilities > 0) and np.all(probabilities <= 1)
    assert np.all(np.isfinite(weights)) and weights.max() == 1.0 and np.all(weights > 0)


@pytest.mark.parametrize("target", SAMPLE_TARGETS)
@fuzz(30)
@given(data=st.data())
def test_sample(refilled, target, data):
    replay = refilled
    request = data.draw(sample_requests(target), "request")
    table = replay.table
    state, before = read_state(table), table.digest()
    expect = sample_expect(request)
    event(expect.code.name)
    CASES["Sample"] += 1
    response, error = call(replay.stub.Sample, request)
    check_status(error, expect)
    if expect.code == OK:
        check_sampled(table, response, request.batch_size)
        state.counters["samples"] += request.batch_size  # the only change a sample makes
    else:
        assert table.digest() == before
    assert_state(table, state)
    check_served(replay)


@pytest.mark.parametrize("target", SAMPLE_TARGETS)
@fuzz(20)
@given(data=st.data())
def test_sample_stream(refilled, target, data):
    replay = refilled
    sample = data.draw(sample_requests(target), "sample")
    max_batches = data.draw(st.sampled_from([0, 1, 2, 3, 2**64 - 1]), "max_batches")
    table = replay.table
    state, before = read_state(table), table.digest()
    expect = sample_expect(sample)
    if expect.code == OK and not 1 <= max_batches <= 3:
        max_batches = 2  # an endless valid stream is the cancellation test below
    request = replay_pb2.SampleStreamRequest(sample=sample, max_batches=max_batches)
    CASES["SampleStream"] += 1
    responses, error = call(
        lambda r, timeout: list(replay.stub.SampleStream(r, timeout=timeout)), request
    )
    check_status(error, expect)
    if expect.code == OK:
        assert len(responses) == max_batches
        for response in responses:
            check_sampled(table, response, sample.batch_size)
        state.counters["samples"] += sample.batch_size * max_batches
    else:
        assert table.digest() == before
    assert_state(table, state)
    check_served(replay)


@pytest.mark.parametrize("max_batches", [0, 2**64 - 1])
def test_endless_sample_stream_ends_when_the_client_cancels(refilled, max_batches):
    replay = refilled
    table = replay.table
    samples = table.samples
    request = replay_pb2.SampleStreamRequest(
        sample=replay_pb2.SampleRequest(table=TABLE, batch_size=5, beta=0.5),
        max_batches=max_batches,
    )
    CASES["SampleStream"] += 1
    stream = replay.stub.SampleStream(request, timeout=10)
    for _, response in zip(range(3), stream, strict=False):
        check_sampled(table, response, 5)
    stream.cancel()

    def settled() -> bool:  # the server stops producing once it sees the cancellation
        seen = table.samples
        time.sleep(0.1)
        return table.samples == seen

    wait_for(settled, 10, "the cancelled stream to stop sampling")
    assert (table.samples - samples) % 5 == 0 and table.samples - samples >= 15
    check_served(replay)


# --- UpdatePriorities --------------------------------------------------------------------------

UPDATE_KINDS = [
    "valid",
    "repeated keys",
    "other shard",
    "negative key",
    "key dtype",
    "key ndim",
    "empty",
    "length mismatch",
    "bad priority values",
    "priorities dtype",
    "priorities ndim",
    "keys random bytes",
    "priorities random bytes",
    "keys dtype enum",
    "priorities dtype enum",
    "keys unset",
    "priorities unset",
    "keys negative dim",
    "priorities negative dim",
    "unknown table",  # on top of any of the above: the table is checked first
]


@pytest.mark.parametrize("kind", UPDATE_KINDS)
@fuzz(14)
@given(data=st.data())
def test_update_priorities(replay, kind, data):
    """Keys anywhere (live, stale, never written, up to 2^64 - 1, repeated): stale and
    never-written keys are counted, not refused; every malformed request is refused."""
    table = replay.table
    inserts = table.inserts
    unknown_table = kind == "unknown table"
    if unknown_table:
        kind = data.draw(st.sampled_from(UPDATE_KINDS[:-1]), "kind")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), "seed"))
    n = data.draw(st.integers(1, 40), "n")
    key_dtype = data.draw(st.sampled_from(["<i8", "<u8"]), "key dtype")
    key_values = st.one_of(
        st.integers(max(0, inserts - CAPACITY), inserts - 1),  # live
        st.integers(0, inserts - 1),  # mostly stale
        st.integers(inserts, inserts + 100),  # never written (yet)
        st.integers(0, 2**48 - 1),  # anywhere in this replay's (shard 0's) key space
        # Top bits naming no shard (> 32767): beyond every table, so stale.
        *([st.integers(2**63, 2**64 - 1)] if key_dtype == "<u8" else []),
    )
    if kind == "repeated keys":  # a few live and stale keys, each many times
        few = st.lists(key_values, min_size=1, max_size=3, unique=True)
        key_values = st.sampled_from(data.draw(few, "repeated"))
    keys = np.array(
        data.draw(st.lists(key_values, min_size=n, max_size=n), "keys"), dtype=key_dtype
    )
    p_dtype = data.draw(st.sampled_from(["<f4", "<f8"]), "priority dtype")
    extremes = [0.0, 5e-324, 1e-300, 1e300] if p_dtype == "<f8" else [0.0, 1e-45, 1e-38, 3e38]
    values = st.one_of(st.floats(0.0, 100.0), st.sampled_from(extremes))
    with np.errstate(over="ignore"):
        priorities = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), dtype=p_dtype)
    request = replay_pb2.UpdatePrioritiesRequest(table=TABLE)
    tensors.to_proto(keys, request.keys)
    tensors.to_proto(priorities, request.priorities)
    expect = Expect(INVALID, ("keys",))

    if kind in ("valid", "repeated keys"):
        expect = Expect(OK)
    elif kind == "other shard":  # keys of shards 1 .. 32767: refused, naming the shard
        for i in data.draw(st.lists(st.integers(0, n - 1), min_size=1), "other shard at"):
            keys[i] = (data.draw(st.integers(1, 2**15 - 1)) << 48) | data.draw(
                st.integers(0, 2**48 - 1)
            )
        tensors.to_proto(keys, request.keys)
        expect = Expect(INVALID, ("keys",), ("belongs to shard", "this replay is shard 0"))
    elif kind == "negative key":
        keys = keys.astype(np.int64)
        for i in data.draw(st.lists(st.integers(0, n - 1), min_size=1), "negative at"):
            keys[i] = data.draw(st.integers(-(2**63), -1))
        tensors.to_proto(keys, request.keys)
    elif kind == "key dtype":
        other = data.draw(
            st.sampled_from([d for d in WIRE_DTYPES.values() if d.str not in ("<i8", "<u8")])
        )
        tensors.to_proto(random_array(rng, other, (n,)), request.keys)
    elif kind == "key ndim":
        dims = data.draw(st.sampled_from([(), (n, 1), (1, n), (n, 1, 1)]))
        tensors.to_proto(np.zeros(dims, np.int64), request.keys)
    elif kind == "empty":
        tensors.to_proto(np.zeros(0, np.int64), request.keys)
        tensors.to_proto(np.zeros(data.draw(st.integers(0, 3))), request.priorities)
    elif kind == "length mismatch":
        m = data.draw(st.integers(0, 50).filter(lambda m: m != n))
        tensors.to_proto(np.ones(m), request.priorities)
        expect = Expect(INVALID, ("priorities",))
    elif kind == "bad priority values":
        p = priorities.astype(np.float64)
        bad = st.one_of(
            st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1e-30]),
            st.floats(max_value=-1e-30),
            st.floats(allow_nan=True, allow_infinity=True),
        )
        for i in data.draw(st.lists(st.integers(0, n - 1), min_size=1), "bad at"):
            p[i] = data.draw(bad)
        with np.errstate(over="ignore"):
            p = p.astype(p_dtype)
        tensors.to_proto(p, request.priorities)
        ok = bool(np.all(np.isfinite(p) & (p >= 0)))
        expect = Expect(OK) if ok else Expect(INVALID, ("priorities",))
        priorities = p
    elif kind == "priorities dtype":
        other = data.draw(
            st.sampled_from([d for d in WIRE_DTYPES.values() if d.kind != "f" or d.itemsize == 2])
        )
        tensors.to_proto(random_array(rng, other, (n,)), request.priorities)
        expect = Expect(INVALID, ("priorities",))
    elif kind == "priorities ndim":
        dims = data.draw(st.sampled_from([(), (n, 1), (1, n)]))
        tensors.to_proto(np.ones(dims), request.priorities)
        expect = Expect(INVALID, ("priorities",))
    elif kind in ("keys random bytes", "priorities random bytes"):
        target = request.keys if kind.startswith("keys") else request.priorities
        target.data = data.draw(wrong_length(len(target.data)))
        expect = Expect(INVALID, (f"{kind.split()[0]}.data",))
    elif kind in ("keys dtype enum", "priorities dtype enum"):
        target = request.keys if kind.startswith("keys") else request.priorities
        target.dtype = data.draw(bad_dtype_codes())
        expect = Expect(INVALID, (f"{kind.split()[0]}.dtype",))
    elif kind in ("keys unset", "priorities unset"):
        request.ClearField(kind.split()[0])
        expect = Expect(INVALID, (f"{kind.split()[0]}.dtype",))
    elif kind in ("keys negative dim", "priorities negative dim"):
        target = request.keys if kind.startswith("keys") else request.priorities
        target.shape[:] = [data.draw(st.integers(-(2**63), -1))]
        expect = Expect(INVALID, (f"{kind.split()[0]}.shape",))
    if unknown_table:
        request.table = data.draw(names().filter(lambda s: s != TABLE), "table")
        expect = Expect(NOT_FOUND, ("table",))

    state, before = read_state(table), table.digest()
    event(expect.code.name)
    rpc = data.draw(st.sampled_from(["UpdatePriorities", "UpdatePrioritiesStream"]), "rpc")
    CASES[rpc] += 1
    if rpc == "UpdatePriorities":
        response, error = call(replay.stub.UpdatePriorities, request)
    else:  # the stream the shipping client uses: the same answer, or the same error
        answers, error = call(
            lambda r, timeout: list(replay.stub.UpdatePrioritiesStream(iter([r]), timeout=timeout)),
            request,
        )
        response = answers[0] if answers else None
    check_status(error, expect)
    if expect.code == OK:
        live = live_keys(keys, inserts)
        assert (response.updated, response.stale) == (live.sum(), n - live.sum())
        p = priorities.astype(np.float64)
        last = {}  # slot -> priority; in request order, so the last one wins
        for key, value in zip(keys[live], p[live], strict=True):
            last[int(key) % CAPACITY] = value
        for slot, value in last.items():
            state.priorities[slot] = value
        if last:
            state.counters["max_priority"] = max(state.counters["max_priority"], max(last.values()))
        state.counters["priority_updates"] += int(live.sum())
        state.counters["stale_priority_updates"] += int(n - live.sum())
    else:
        assert table.digest() == before
    assert_state(table, state)
    check_served(replay)


# --- Info and Checkpoint -----------------------------------------------------------------------


@fuzz(20)
@given(include_digest=st.booleans())
def test_info(replay, include_digest):
    table = replay.table
    before = table.digest()
    CASES["Info"] += 1
    response, error = call(replay.stub.Info, replay_pb2.InfoRequest(include_digest=include_digest))
    check_status(error, Expect(OK))
    (info,) = response.tables
    assert (info.name, info.capacity, info.size) == (TABLE, CAPACITY, min(table.inserts, CAPACITY))
    assert (info.inserts, info.samples) == (table.inserts, table.samples)
    assert info.digest == (before if include_digest else "")
    assert table.digest() == before
    check_served(replay)


def test_checkpoint_without_a_directory_is_failed_precondition(replay):
    before = replay.table.digest()
    for _ in range(3):
        CASES["Checkpoint"] += 1
        _, error = call(replay.stub.Checkpoint, replay_pb2.CheckpointRequest())
        check_status(error, Expect(FAILED, ("checkpoint_dir",)))
    assert replay.table.digest() == before
    check_served(replay)


# --- raw request bytes -------------------------------------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@st.composite
def wire_messages(draw) -> bytes:
    """Well-formed protobuf wire fields with arbitrary numbers, types and payloads: they parse as
    any message unless they hit a known field with an unparseable payload (filtered out)."""
    out = b""
    for _ in range(draw(st.integers(0, 6))):
        number = draw(st.one_of(st.integers(1, 8), st.integers(1, 2**29 - 1)))
        wire_type = draw(st.sampled_from([0, 1, 2, 5]))
        out += varint(number << 3 | wire_type)
        if wire_type == 0:
            out += varint(draw(st.integers(0, 2**64 - 1)))
        elif wire_type == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif wire_type == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        else:
            payload = draw(st.one_of(st.binary(max_size=40), st.text(max_size=20).map(str.encode)))
            out += varint(len(payload)) + payload
    return out


def parses_as(message_type, data: bytes):
    try:
        return message_type.FromString(data)
    except Exception:
        return None


@pytest.mark.parametrize("method", sorted(REPLAY_METHODS))
@fuzz(20)
@given(data=st.data())
def test_parseable_request_bytes(replay, method, data):
    """Arbitrary parseable bytes to every replay method: the status its fields call for."""
    message_type = REPLAY_METHODS[method]
    payload = data.draw(wire_messages().filter(lambda b: parses_as(message_type, b) is not None))
    parsed = parses_as(message_type, payload)
    table_name = parsed.sample.table if method == "SampleStream" else getattr(parsed, "table", None)
    if table_name == TABLE:  # a valid request by chance (all but impossible): not this test's
        return
    expect = {
        "Info": Expect(OK),
        "Checkpoint": Expect(FAILED, ("checkpoint_dir",)),
    }.get(method, Expect(NOT_FOUND, ("table",)))
    before = replay.table.digest()
    event(f"{len(payload) // 10 * 10}+ bytes")
    CASES[method] += 1
    _, error = call(replay.raw(method), payload)
    check_status(error, expect)
    assert replay.table.digest() == before
    check_served(replay)


# --- messages above the size limit -------------------------------------------------------------


def oversized(limit_mb: int) -> bytes:
    """A message just over the limit that parses as any message: one big unknown field."""
    payload = b"\x00" * (limit_mb * 1024 * 1024 + 1024)
    return varint(1000 << 3 | 2) + varint(len(payload)) + payload


@pytest.mark.parametrize("method", sorted(REPLAY_METHODS))
def test_message_above_the_size_limit_is_resource_exhausted(replay, method):
    before = replay.table.digest()
    CASES[method] += 1
    _, error = call(replay.raw(method), oversized(MAX_MESSAGE_MB))
    check_status(error, Expect(EXHAUSTED))
    assert replay.table.digest() == before
    check_served(replay)


def test_typed_oversized_insert_and_update_are_resource_exhausted(replay):
    before = replay.table.digest()
    n = MAX_MESSAGE_MB * 1024 * 1024 // 8 + 10
    big = insert_request(TABLE, {"obs": np.zeros((n, 4), np.float32)}, None)
    CASES["Insert"] += 1
    _, error = call(lambda r, timeout: list(replay.stub.Insert(iter([r]), timeout=timeout)), big)
    check_status(error, Expect(EXHAUSTED))
    update = replay_pb2.UpdatePrioritiesRequest(
        table=TABLE,
        keys=tensors.to_proto(np.zeros(n, np.int64)),
        priorities=tensors.to_proto(np.ones(n)),
    )
    CASES["UpdatePriorities"] += 1
    _, error = call(replay.stub.UpdatePriorities, update)
    check_status(error, Expect(EXHAUSTED))
    assert replay.table.digest() == before
    check_served(replay)


# --- Learner.GetParameters ---------------------------------------------------------------------


@fuzz(120)
@given(
    have_version=st.one_of(st.sampled_from([0, 1, 2, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1)),
    actor_id=st.one_of(
        st.just(""),
        names(),
        st.text(min_size=120, max_size=140),
        st.text(alphabet="ab", min_size=128, max_size=129),
    ),
    have_lineage=st.one_of(st.sampled_from([0, 1, 2**64 - 1, None]), st.integers(0, 2**64 - 1)),
)
def test_get_parameters(learner, have_version, actor_id, have_lineage):
    """Any version and lineage are fine (above the newest: the learner restarted from an older
    checkpoint); an actor_id over 128 characters is INVALID_ARGUMENT naming it."""
    lineage = learner.store.lineage
    have_lineage = lineage if have_lineage is None else have_lineage  # None: the current one
    request = learner_pb2.GetParametersRequest(
        have_version=have_version, actor_id=actor_id, have_lineage=have_lineage
    )
    CASES["GetParameters"] += 1
    response, error = call(learner.stub.GetParameters, request)
    if len(actor_id) > 128:
        check_status(error, Expect(INVALID, ("actor_id",)))
    else:
        check_status(error, Expect(OK))
        assert (response.version, response.update_step, response.lineage) == (1, 7, lineage)
        current = (have_version, have_lineage) == (1, lineage)
        assert (set(response.parameters) == {"w", "b"}) == (not current)
        assert response.lease_seconds == 30.0
        if actor_id:
            assert 0 <= response.actor_index < response.num_actors
            assert response.epsilon == epsilon_ladder(response.actor_index, response.num_actors)
            assert response.exploration == response.epsilon and response.algorithm == "dqn"
        else:
            assert (response.actor_index, response.num_actors, response.epsilon) == (0, 0, 0.0)
    assert healthy(learner.channel, "") and healthy(learner.channel, "apexrl.v1.Learner")


def test_get_parameters_message_above_the_size_limit(learner):
    CASES["GetParameters"] += 1
    _, error = call(
        learner.channel.unary_unary("/apexrl.v1.Learner/GetParameters"),
        oversized(LEARNER_MAX_MESSAGE_MB),
    )
    check_status(error, Expect(EXHAUSTED))
    assert healthy(learner.channel, "apexrl.v1.Learner")


def test_get_parameters_before_the_first_version_is_unavailable(tmp_path):
    with (
        learner_server(tmp_path, publish=False) as (address, _, _),
        client_channel(address) as channel,
    ):
        CASES["GetParameters"] += 1
        stub = learner_pb2_grpc.LearnerStub(channel)
        _, error = call(stub.GetParameters, learner_pb2.GetParametersRequest(actor_id="a"))
        check_status(error, Expect(grpc.StatusCode.UNAVAILABLE))
        assert healthy(channel, "")


def test_get_parameters_long_poll(tmp_path):
    """wait_seconds: a caller holding the newest version is answered when the next one is
    published, or after the wait without parameters; a bad wait is refused, naming it."""
    with (
        learner_server(tmp_path, publish=True) as (address, store, servicer),
        client_channel(address) as channel,
    ):
        stub = learner_pb2_grpc.LearnerStub(channel)
        for bad in (-1.0, -1e-9, math.nan, math.inf, 60.5):
            CASES["GetParameters"] += 1
            _, error = call(stub.GetParameters, learner_pb2.GetParametersRequest(wait_seconds=bad))
            check_status(error, Expect(INVALID, ("wait_seconds",)))

        def request(version: int, wait: float) -> learner_pb2.GetParametersRequest:
            return learner_pb2.GetParametersRequest(
                have_version=version, have_lineage=store.lineage, wait_seconds=wait
            )

        # Not holding the newest: answered at once, with parameters (the deadline is far
        # below the wait).
        assert set(stub.GetParameters(request(0, 60), timeout=10).parameters) == {"w", "b"}
        # Holding the newest, nothing published: the answer comes after the wait, empty.
        started = time.monotonic()
        response = stub.GetParameters(request(1, 0.3), timeout=10)
        assert time.monotonic() - started >= 0.29
        assert response.version == 1 and not response.parameters
        # A publish while it waits answers it with the new version.
        future = stub.GetParameters.future(request(1, 60), timeout=10)
        wait_for(lambda: servicer.polls.waiting == 1, 10, "the long poll to wait")
        store.publish(LEARNER_ARRAYS, update_step=8)
        response = future.result()
        assert response.version == 2 and set(response.parameters) == {"w", "b"}
        assert servicer.polls.waiting == 0
        assert healthy(channel, "apexrl.v1.Learner")


# --- Learner.ReportEvaluation ------------------------------------------------------------------


@st.composite
def evaluation_parameters(draw) -> tuple[dict[str, tensor_pb2.Tensor], tuple[str, ...]]:
    """(parameters, the fields a refusal may name: () when they are valid)."""
    valid = {name: tensors.to_proto(a) for name, a in LEARNER_ARRAYS.items()}
    fault = draw(st.sampled_from(["none", "missing", "extra", "shape", "dtype", "bytes", "code"]))
    name = draw(st.sampled_from(sorted(LEARNER_ARRAYS)))
    field = f'parameters["{name}"]'
    array = LEARNER_ARRAYS[name]
    if fault == "missing":
        del valid[name]
        return valid, ("parameters",)
    if fault == "extra":
        valid[draw(names().filter(lambda n: n not in LEARNER_ARRAYS))] = valid[name]
        return valid, ("parameters",)
    if fault == "shape":
        shape = draw(
            st.lists(st.integers(0, 4), max_size=3).filter(lambda s: s != list(array.shape))
        )
        valid[name] = tensors.to_proto(np.zeros(shape, np.float32))
    elif fault == "dtype":
        valid[name] = tensors.to_proto(array.astype(draw(st.sampled_from(["f8", "i4", "u1", "?"]))))
    elif fault == "bytes":
        valid[name] = raw_tensor(valid[name].dtype, array.shape, draw(wrong_length(array.nbytes)))
    elif fault == "code":
        valid[name] = raw_tensor(draw(bad_dtype_codes()), array.shape, valid[name].data)
    parts = (field, *(f"{field}.{part}" for part in ("data", "dtype", "shape")))
    return valid, (() if fault == "none" else parts)


@fuzz(120)
@given(
    version=st.one_of(st.just(0), st.integers(1, 2**64 - 1)),
    returns=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=12),
    env=st.one_of(st.just(LEARNER_ENV), names()),
    parameters=evaluation_parameters(),
)
def test_report_evaluation(learner, version, returns, env, parameters):
    """A valid report is kept exactly when its mean beats the best so far; anything else is
    INVALID_ARGUMENT naming the first bad field, and no best-model file changes."""
    from apexrl.common import checkpoint
    from apexrl.learner.best import read_best

    parameters, bad_fields = parameters
    request = learner_pb2.ReportEvaluationRequest(
        version=version, lineage=3, update_step=9, returns=returns, env=env, first_seed=5
    )
    for name, tensor in parameters.items():
        request.parameters[name].CopyFrom(tensor)
    folder = learner.folder / "checkpoints"
    before = checkpoint.checkpoints(folder, "best")
    best_before = read_best(str(folder))
    best_mean = best_before[0]["mean_return"] if best_before else -math.inf
    CASES["ReportEvaluation"] += 1
    response, error = call(learner.stub.ReportEvaluation, request)
    if version == 0:
        expect = ("version",)
    elif not returns or not all(map(math.isfinite, returns)):
        expect = ("returns",)
    elif env != LEARNER_ENV:
        expect = ("env",)
    else:
        expect = bad_fields
    if expect:
        check_status(error, Expect(INVALID, expect))
        assert checkpoint.checkpoints(folder, "best") == before
        return
    check_status(error, Expect(OK))
    mean = float(np.mean(returns))
    assert response.kept == (mean > best_mean)
    meta, arrays = read_best(str(folder))
    if response.kept:
        assert (meta["version"], meta["mean_return"], meta["returns"]) == (version, mean, returns)
        for name, array in LEARNER_ARRAYS.items():
            np.testing.assert_array_equal(arrays[f"online/{name}"], array)
    else:
        assert checkpoint.checkpoints(folder, "best") == before
    assert (response.best_version, response.best_mean_return) == (
        meta["version"],
        meta["mean_return"],
    )
    assert healthy(learner.channel, "apexrl.v1.Learner")


# --- bugs the first run of this suite found (fixed): minimal reproductions ---------------------


def _insert_with(replay: Replay, mutate) -> tuple[grpc.RpcError | None, str]:
    before = replay.table.digest()
    request = insert_request(TABLE, valid_columns(np.random.default_rng(2), 4), np.ones(4))
    mutate(request)
    CASES["Insert"] += 1
    _, error = call(
        lambda r, timeout: list(replay.stub.Insert(iter([r]), timeout=timeout)), request
    )
    return error, before


NUMPY_RESHAPE_BUG = (
    "tensors.from_proto reshapes without catching numpy's ValueError (more than 64 dimensions, "
    "or a zero-size shape whose other dimensions overflow): the call ends UNKNOWN"
)


@pytest.mark.parametrize(
    "shape",
    [[4] + [1] * 64 + [4], [4, 0, 2**62, 2**62]],
    ids=["66 dims", "zero-size with huge dims"],
)
def test_insert_tensor_numpy_cannot_shape_is_invalid_argument(replay, shape):
    def mutate(request):
        tensor = request.batch.columns["obs"]
        tensor.shape[:] = shape
        if 0 in shape:
            tensor.data = b""

    error, before = _insert_with(replay, mutate)
    assert replay.table.digest() == before
    check_served(replay)
    check_status(error, Expect(INVALID, (f"{column('obs')}.shape", column("obs"))))


@pytest.mark.parametrize("field", ["keys", "priorities"])
def test_update_tensor_numpy_cannot_shape_is_invalid_argument(replay, field):
    request = replay_pb2.UpdatePrioritiesRequest(
        table=TABLE,
        keys=tensors.to_proto(np.zeros(1, np.int64)),
        priorities=tensors.to_proto(np.ones(1)),
    )
    getattr(request, field).shape[:] = [1] * 65
    before = replay.table.digest()
    CASES["UpdatePriorities"] += 1
    _, error = call(replay.stub.UpdatePriorities, request)
    assert replay.table.digest() == before
    check_served(replay)
    check_status(error, Expect(INVALID, (f"{field}.shape", field)))


@pytest.mark.parametrize(
    "payload", [b"\xff\xff\xff", b"\x0a\x02\xc3\x28"], ids=["corrupt", "bad utf-8"]
)
@pytest.mark.parametrize("method", ["Sample", "UpdatePriorities"])
def test_unparseable_request_is_invalid_argument(replay, method, payload):
    before = replay.table.digest()
    CASES[method] += 1
    _, error = call(replay.raw(method), payload)
    assert replay.table.digest() == before
    check_served(replay)
    check_status(error, Expect(INVALID))


@pytest.mark.parametrize("where", ["Sample table", "Insert column name"])
def test_long_names_keep_the_documented_status(replay, where):
    long = "x" * 20_000
    before = replay.table.digest()
    if where == "Sample table":
        CASES["Sample"] += 1
        _, error = call(replay.stub.Sample, replay_pb2.SampleRequest(table=long, batch_size=1))
        expect = Expect(NOT_FOUND, ("table",))
    else:
        error, before = _insert_with(
            replay, lambda r: r.batch.columns[long].CopyFrom(r.batch.columns["reward"])
        )
        # Messages are cut at RequestError.MAX_MESSAGE: the field path is there, shortened.
        assert error.details().startswith(column(long)[:500])
        expect = Expect(INVALID, ())
    assert len(error.details()) <= 1024
    assert replay.table.digest() == before
    check_served(replay)
    check_status(error, expect)


def test_bool_bytes_other_than_0_and_1_are_invalid_argument(replay):
    def mutate(request):
        request.batch.columns["done"].data = b"\x00\x01\x02\xff"

    error, before = _insert_with(replay, mutate)
    check_served(replay)
    check_status(error, Expect(INVALID, (f"{column('done')}.data", column("done"))))

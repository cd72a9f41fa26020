"""The limits every apexrl server sets for hundreds of clients (docs/scaling.md#grpc-limits):
open files raised to the hard limit (a connection is one), and at most MAX_CONCURRENT_STREAMS
calls at once on one connection, on a real learner server."""

import resource
import time

import grpc
import numpy as np

from apexrl.common.parameters import ParameterStore
from apexrl.common.serving import MAX_CONCURRENT_STREAMS, open_files_limit
from apexrl.config import LearnerConfig
from apexrl.v1 import learner_pb2, learner_pb2_grpc
from tests.conftest import serve_learner, wait_for


def test_the_soft_open_files_limit_is_raised_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(256, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
        assert open_files_limit() == hard == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, hard), hard))


def test_a_connection_runs_at_most_the_stream_limit_of_calls_at_once(tmp_path):
    arrays = {"w": np.ones(4, np.float32)}
    store = ParameterStore()
    store.publish(arrays, update_step=0)
    config = LearnerConfig(env="CartPole-v1", checkpoint_dir=str(tmp_path / "ckpt"))
    with serve_learner(tmp_path, store, arrays, config) as (address, servicer):
        # A channel of its own pool: channels to one address share one connection otherwise.
        own = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(address) as busy, grpc.insecure_channel(address, own) as other:
            stub = learner_pb2_grpc.LearnerStub(busy)
            poll = learner_pb2.GetParametersRequest(
                have_version=1, have_lineage=store.lineage, wait_seconds=2.0
            )
            polls = [stub.GetParameters.future(poll, timeout=30) for _ in range(100)]
            assert MAX_CONCURRENT_STREAMS == len(polls)
            wait_for(lambda: servicer.polls.waiting == len(polls), 20, "every long poll waiting")
            plain = learner_pb2.GetParametersRequest()
            queued = stub.GetParameters.future(plain, timeout=30)
            answered = learner_pb2_grpc.LearnerStub(other).GetParameters(plain, timeout=30)
            other_done = time.monotonic()
            refused = queued.exception()  # None once it was answered
            queued_done = time.monotonic()
            ends = []
            for call in polls:
                call.result()
                ends.append(time.monotonic())
    # Another connection is answered at once. The 101st call on the busy one never runs beside
    # its 100 long polls (they hold for 2 s): the server refuses its stream (RST_STREAM
    # REFUSED_STREAM: UNAVAILABLE, which apexrl's clients retry), or it waits for one to end.
    assert answered.version == 1 and servicer.polls.waiting == 0
    assert other_done < min(ends) - 1.0, (other_done, min(ends))
    if refused is None:
        assert queued_done > other_done + 1.0, (queued_done, other_done)
    else:
        assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
        assert "RST_STREAM" in refused.details(), refused.details()

"""LearnerClient: what actors and evaluators ask the learner for."""

from dataclasses import dataclass

import grpc
import numpy as np

from apexrl.common import tensors
from apexrl.common.backoff import RECONNECT_OPTIONS, retry_unavailable
from apexrl.common.serving import message_options
from apexrl.v1 import learner_pb2, learner_pb2_grpc


@dataclass
class Parameters:
    version: int
    update_step: int
    arrays: dict[str, np.ndarray]  # empty when the caller already had this version
    epsilon: float
    actor_index: int
    num_actors: int


class LearnerClient:
    def __init__(self, address: str, *, timeout: float = 10.0, retry_seconds: float | None = 60.0,
                 max_message_mb: int = 512):  # fmt: skip
        self.address, self.timeout, self.retry_seconds = address, timeout, retry_seconds
        self.channel = grpc.insecure_channel(
            address, options=message_options(max_message_mb) + RECONNECT_OPTIONS
        )
        self.stub = learner_pb2_grpc.LearnerStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "LearnerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get_parameters(self, have_version: int = 0, actor_id: str = "") -> Parameters:
        request = learner_pb2.GetParametersRequest(have_version=have_version, actor_id=actor_id)
        response = retry_unavailable(
            lambda: self.stub.GetParameters(request, timeout=self.timeout),
            f"learner {self.address} get_parameters",
            self.retry_seconds,
        )
        return Parameters(
            version=response.version,
            update_step=response.update_step,
            arrays={
                name: tensors.from_proto(t, f'parameters["{name}"]')
                for name, t in response.parameters.items()
            },
            epsilon=response.epsilon,
            actor_index=response.actor_index,
            num_actors=response.num_actors,
        )

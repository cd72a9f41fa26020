from apexrl.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetParametersRequest(_message.Message):
    __slots__ = ("have_version", "actor_id", "have_lineage", "wait_seconds", "in_order", "accept_changes", "lease_only")
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    HAVE_LINEAGE_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IN_ORDER_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_CHANGES_FIELD_NUMBER: _ClassVar[int]
    LEASE_ONLY_FIELD_NUMBER: _ClassVar[int]
    have_version: int
    actor_id: str
    have_lineage: int
    wait_seconds: float
    in_order: bool
    accept_changes: bool
    lease_only: bool
    def __init__(self, have_version: _Optional[int] = ..., actor_id: _Optional[str] = ..., have_lineage: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., in_order: _Optional[bool] = ..., accept_changes: _Optional[bool] = ..., lease_only: _Optional[bool] = ...) -> None: ...

class GetParametersResponse(_message.Message):
    __slots__ = ("version", "parameters", "update_step", "actor_index", "num_actors", "epsilon", "lease_seconds", "lineage", "exploration", "algorithm", "newest_version", "changes_from", "rows")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _tensor_pb2.Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...
    class RowsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _tensor_pb2.Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_STEP_FIELD_NUMBER: _ClassVar[int]
    ACTOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_ACTORS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    EXPLORATION_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    NEWEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FROM_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    version: int
    parameters: _containers.MessageMap[str, _tensor_pb2.Tensor]
    update_step: int
    actor_index: int
    num_actors: int
    epsilon: float
    lease_seconds: float
    lineage: int
    exploration: float
    algorithm: str
    newest_version: int
    changes_from: int
    rows: _containers.MessageMap[str, _tensor_pb2.Tensor]
    def __init__(self, version: _Optional[int] = ..., parameters: _Optional[_Mapping[str, _tensor_pb2.Tensor]] = ..., update_step: _Optional[int] = ..., actor_index: _Optional[int] = ..., num_actors: _Optional[int] = ..., epsilon: _Optional[float] = ..., lease_seconds: _Optional[float] = ..., lineage: _Optional[int] = ..., exploration: _Optional[float] = ..., algorithm: _Optional[str] = ..., newest_version: _Optional[int] = ..., changes_from: _Optional[int] = ..., rows: _Optional[_Mapping[str, _tensor_pb2.Tensor]] = ...) -> None: ...

class ReportEvaluationRequest(_message.Message):
    __slots__ = ("version", "lineage", "update_step", "parameters", "returns", "env", "first_seed", "epsilon")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _tensor_pb2.Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_STEP_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    RETURNS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    version: int
    lineage: int
    update_step: int
    parameters: _containers.MessageMap[str, _tensor_pb2.Tensor]
    returns: _containers.RepeatedScalarFieldContainer[float]
    env: str
    first_seed: int
    epsilon: float
    def __init__(self, version: _Optional[int] = ..., lineage: _Optional[int] = ..., update_step: _Optional[int] = ..., parameters: _Optional[_Mapping[str, _tensor_pb2.Tensor]] = ..., returns: _Optional[_Iterable[float]] = ..., env: _Optional[str] = ..., first_seed: _Optional[int] = ..., epsilon: _Optional[float] = ...) -> None: ...

class ReportEvaluationResponse(_message.Message):
    __slots__ = ("kept", "best_version", "best_mean_return")
    KEPT_FIELD_NUMBER: _ClassVar[int]
    BEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    BEST_MEAN_RETURN_FIELD_NUMBER: _ClassVar[int]
    kept: bool
    best_version: int
    best_mean_return: float
    def __init__(self, kept: _Optional[bool] = ..., best_version: _Optional[int] = ..., best_mean_return: _Optional[float] = ...) -> None: ...

class SetSettingRequest(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class SetSettingResponse(_message.Message):
    __slots__ = ("previous", "update_step")
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_STEP_FIELD_NUMBER: _ClassVar[int]
    previous: float
    update_step: int
    def __init__(self, previous: _Optional[float] = ..., update_step: _Optional[int] = ...) -> None: ...

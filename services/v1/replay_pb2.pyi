from apexrl.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InsertRequest(_message.Message):
    __slots__ = ("table", "batch", "priorities", "max_wait_seconds")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    table: str
    batch: _tensor_pb2.Batch
    priorities: _tensor_pb2.Tensor
    max_wait_seconds: float
    def __init__(self, table: _Optional[str] = ..., batch: _Optional[_Union[_tensor_pb2.Batch, _Mapping]] = ..., priorities: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., max_wait_seconds: _Optional[float] = ...) -> None: ...

class InsertResponse(_message.Message):
    __slots__ = ("inserted", "first_key", "table_size")
    INSERTED_FIELD_NUMBER: _ClassVar[int]
    FIRST_KEY_FIELD_NUMBER: _ClassVar[int]
    TABLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    inserted: int
    first_key: int
    table_size: int
    def __init__(self, inserted: _Optional[int] = ..., first_key: _Optional[int] = ..., table_size: _Optional[int] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("table", "batch_size", "beta")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    table: str
    batch_size: int
    beta: float
    def __init__(self, table: _Optional[str] = ..., batch_size: _Optional[int] = ..., beta: _Optional[float] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("batch", "keys", "probabilities", "weights", "table_size", "total_priority")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TABLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    batch: _tensor_pb2.Batch
    keys: _tensor_pb2.Tensor
    probabilities: _tensor_pb2.Tensor
    weights: _tensor_pb2.Tensor
    table_size: int
    total_priority: float
    def __init__(self, batch: _Optional[_Union[_tensor_pb2.Batch, _Mapping]] = ..., keys: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., probabilities: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., weights: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., table_size: _Optional[int] = ..., total_priority: _Optional[float] = ...) -> None: ...

class SampleStreamRequest(_message.Message):
    __slots__ = ("sample", "max_batches")
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCHES_FIELD_NUMBER: _ClassVar[int]
    sample: SampleRequest
    max_batches: int
    def __init__(self, sample: _Optional[_Union[SampleRequest, _Mapping]] = ..., max_batches: _Optional[int] = ...) -> None: ...

class UpdatePrioritiesRequest(_message.Message):
    __slots__ = ("table", "keys", "priorities")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    table: str
    keys: _tensor_pb2.Tensor
    priorities: _tensor_pb2.Tensor
    def __init__(self, table: _Optional[str] = ..., keys: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., priorities: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class UpdatePrioritiesResponse(_message.Message):
    __slots__ = ("updated", "stale")
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    updated: int
    stale: int
    def __init__(self, updated: _Optional[int] = ..., stale: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ("include_digest",)
    INCLUDE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    include_digest: bool
    def __init__(self, include_digest: _Optional[bool] = ...) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("tables", "shard")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableInfo]
    shard: int
    def __init__(self, tables: _Optional[_Iterable[_Union[TableInfo, _Mapping]]] = ..., shard: _Optional[int] = ...) -> None: ...

class ColumnSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "codec")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: _tensor_pb2.DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    codec: _tensor_pb2.Codec
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[_tensor_pb2.DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., codec: _Optional[_Union[_tensor_pb2.Codec, str]] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("name", "capacity", "size", "signature", "alpha", "min_size_to_sample", "samples_per_insert", "error_buffer", "inserts", "samples", "priority_updates", "stale_priority_updates", "total_priority", "max_priority", "digest", "stored_bytes", "sampler", "remover", "max_times_sampled", "rate_limiter", "removed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_TO_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_INSERT_FIELD_NUMBER: _ClassVar[int]
    ERROR_BUFFER_FIELD_NUMBER: _ClassVar[int]
    INSERTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_UPDATES_FIELD_NUMBER: _ClassVar[int]
    STALE_PRIORITY_UPDATES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    REMOVER_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITER_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    name: str
    capacity: int
    size: int
    signature: _containers.RepeatedCompositeFieldContainer[ColumnSpec]
    alpha: float
    min_size_to_sample: int
    samples_per_insert: float
    error_buffer: float
    inserts: int
    samples: int
    priority_updates: int
    stale_priority_updates: int
    total_priority: float
    max_priority: float
    digest: str
    stored_bytes: int
    sampler: str
    remover: str
    max_times_sampled: int
    rate_limiter: str
    removed: int
    def __init__(self, name: _Optional[str] = ..., capacity: _Optional[int] = ..., size: _Optional[int] = ..., signature: _Optional[_Iterable[_Union[ColumnSpec, _Mapping]]] = ..., alpha: _Optional[float] = ..., min_size_to_sample: _Optional[int] = ..., samples_per_insert: _Optional[float] = ..., error_buffer: _Optional[float] = ..., inserts: _Optional[int] = ..., samples: _Optional[int] = ..., priority_updates: _Optional[int] = ..., stale_priority_updates: _Optional[int] = ..., total_priority: _Optional[float] = ..., max_priority: _Optional[float] = ..., digest: _Optional[str] = ..., stored_bytes: _Optional[int] = ..., sampler: _Optional[str] = ..., remover: _Optional[str] = ..., max_times_sampled: _Optional[int] = ..., rate_limiter: _Optional[str] = ..., removed: _Optional[int] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("path", "size_bytes", "seconds")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    seconds: float
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

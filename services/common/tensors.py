"""numpy <-> apexrl.v1.Tensor / Batch: raw little-endian bytes, dtype and shape; never pickle."""

import math
from collections.abc import Mapping

import numpy as np

from apexrl.common.codec import Packed
from apexrl.common.errors import InvalidArgument
from apexrl.v1 import tensor_pb2

_DTYPES: list[tuple[tensor_pb2.DType, np.dtype]] = [
    (tensor_pb2.FLOAT32, np.dtype("<f4")),
    (tensor_pb2.FLOAT64, np.dtype("<f8")),
    (tensor_pb2.FLOAT16, np.dtype("<f2")),
    (tensor_pb2.INT8, np.dtype("i1")),
    (tensor_pb2.INT16, np.dtype("<i2")),
    (tensor_pb2.INT32, np.dtype("<i4")),
    (tensor_pb2.INT64, np.dtype("<i8")),
    (tensor_pb2.UINT8, np.dtype("u1")),
    (tensor_pb2.UINT16, np.dtype("<u2")),
    (tensor_pb2.UINT32, np.dtype("<u4")),
    (tensor_pb2.UINT64, np.dtype("<u8")),
    (tensor_pb2.BOOL, np.dtype("?")),
]
_TO_NUMPY: dict[int, np.dtype] = dict(_DTYPES)
# numpy's own limit is 64 dimensions; no column needs more than a few.
MAX_DIMS = 32
# Larger dimensions cannot be real (the data would not fit a message) and would only overflow
# numpy when another dimension is 0.
MAX_DIM = 2**48

_FROM_NUMPY = {dtype.newbyteorder("="): code for code, dtype in _DTYPES}


def dtype_to_proto(dtype: np.dtype) -> tensor_pb2.DType:
    """The DType enum value for a numpy dtype; ValueError for dtypes the wire cannot carry."""
    code = _FROM_NUMPY.get(np.dtype(dtype).newbyteorder("="))
    if code is None:
        raise ValueError(f"dtype {np.dtype(dtype)} has no apexrl.v1.DType")
    return code


def dtype_from_proto(code: int, field: str) -> np.dtype:
    dtype = _TO_NUMPY.get(code)
    if dtype is None:
        name = tensor_pb2.DType.Name(code) if code in tensor_pb2.DType.values() else code
        raise InvalidArgument(f"{field}.dtype", f"unsupported dtype {name}")
    return dtype


_CODECS = {"zstd": tensor_pb2.ZSTD}
_CODEC_NAMES = {code: name for name, code in _CODECS.items()}


def codec_to_proto(codec: str | None) -> tensor_pb2.Codec:
    return tensor_pb2.CODEC_NONE if codec is None else _CODECS[codec]


def to_proto(array: np.ndarray | Packed, out: tensor_pb2.Tensor | None = None) -> tensor_pb2.Tensor:
    """Encodes an array (any layout; converted to little-endian C order) or compressed items."""
    tensor = tensor_pb2.Tensor() if out is None else out
    if isinstance(array, Packed):
        tensor.dtype = dtype_to_proto(array.dtype)
        tensor.shape[:] = (len(array), *array.item_shape)
        tensor.codec = _CODECS[array.codec]
        tensor.sizes[:] = array.sizes.tolist()
        tensor.data = bytes(array.data)  # free when it is bytes already (memory.off_heap's are not)
        return tensor
    array = np.asarray(array)
    code = dtype_to_proto(array.dtype)
    tensor.dtype = code
    tensor.shape[:] = array.shape
    tensor.data = np.ascontiguousarray(array, dtype=_TO_NUMPY[code]).tobytes()
    return tensor


def from_proto(tensor: tensor_pb2.Tensor, field: str) -> np.ndarray | Packed:
    """Decodes without copying the payload (the result is read-only); checks size and shape.
    A compressed tensor comes back as Packed (its frames are not opened here).

    `field` names the tensor in error messages, e.g. 'batch.columns["obs"]'.
    """
    dtype = dtype_from_proto(tensor.dtype, field)
    shape = tuple(tensor.shape)
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(f"{field}.shape", f"{len(shape)} dimensions, at most {MAX_DIMS}")
    if shape and (min(shape) < 0 or max(shape) > MAX_DIM):
        raise InvalidArgument(f"{field}.shape", f"dimension outside [0, 2^48] in {list(shape)}")
    if tensor.codec != tensor_pb2.CODEC_NONE:
        return _packed_from_proto(tensor, dtype, shape, field)
    if tensor.sizes:
        raise InvalidArgument(f"{field}.sizes", "set on a tensor that is not compressed")
    data = tensor.data  # each read of a bytes field copies it
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if len(data) != expected:
        raise InvalidArgument(
            f"{field}.data",
            f"{len(data)} bytes but shape {list(shape)} of {dtype.name} needs {expected}",
        )
    if dtype.kind == "b" and data.translate(None, b"\x00\x01"):
        raise InvalidArgument(f"{field}.data", "BOOL bytes must be 0 or 1")
    array = np.frombuffer(data, dtype=dtype)
    return array if len(shape) == 1 else array.reshape(shape)


def array_from_proto(tensor: tensor_pb2.Tensor, field: str) -> np.ndarray:
    """from_proto for a field that holds an array (keys, priorities, parameters): a compressed
    tensor there is refused, naming the field's codec."""
    array = from_proto(tensor, field)
    if isinstance(array, Packed):
        raise InvalidArgument(f"{field}.codec", f"{array.codec}: this field is never compressed")
    return array


def _packed_from_proto(tensor, dtype: np.dtype, shape: tuple, field: str) -> Packed:
    codec = _CODEC_NAMES.get(tensor.codec)
    if codec is None:
        raise InvalidArgument(f"{field}.codec", f"unknown codec {tensor.codec}")
    if not shape:
        raise InvalidArgument(f"{field}.shape", "a compressed tensor needs an item dimension")
    sizes = np.array(tensor.sizes, dtype=np.uint32)
    if len(sizes) != shape[0]:
        raise InvalidArgument(f"{field}.sizes", f"{len(sizes)} sizes for {shape[0]} items")
    if int(sizes.sum(dtype=np.int64)) != len(tensor.data):
        raise InvalidArgument(
            f"{field}.data", f"{len(tensor.data)} bytes but sizes add up to {int(sizes.sum())}"
        )
    return Packed(codec, dtype, shape[1:], tensor.data, sizes)


def batch_to_proto(
    columns: Mapping[str, np.ndarray | Packed], out: tensor_pb2.Batch | None = None
) -> tensor_pb2.Batch:
    batch = tensor_pb2.Batch() if out is None else out
    for name, array in columns.items():
        to_proto(array, batch.columns[name])
    return batch


def batch_from_proto(
    batch: tensor_pb2.Batch, field: str = "batch"
) -> dict[str, np.ndarray | Packed]:
    return {name: from_proto(t, f'{field}.columns["{name}"]') for name, t in batch.columns.items()}

import numpy as np
import pytest

from apexrl.common import codec, tensors
from apexrl.common.errors import InvalidArgument
from apexrl.v1 import tensor_pb2

DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool"]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(dtype):
    array = (np.arange(24) % 2 if dtype == "bool" else np.arange(24)).astype(dtype).reshape(2, 3, 4)
    wire = tensor_pb2.Tensor.FromString(tensors.to_proto(array).SerializeToString())
    back = tensors.from_proto(wire, "x")
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_big_endian_and_strided_inputs_are_normalized():
    array = np.arange(12, dtype=">f4").reshape(3, 4)[:, ::2]
    back = tensors.from_proto(tensors.to_proto(array), "x")
    np.testing.assert_array_equal(back, array)
    assert back.dtype == np.dtype("<f4")


def test_scalar_and_empty_shapes():
    assert tensors.from_proto(tensors.to_proto(np.float32(2.5)), "x").shape == ()
    assert tensors.from_proto(tensors.to_proto(np.zeros((0, 3))), "x").shape == (0, 3)


@pytest.mark.parametrize(
    "tensor, field",
    [
        (tensor_pb2.Tensor(dtype=tensor_pb2.FLOAT32, shape=[2], data=b"\x00" * 7), "obs.data"),
        (tensor_pb2.Tensor(dtype=0, shape=[1], data=b"\x00" * 4), "obs.dtype"),
        (tensor_pb2.Tensor(dtype=77, shape=[1], data=b"\x00" * 4), "obs.dtype"),
        (tensor_pb2.Tensor(dtype=tensor_pb2.UINT8, shape=[-1, -2], data=b"\x00" * 2), "obs.shape"),
        # A product that would overflow int64 must not wrap around to match the data.
        (tensor_pb2.Tensor(dtype=tensor_pb2.UINT8, shape=[2**40, 2**40], data=b""), "obs.data"),
        (tensor_pb2.Tensor(dtype=tensor_pb2.UINT8, shape=[2**62, 4], data=b""), "obs.shape"),
        # Zero elements, but numpy could not make the array.
        (tensor_pb2.Tensor(dtype=tensor_pb2.UINT8, shape=[0, 2**62, 2**62], data=b""), "obs.shape"),
        (tensor_pb2.Tensor(dtype=tensor_pb2.UINT8, shape=[1] * 65, data=b"\x00"), "obs.shape"),
        (tensor_pb2.Tensor(dtype=tensor_pb2.BOOL, shape=[3], data=b"\x00\x01\x02"), "obs.data"),
    ],
)
def test_malformed_tensors_name_the_field(tensor, field):
    with pytest.raises(InvalidArgument) as caught:
        tensors.from_proto(tensor, "obs")
    assert str(caught.value).startswith(field)


def test_unsupported_dtype_cannot_be_sent():
    with pytest.raises(ValueError, match="complex"):
        tensors.to_proto(np.zeros(2, np.complex64))


def test_compressed_tensor_round_trip():
    items = np.arange(3 * 64, dtype=np.uint8).reshape(3, 8, 8)
    packed = codec.compress(items)
    decoded = tensors.from_proto(tensors.to_proto(packed), "batch.columns['x']")
    assert isinstance(decoded, codec.Packed)
    assert (decoded.codec, decoded.dtype, decoded.item_shape) == ("zstd", np.uint8, (8, 8))
    assert decoded.data == packed.data and decoded.sizes.tolist() == packed.sizes.tolist()
    np.testing.assert_array_equal(codec.decompress(decoded)[0], items)


@pytest.mark.parametrize(
    "change, field, message",
    [
        (lambda t: t.sizes.append(1), ".sizes", "4 sizes for 3 items"),
        (lambda t: setattr(t, "data", t.data + b"x"), ".data", "sizes add up to"),
        (lambda t: t.shape.__delitem__(slice(None)), ".shape", "needs an item dimension"),
        (lambda t: setattr(t, "codec", 7), ".codec", "unknown codec 7"),
    ],
)
def test_malformed_compressed_tensor_names_the_field(change, field, message):
    tensor = tensors.to_proto(codec.compress(np.zeros((3, 4), np.uint8)))
    change(tensor)
    with pytest.raises(InvalidArgument, match=message) as err:
        tensors.from_proto(tensor, "batch.columns['x']")
    assert err.value.field == "batch.columns['x']" + field


def test_sizes_on_a_plain_tensor_are_refused():
    tensor = tensors.to_proto(np.zeros(3, np.float32))
    tensor.sizes.append(12)
    with pytest.raises(InvalidArgument, match="not compressed"):
        tensors.from_proto(tensor, "t")

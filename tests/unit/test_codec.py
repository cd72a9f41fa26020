"""Compressed columns: zstd frames per item, the header check the replay does, and the
decoder that never raises on damaged data."""

import numpy as np
import pytest
import zstandard

from apexrl.algorithms.columns import Column, nstep_columns, pack, unpack
from apexrl.algorithms.envs import EnvSpec
from apexrl.common import codec
from apexrl.common.codec import Packed


def frames(n: int, shape=(2, 4, 84, 84), seed: int = 0) -> np.ndarray:
    """Game-like uint8 frames: mostly background, a few bright pixels."""
    rng = np.random.default_rng(seed)
    return ((rng.random((n, *shape)) < 0.02) * rng.integers(1, 256, (n, *shape))).astype(np.uint8)


@pytest.mark.parametrize("nbytes", [0, 1, 255, 256, 257, 65535, 65791, 65792, 1 << 20])
def test_content_size_reads_what_zstd_wrote(nbytes):
    frame = zstandard.ZstdCompressor(level=3).compress(b"\x07" * nbytes)
    assert codec.content_size(frame) == zstandard.frame_content_size(frame) == nbytes


def test_content_size_refuses_what_is_not_a_sized_frame():
    assert codec.content_size(b"") is None
    assert codec.content_size(b"not a frame at all") is None
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 100)
    assert codec.content_size(unsized) is None
    frame = bytearray(zstandard.ZstdCompressor().compress(b"y" * 100))
    frame[4] |= 0x01  # names a dictionary (1-byte id): apexrl's frames never do
    assert codec.content_size(bytes(frame)) is None


def test_round_trip_each_item_its_own_frame():
    items = frames(5)
    packed = codec.compress(items)
    assert len(packed) == 5 and packed.sizes.sum() == len(packed.data)
    assert all(codec.content_size(f) == items[0].nbytes for f in packed.items())
    out, ok = codec.decompress(packed)
    assert ok.all()
    np.testing.assert_array_equal(out, items)
    floats = np.random.default_rng(1).random((3, 7)).astype(np.float32)
    out, ok = codec.decompress(codec.compress(floats))
    assert ok.all() and out.dtype == np.float32
    np.testing.assert_array_equal(out, floats)


def test_shared_frames_cost_almost_nothing():
    """obs and next_obs share 3 of 4 frames: one unit costs far less than two."""
    stack = frames(1, (5, 84, 84))[0]
    pair = np.stack([stack[:4], stack[1:]])[None]
    together = codec.compress(pair).sizes[0]
    apart = codec.compress(stack[None, :4]).sizes[0] + codec.compress(stack[None, 1:]).sizes[0]
    assert together < 0.7 * apart, (together, apart)


def test_check_names_the_first_bad_frame():
    good = codec.compress(frames(3)).items()
    assert codec.check(good, frames(1)[0].nbytes) is None
    assert codec.check([*good[:2], b"junk!!"], frames(1)[0].nbytes) == (
        2,
        "is not a zstd frame declaring its size",
    )
    index, reason = codec.check(good, 10)
    assert index == 0 and "declares 56448 decompressed bytes" in reason


def test_decompress_drops_damaged_items_and_bombs_without_raising():
    items = frames(4)
    frames_ = codec.compress(items).items()
    truncated = frames_[1][: len(frames_[1]) // 2]
    flipped = bytearray(frames_[2])
    flipped[len(flipped) // 2] ^= 0xFF
    # A bomb: a valid frame that declares (and holds) 64x the column's item size.
    bomb = zstandard.ZstdCompressor().compress(bytes(64 * items[0].nbytes))
    for bad in (truncated, bytes(flipped), bomb, b""):
        packed = Packed.join("zstd", np.uint8, items.shape[1:], [frames_[0], bad, frames_[3]])
        out, ok = codec.decompress(packed)
        assert ok.tolist()[0] and ok.tolist()[2], bad[:8]
        np.testing.assert_array_equal(out[[0, 2]], items[[0, 3]])
        if not ok[1]:
            assert not out[1].any()
    # The flipped byte may land in a literal and decode to other frames of the right size,
    # but a truncated frame, a bomb and nothing never decode.
    for bad in (truncated, bomb, b""):
        packed = Packed.join("zstd", np.uint8, items.shape[1:], [bad])
        assert not codec.decompress(packed)[1][0]


def image_spec() -> EnvSpec:
    return EnvSpec("ALE/Pong-v5", (4, 84, 84), np.dtype(np.uint8), 6, (), None, None, True)


def test_image_transitions_travel_as_one_compressed_column():
    columns = nstep_columns(image_spec(), np.dtype(np.int64))
    assert [c.name for c in columns] == ["observations", "action", "reward", "discount"]
    assert columns[0] == Column(
        "observations", np.dtype(np.uint8), (2, 4, 84, 84), codec="zstd", parts=("obs", "next_obs")
    )
    assert columns[0].spec() == "observations:uint8:2x4x84x84:zstd"
    obs = frames(6, (4, 84, 84))
    transitions = {
        "obs": obs,
        "action": np.arange(6),
        "reward": np.ones(6, np.float32),
        "discount": np.ones(6, np.float32),
        "next_obs": obs[::-1],
    }
    packed = pack(transitions, columns)
    assert sorted(packed) == ["action", "discount", "observations", "reward"]
    assert isinstance(packed["observations"], Packed)
    unpacked, ok = unpack(packed, columns)
    assert ok.all()
    for name, value in transitions.items():
        np.testing.assert_array_equal(unpacked[name], value)


def test_vector_transitions_are_not_compressed():
    spec = EnvSpec("CartPole-v1", (4,), np.dtype(np.float32), 2, (), None, None)
    columns = nstep_columns(spec, np.dtype(np.int64))
    assert not any(c.codec for c in columns)
    transitions = {c.name: np.zeros((3, *c.shape), c.dtype) for c in columns}
    assert pack(transitions, columns).keys() == transitions.keys()

"""The columns transitions carry, without torch: local mode's parent process reads them to give
the replay its `signature`, and the replay has no torch at all."""

from dataclasses import dataclass
from typing import Any

import numpy as np

from apexrl.algorithms import frame_stacks
from apexrl.algorithms.envs import EnvSpec
from apexrl.common import codec


@dataclass(frozen=True)
class Column:
    """One column of a transition: name, dtype, per-item shape (the replay's signature)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    bounds: tuple[float, float] | None = None  # the closed range of its values, if any
    codec: str | None = None  # items travel and rest compressed (common/codec.py)
    # The transition fields stacked along axis 1 into this column (one compressed unit).
    parts: tuple[str, ...] = ()
    # > 0: the field is a run of stacks of this many frames, stored once per step
    # (frame_stacks.py) in this column, with where episodes start in the column `<name>_starts`.
    stack: int = 0

    def spec(self) -> str:
        """As the replay's `signature` setting spells it: name:dtype:d0xd1[:low..high|:zstd]."""
        text = f"{self.name}:{np.dtype(self.dtype).name}:{'x'.join(map(str, self.shape))}"
        if self.codec:
            return f"{text}:{self.codec}"
        return text if self.bounds is None else text + ":{:g}..{:g}".format(*self.bounds)


def action_bounds(spec: EnvSpec) -> tuple[float, float] | None:
    """[lowest low, highest high] of a continuous action space (None for Discrete: the index
    range is not checked by the replay)."""
    if spec.discrete:
        return None
    if spec.action_low is None or spec.action_high is None:
        raise ValueError(f"env {spec.env_id}: a continuous action space without bounds")
    return float(spec.action_low.min()), float(spec.action_high.max())


def compressed_observations(spec: EnvSpec) -> bool:
    """Image observations (uint8, 2-D or more) travel and rest compressed."""
    return np.dtype(spec.obs_dtype) == np.uint8 and len(spec.obs_shape) >= 2


def nstep_columns(spec: EnvSpec, action_dtype: np.dtype) -> list[Column]:
    """The n-step transition (adders/nstep.py): obs, action, reward (the discounted n-step
    return), discount (gamma^m, 0 after a terminal), next_obs. Learners need neither n nor gamma.

    Image observations go as one compressed column, "observations" = [obs, next_obs] stacked
    on axis 1: one zstd frame per item, so the frames the two stacks share cost almost nothing.
    `pack` builds it on the actor, `unpack` takes it apart in the learner's input pipeline.
    """
    obs = Column("obs", np.dtype(spec.obs_dtype), spec.obs_shape)
    next_obs = Column("next_obs", np.dtype(spec.obs_dtype), spec.obs_shape)
    rest = [
        Column("action", np.dtype(action_dtype), spec.action_shape, action_bounds(spec)),
        Column("reward", np.dtype(np.float32), ()),
        Column("discount", np.dtype(np.float32), ()),
    ]
    if not compressed_observations(spec):
        return [obs, *rest, next_obs]
    pair = Column(
        "observations", obs.dtype, (2, *spec.obs_shape), codec="zstd", parts=("obs", "next_obs")
    )
    return [pair, *rest]


def stacked_columns(name: str, spec: EnvSpec, length: int) -> list[Column]:
    """A run of `length` observations of `spec` as columns: [length, *obs] as they are, or for
    stacked image frames ([K, H, W] uint8) their frames stored once per step and compressed as
    one unit, [length + K - 1, H, W], with the episode starts [length] beside them (a Pong
    unroll of 33 stacks: 36 frames in a few KB instead of 931 KB)."""
    dtype, shape = np.dtype(spec.obs_dtype), spec.obs_shape
    if not compressed_observations(spec) or len(shape) < 3:
        return [Column(name, dtype, (length, *shape))]
    frames = (length + shape[0] - 1, *shape[1:])
    return [
        Column(name, dtype, frames, codec="zstd", stack=shape[0]),
        Column(f"{name}_starts", np.dtype(bool), (length,)),
    ]


def unroll_columns(spec: EnvSpec, length: int, returns: bool = False) -> list[Column]:
    """An unroll (adders/unroll.py): `length` consecutive steps of one env as one item, the time
    dimension first in every column. observations [length + 1, *obs] (the last is the
    observation after the last step, for the bootstrap value; stacked frames stored once per
    step, stacked_columns), actions (Discrete: int64 indices; Box: the policy's float32
    samples [length, *action], unclipped, so unbounded), rewards, discounts
    (gamma, 0 after a terminal; a truncated step's reward carries gamma * V(final obs)), the
    behaviour policy's log-probabilities [length], with `returns` the running discounted
    return of each step (reward normalization's statistics), and the parameter version that
    acted []."""
    if length < 1:
        raise ValueError(f"unroll_length: must be >= 1, got {length}")
    f32 = np.dtype(np.float32)
    if spec.discrete:
        actions = Column("actions", np.dtype(np.int64), (length,))
    else:
        actions = Column("actions", f32, (length, *spec.action_shape))
    return [
        *stacked_columns("observations", spec, length + 1),
        actions,
        Column("rewards", f32, (length,)),
        Column("discounts", f32, (length,)),
        Column("log_probs", f32, (length,)),
        *([Column("returns", f32, (length,))] if returns else []),
        Column("version", np.dtype(np.int64), ()),
    ]


def pack(transitions: dict[str, np.ndarray], columns: list[Column]) -> dict:
    """Transition fields -> the columns replay stores (stacked parts compressed; runs of frame
    stacks split into their frames, compressed, and their episode starts)."""
    out: dict[str, Any] = dict(transitions)
    for column in columns:
        if not (column.parts or column.stack):
            continue
        if column.codec is None:
            raise ValueError(f"column {column.name}: parts and frame stacks need a codec")
        if column.parts:
            stacked = np.stack([out.pop(part) for part in column.parts], axis=1)
            out[column.name] = codec.compress(stacked, column.codec)
        else:
            frames, out[f"{column.name}_starts"] = frame_stacks.split(out[column.name])
            out[column.name] = codec.compress(frames, column.codec)
    return out


def unpack(stored: dict, columns: list[Column]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Sampled columns -> transition fields (runs of frame stacks rebuilt), and ok [B]: False
    for items whose frames did not decode (left zero; the caller drops them)."""
    out = dict(stored)
    n = len(next(iter(stored.values())))
    ok = np.ones(n, dtype=bool)
    for column in columns:
        if column.parts:
            items, decoded = codec.decompress(out.pop(column.name))
            ok &= decoded
            for i, part in enumerate(column.parts):
                out[part] = items[:, i]
        elif column.stack:
            frames, decoded = codec.decompress(out[column.name])
            ok &= decoded
            starts = out.pop(f"{column.name}_starts")
            out[column.name] = frame_stacks.rebuild(frames, starts, column.stack)
    return out, ok

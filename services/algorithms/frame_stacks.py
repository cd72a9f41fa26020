"""Frame stacks stored once per step: a run of consecutive stacked observations (Atari's
[K, 84, 84] stacks of the last K frames) held as its frames plus where episodes start.

Consecutive stacks of one episode share K - 1 of their K frames, so a run of L stacks is
L + K - 1 frames: the first stack whole, then each later stack's newest frame. An episode that
starts inside the run (the env reset after an end) breaks the chain: gymnasium's
FrameStackObservation pads a new episode's first stack with its first frame (padding_type
"reset"), so a stack at or after a start repeats the episode's first frame where the frames
before the start would be. `split` finds the starts from the data (a stack that does not
continue the previous one) and refuses a start its padding cannot rebuild; `rebuild` undoes
`split` exactly. Numpy only: the actors split, the learner's input pipeline rebuilds.
"""

import numpy as np


def split(stacks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """stacks [B, L, K, ...] -> (frames [B, L + K - 1, ...], starts bool [B, L]): starts[b, t]
    where stack t does not continue stack t - 1 (a new episode; never at t = 0, whose stack
    is stored whole). ValueError if such a stack is not its newest frame repeated K times."""
    b, length, k = stacks.shape[:3]
    if length < 1 or k < 1:
        raise ValueError(f"stacks: need [batch, length >= 1, stack >= 1, ...], got {stacks.shape}")
    newest = stacks[:, :, -1]
    starts = np.zeros((b, length), dtype=bool)
    if length > 1:
        axes = tuple(range(2, stacks.ndim))
        starts[:, 1:] = (stacks[:, 1:, :-1] != stacks[:, :-1, 1:]).any(axis=axes)
    padded = (stacks == newest[:, :, None]).reshape(b, length, -1).all(axis=2)
    bad = starts & ~padded
    if bad.any():
        row, t = np.argwhere(bad)[0]
        raise ValueError(
            f"stacks: item {row}, step {t} starts an episode whose stack is not its first frame"
            " repeated (frame stacks need FrameStackObservation's padding_type 'reset')"
        )
    frames = np.concatenate([stacks[:, 0, :-1], newest], axis=1)
    return np.ascontiguousarray(frames), starts


def rebuild(frames: np.ndarray, starts: np.ndarray, k: int) -> np.ndarray:
    """(frames [B, L + K - 1, ...], starts [B, L]) -> stacks [B, L, K, ...], as split took them.

    Stack t is frames t .. t + K - 1, each index raised to the newest frame of the episode's
    latest start at or before t (that frame is the padding of the stacks it begins)."""
    b, length = starts.shape
    if frames.shape[:2] != (b, length + k - 1):
        raise ValueError(
            f"frames: shape {frames.shape[:2]} does not fit starts {starts.shape} and stack {k}"
        )
    steps = np.arange(length)
    floor = np.maximum.accumulate(np.where(starts, steps + k - 1, 0), axis=1)  # [B, L]
    index = np.maximum(steps[:, None] + np.arange(k), floor[:, :, None])  # [B, L, K]
    return frames[np.arange(b)[:, None, None], index]

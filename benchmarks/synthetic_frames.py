"""Synthetic game-like Atari frames, numpy only (imported by both sides of atari_vs_reverb.py).

One continuing trajectory of 84x84 grayscale frames, deterministic from a seed, drawn like a
preprocessed Pong / Space Invaders screen: a flat background, two static wall bands, a score
strip whose digits change when a point is scored, two paddles (one tracking the ball with a
lag, one on a slow sine), a bouncing ball, and three small sprites drifting sideways and
wrapping around. About 0.7 % of a frame's pixels (~50 of 7,056) differ from one frame to the
next (ALE Pong with the DQN preprocessing, random play: 0.69 %); one frame alone is ~107 B with
zstd level 6 (a Pong frame: ~156 B), obs + next_obs as one zstd frame ~424 B (n=1), ~500 B (n=3).

Transition i of n-step `n` (as an actor's frame stack gives it, no episode ends):
obs = frames[i : i+4], next_obs = frames[i+n : i+n+4]; both uint8 [4, 84, 84]. So n=1 shares 3
of 4 frames between obs and next_obs, n=3 shares 1 (5 and 7 distinct frames per item).
action, reward and discount are drawn from the same seed.
"""

import numpy as np

SIZE = 84
STACK = 4
BACKGROUND, WALL, SCORE, LEFT, RIGHT, BALL = 87, 236, 180, 148, 147, 236
SPRITES = (110, 160, 200)
# 3x5 digit glyphs, row-major bits
DIGITS = (
    "111101101101111", "010110010010111", "111001111100111", "111001111001111",
    "101101111001001", "111100111001111", "111100111101111", "111001001001001",
    "111101111101111", "111101111001111",
)  # fmt: skip


def _digit(frame: np.ndarray, value: int, top: int, left: int) -> None:
    glyph = np.array([int(b) for b in DIGITS[value % 10]], dtype=bool).reshape(5, 3)
    glyph = np.repeat(np.repeat(glyph, 2, axis=0), 2, axis=1)  # 10 x 6
    frame[top : top + 10, left : left + 6][glyph] = SCORE


def frames(count: int, seed: int = 0) -> np.ndarray:
    """uint8 [count, 84, 84]: one continuing game-like trajectory."""
    rng = np.random.default_rng(seed)
    out = np.empty((count, SIZE, SIZE), dtype=np.uint8)
    top, bottom = 14, 78  # the playfield between the two walls
    ball = np.array([rng.uniform(30, 54), rng.uniform(top + 4, bottom - 6)])
    velocity = np.array([rng.choice([-3.0, 3.0]), rng.uniform(-2.5, 2.5)])
    left_y, phase = float(SIZE // 2), rng.uniform(0, 2 * np.pi)
    sprites = [
        [rng.uniform(0, SIZE), 20 + 16 * k, rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5)]
        for k in range(len(SPRITES))
    ]
    score = [0, 0]
    for t in range(count):
        f = out[t]
        f.fill(BACKGROUND)
        f[top - 2 : top] = WALL
        f[bottom : bottom + 2] = WALL
        _digit(f, score[0], 1, 18)
        _digit(f, score[1], 1, 60)
        for (x, y, _), value in zip(sprites, SPRITES, strict=True):
            xi = int(x) % SIZE
            f[y : y + 4, xi : min(xi + 6, SIZE)] = value
        # paddles: left tracks the ball with a lag, right follows a slow sine
        left_y += float(np.clip(ball[1] - left_y, -2.0, 2.0))
        right_y = (top + bottom) / 2 + 22 * np.sin(phase + 0.07 * t)
        for x, y, value in ((6, left_y, LEFT), (76, right_y, RIGHT)):
            yi = int(np.clip(y - 8, top, bottom - 16))
            f[yi : yi + 16, x : x + 3] = value
        bx, by = int(ball[0]), int(ball[1])
        f[by : by + 4, bx : bx + 2] = BALL
        # advance the world by one (frame-skipped) step
        ball += velocity
        if ball[1] < top or ball[1] > bottom - 4:
            velocity[1] = -velocity[1]
            ball[1] = np.clip(ball[1], top, bottom - 4)
        if ball[0] < 9 or ball[0] > 73:  # a paddle returns it, or a point is scored
            velocity[0] = -velocity[0]
            if rng.random() < 0.3:
                score[int(ball[0] < 9)] += 1
                ball[:] = (SIZE / 2, rng.uniform(top + 4, bottom - 6))
                velocity[1] = rng.uniform(-2.5, 2.5)
            ball[0] = np.clip(ball[0], 9, 73)
        for s in sprites:
            s[0] += s[2]
    return out


def transitions(count: int, n: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """`count` transitions of n-step `n` from one trajectory: obs/next_obs uint8 [count, 4, 84,
    84], action int64, reward and discount float32 (the fields `columns.pack` takes)."""
    trajectory = frames(count + n + STACK - 1, seed)
    index = np.arange(count)[:, None] + np.arange(STACK)[None, :]
    rng = np.random.default_rng(seed + 1)
    return {
        "obs": trajectory[index],
        "action": rng.integers(0, 6, count).astype(np.int64),
        "reward": rng.choice(np.float32([-1, 0, 0, 0, 0, 0, 0, 0, 0, 1]), count),
        "discount": np.full(count, 0.99**n, dtype=np.float32),
        "next_obs": trajectory[index + n],
    }

"""A pixel task small enough for a test: the image path of Atari (uint8 [C, H, W] observations,
the Nature-DQN conv torso, compressed frames in the replay) on a game that a CPU learns in
seconds.

`apexrl/Catch-v0` (bsuite's Catch, drawn): a ball falls one row a step from a random column of
the top row; a paddle on the bottom row moves left, stays or moves right (actions 0, 1, 2). The
episode ends when the ball reaches the bottom row, after ROWS - 1 steps: +1 if the paddle is
under it, -1 if not (no other reward). The paddle starts in the middle and can reach every
column in time, so a perfect policy scores +1; a random one catches a fifth of the balls (mean
return -0.6). The ball's column is the only chance in an episode. One frame shows the whole state (the ball only falls), so it needs no
frame stack.

The frame is 1 x 40 x 40 (each cell 4 rows by 8 columns of pixels; 255 where the ball or the
paddle is, 0 elsewhere): the Nature conv stack (8x8 stride 4, 4x4 stride 2, 3x3 stride 1) needs
at least 36 x 36, and at 40 x 40 it costs about a hundredth of an 84 x 84 Atari frame's
compute. The networks pick the conv torso by the observation's shape and dtype alone, as for
Atari; Atari-only settings (reward clipping, sticky actions, frame skip) do not apply.
"""

from typing import Any

import gymnasium as gym
import numpy as np

CATCH = "apexrl/Catch-v0"
ROWS, COLUMNS = 10, 5
CELL_HEIGHT, CELL_WIDTH = 4, 8
SOLVED = 0.9  # mean return: 95% of the balls caught


class Catch(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        shape = (1, ROWS * CELL_HEIGHT, COLUMNS * CELL_WIDTH)
        self.observation_space = gym.spaces.Box(0, 255, shape, dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(3)  # left, stay, right
        self.ball_row = self.ball_column = 0
        self.paddle = COLUMNS // 2

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.ball_row, self.ball_column = 0, int(self.np_random.integers(COLUMNS))
        self.paddle = COLUMNS // 2
        return self._frame(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action: expected 0, 1 or 2, got {action!r}")
        self.paddle = int(np.clip(self.paddle + int(action) - 1, 0, COLUMNS - 1))
        self.ball_row += 1
        terminated = self.ball_row == ROWS - 1
        reward = 0.0
        if terminated:
            reward = 1.0 if self.paddle == self.ball_column else -1.0
        return self._frame(), reward, terminated, False, {}

    def _frame(self) -> np.ndarray:
        cells = np.zeros((ROWS, COLUMNS), np.uint8)
        cells[self.ball_row, self.ball_column] = 255
        cells[ROWS - 1, self.paddle] = 255
        pixels = cells.repeat(CELL_HEIGHT, axis=0).repeat(CELL_WIDTH, axis=1)
        return pixels[None]

    def render(self) -> np.ndarray:
        """The frame as RGB [H, W, 3] (recorded videos)."""
        return np.repeat(self._frame()[0][..., None], 3, axis=-1)


gym.register(CATCH, entry_point=f"{__name__}:Catch", reward_threshold=SOLVED)

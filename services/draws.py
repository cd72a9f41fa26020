"""Settings drawn per actor: a distribution in place of a number, each actor its own value.

In a config file, an inline table; as a flag or an APEXRL_* variable, the same text:

    [actor]
    exploration = { log_uniform = [0.01, 0.4] }   # each actor's epsilon, drawn at start
    gamma = { uniform = [0.97, 0.997] }
    [dqn]
    n_step = { choice = [1, 3, 5] }
    --exploration '{ ladder = [0.4, 0.00066] }'

- uniform = [low, high]: uniform on [low, high]; an integer setting: one of low, ..., high;
- log_uniform = [low, high]: its log uniform on [log low, log high], both > 0 (a real setting);
- choice = [v1, v2, ...]: one of them, each as likely;
- ladder = [first, last]: not drawn: the actor's place i of the N live actors that the learner
  leases it, first · (last / first)^(i / (N − 1)) (both > 0; a lone actor: first), read again
  at each parameter pull as places re-spread. Only the settings read at each pull take one.

Each actor draws once, at start, from a generator seeded by its `seed` and the setting's name:
the same seed draws the same values (a restart with it too); seed 0 draws from the OS, so
actors that share a config file draw apart. Only the settings marked `per_actor=`
(config.option) take a distribution; the learner's own settings refuse one.
"""

import dataclasses
import json
import math
import tomllib
import zlib
from typing import Any

import numpy as np

SHAPES = ("uniform", "log_uniform", "choice", "ladder")


class Draw(float):
    """A setting's per-actor distribution. As a float it is its lowest value, what a process
    that reads the setting without drawing it (the learner, start-up checks) sees."""

    shape: str
    values: tuple[float, ...]
    integer: bool

    def __new__(cls, shape: str, values: tuple[float, ...], integer: bool = False) -> "Draw":
        draw = super().__new__(cls, min(values))
        draw.shape, draw.values, draw.integer = shape, tuple(values), integer
        return draw

    def __reduce__(self) -> tuple[type["Draw"], tuple]:
        return Draw, (self.shape, self.values, self.integer)

    def draw(self, rng: np.random.Generator) -> float | int:
        """One actor's value."""
        low, high = self.values[0], self.values[-1]
        if self.shape == "choice":
            value = self.values[int(rng.integers(len(self.values)))]
        elif self.shape == "uniform" and self.integer:
            value = int(rng.integers(int(low), int(high) + 1))
        elif self.shape == "uniform":
            value = float(rng.uniform(low, high))
        elif self.shape == "log_uniform":
            value = float(math.exp(rng.uniform(math.log(low), math.log(high))))
        else:
            raise ValueError(f"a {self.shape} is not drawn: it follows the actor's place")
        return int(value) if self.integer else float(value)

    def at(self, index: int, count: int) -> float:
        """A ladder's value for place `index` of `count` live actors."""
        first, last = self.values
        return first if count <= 1 else first * (last / first) ** (index / (count - 1))

    def table(self) -> dict:
        """Its inline table, as a config file writes it."""
        return {self.shape: [int(v) if self.integer else v for v in self.values]}

    def toml(self) -> str:
        ((shape, values),) = self.table().items()
        return "{ " + f"{shape} = {json.dumps(values)}" + " }"

    def __repr__(self) -> str:
        return f"Draw({self.toml()})"

    __str__ = __repr__


def shapes(integer: bool, ladder: bool) -> list[str]:
    """The distributions a setting takes: an integer one no log_uniform, a ladder only where it
    is read at each parameter pull."""
    refused = {"log_uniform"} if integer else set()
    return [s for s in SHAPES if s not in refused and (ladder or s != "ladder")]


def shape_of(value: Any) -> str | None:
    """The distribution a setting's value names (a dict, or its text), None for anything else."""
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = tomllib.loads(f"x = {value}")["x"]
        except tomllib.TOMLDecodeError:
            return None
    if isinstance(value, dict):
        return next((k for k in value if k in SHAPES), None)
    return None


def parse(value: Any, name: str, integer: bool = False, ladder: bool = False) -> Draw:
    """A distribution from its inline table (a dict, or its text) for setting `name` (an integer
    one if `integer`; `ladder`: it may take a ladder); ValueError naming the setting."""
    if isinstance(value, str):
        try:
            value = tomllib.loads(f"x = {value}")["x"]
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{name}: not a number nor a distribution: {value!r} ({err})") from err
    named = [k for k in value if k in SHAPES] if isinstance(value, dict) else []
    if len(named) != 1 or len(value) != 1:
        raise ValueError(f"{name}: a distribution is one of {', '.join(SHAPES)}, got {value!r}")
    shape, values = named[0], value[named[0]]
    if not (isinstance(values, list) and values and all(_number(v) for v in values)):
        raise ValueError(f"{name}: {shape} takes a list of numbers, got {values!r}")
    if integer and not all(float(v).is_integer() for v in values):
        raise ValueError(f"{name}: an integer setting, got {shape} {values}")
    if shape == "ladder" and not ladder:
        raise ValueError(
            f"{name}: a ladder follows the actor's place, which moves as actors come and go;"
            f" {name} is fixed at start: draw it ({', '.join(shapes(integer, ladder=False))})"
        )
    if shape == "choice":
        return Draw(shape, tuple(values), integer)
    if len(values) != 2:
        raise ValueError(f"{name}: {shape} takes [low, high], got {values!r}")
    if shape != "ladder" and values[0] > values[1]:
        raise ValueError(f"{name}: {shape} needs low <= high, got {values}")
    if shape in ("log_uniform", "ladder") and not min(values) > 0:
        raise ValueError(f"{name}: {shape} needs bounds > 0, got {values}")
    if shape == "log_uniform" and integer:
        raise ValueError(f"{name}: an integer setting takes uniform or choice, not log_uniform")
    return Draw(shape, tuple(values), integer)


def generator(seed: int, name: str) -> np.random.Generator:
    """Where an actor draws setting `name`: its seed and the name, or the OS for seed 0."""
    if seed == 0:
        return np.random.default_rng()
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def draw_settings(config: Any) -> tuple[Any, dict[str, float]]:
    """An actor's config with each drawn setting (its own and its algorithm's, config.algo) in
    place of its distribution (ladders stay), and the values drawn, by setting name."""
    drawn: dict[str, float] = {}

    def drawn_in(settings: Any) -> dict[str, Any]:
        values = {}
        for f in dataclasses.fields(settings):
            value = getattr(settings, f.name)
            if isinstance(value, Draw) and value.shape != "ladder":
                values[f.name] = drawn[f.name] = value.draw(generator(config.seed, f.name))
        return values

    algo = config.algo
    if algo is not None:
        algo = dataclasses.replace(algo, **drawn_in(algo))
    return dataclasses.replace(config, **drawn_in(config), algo=algo), drawn


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

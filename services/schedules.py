"""Settings that change over a run: a schedule in place of a number.

In a config file, an inline table; as a flag or an APEXRL_* variable, the same text:

    learning_rate = { linear = [3e-4, 0.0], over = "1M updates" }
    beta = { linear = [0.4, 1.0], over = "100K updates" }
    clip_range = { exponential = [0.2, 0.02], over = "50K updates" }
    entropy_cost = { piecewise = [[0, 0.01], [10_000, 0.005], [50_000, 0.0]], unit = "updates" }
    --learning-rate '{ linear = [3e-4, 0.0], over = "1M updates" }'

- linear: from the first value to the second over the length, then the second;
- exponential: the same, geometrically (both values > 0): start * (end / start)^(t / length);
- piecewise: linear between (step, value) points, the first value before them, the last after.

A setting counts the steps of whoever reads it: the learner's settings its updates (so a run
resumed from a checkpoint continues each schedule where it was), an actor's its own env steps
since it started (`[actor] exploration = { linear = [1.0, 0.01], over = "100K env steps" }`).
Only the settings marked `schedule=` (config.option) take one.
"""

import json
import math
import re
import tomllib
from typing import Any

SHAPES = ("linear", "exponential", "piecewise")
UNITS = ("updates", "env steps")
_LENGTH = re.compile(r"^\s*([-+]?[0-9][0-9_.]*(?:e[-+]?[0-9]+)?)\s*([KMG]?)\s+(\S.*?)\s*$", re.I)
_SCALE = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}


class Schedule(float):
    """A setting's values over the learner's steps. As a float it is its value at step 0, so
    whatever reads the setting once (an optimizer made, a start-up check) reads that; the
    learner sets each scheduled setting to value(step) before every update."""

    shape: str
    points: tuple[tuple[float, float], ...]
    unit: str

    def __new__(
        cls, shape: str, points: tuple[tuple[float, float], ...], unit: str = "updates"
    ) -> "Schedule":
        schedule = super().__new__(cls, points[0][1])
        schedule.shape, schedule.points, schedule.unit = shape, tuple(points), unit
        return schedule

    def __reduce__(self) -> tuple[type["Schedule"], tuple]:
        return Schedule, (self.shape, self.points, self.unit)

    def value(self, step: float) -> float:
        (first_step, first), *_, (last_step, last) = self.points
        if step <= first_step:
            return first
        if step >= last_step:
            return last
        for (s0, v0), (s1, v1) in zip(self.points, self.points[1:], strict=False):
            if s0 <= step <= s1:
                t = (step - s0) / (s1 - s0)
                if self.shape == "exponential":
                    return v0 * (v1 / v0) ** t
                return v0 + t * (v1 - v0)
        raise AssertionError("unreachable: the points cover [first, last]")

    def table(self) -> dict:
        """Its inline table, as a config file writes it."""
        if self.shape == "piecewise":
            return {"piecewise": [list(p) for p in self.points], "unit": self.unit}
        (_, start), (length, end) = self.points
        count = int(length) if float(length).is_integer() else length
        return {self.shape: [start, end], "over": f"{count} {self.unit}"}

    def toml(self) -> str:
        """Its inline table as TOML text (what parse() reads back)."""
        items = (f"{k} = {json.dumps(v)}" for k, v in self.table().items())
        return "{ " + ", ".join(items) + " }"

    def __repr__(self) -> str:
        return f"Schedule({self.toml()})"

    __str__ = __repr__


def parse(value: Any, name: str, unit: str = "updates") -> Schedule:
    """A schedule from its inline table (a dict, or its text), counting `unit` (the setting's);
    ValueError naming the setting."""
    if isinstance(value, str):
        try:
            value = tomllib.loads(f"x = {value}")["x"]
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{name}: not a number nor a schedule: {value!r} ({err})") from err
    if not isinstance(value, dict):
        raise ValueError(f"{name}: expected a number or a schedule table, got {value!r}")
    shapes = [k for k in value if k in SHAPES]
    unknown = set(value) - set(SHAPES) - {"over", "unit"}
    if len(shapes) != 1 or unknown:
        raise ValueError(
            f"{name}: a schedule is one of {', '.join(SHAPES)} (with `over` or `unit`), got"
            f" keys {sorted(value)}"
        )
    shape = shapes[0]
    if shape == "piecewise":
        return _piecewise(value, name, unit)
    pair = value[shape]
    if not (isinstance(pair, list) and len(pair) == 2 and all(_number(v) for v in pair)):
        raise ValueError(f"{name}: {shape} takes [start, end], got {pair!r}")
    if "over" not in value or "unit" in value:
        raise ValueError(f'{name}: {shape} takes its length as over = "<count> <unit>"')
    length = _length(value["over"], name, unit)
    if shape == "exponential" and not (pair[0] > 0 and pair[1] > 0):
        raise ValueError(f"{name}: exponential needs values > 0, got {pair}")
    return Schedule(shape, ((0.0, float(pair[0])), (length, float(pair[1]))), unit)


def _piecewise(value: dict, name: str, unit: str) -> Schedule:
    points = value["piecewise"]
    if "over" in value:
        raise ValueError(f'{name}: piecewise takes unit = "{unit}", its steps in the points')
    _check_unit(value.get("unit", ""), name, unit)
    if not (
        isinstance(points, list)
        and points
        and all(isinstance(p, list) and len(p) == 2 and all(map(_number, p)) for p in points)
    ):
        raise ValueError(f"{name}: piecewise takes [[step, value], ...], got {points!r}")
    steps = [p[0] for p in points]
    if steps[0] < 0 or any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ValueError(f"{name}: piecewise steps must be >= 0 and increasing, got {steps}")
    return Schedule("piecewise", tuple((float(s), float(v)) for s, v in points), unit)


def _check_unit(given: Any, name: str, unit: str) -> None:
    if given != unit:
        raise ValueError(f"{name}: its schedule counts {unit}, got {given!r}")


def _length(text: Any, name: str, unit: str) -> float:
    match = _LENGTH.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f'{name}: over must read "<count> <unit>" (e.g. "1M updates"), got {text!r}'
        )
    count = float(match.group(1).replace("_", "")) * _SCALE[match.group(2).upper()]
    _check_unit(match.group(3), name, unit)
    if not count > 0:
        raise ValueError(f"{name}: a schedule's length must be > 0, got {text!r}")
    return count


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

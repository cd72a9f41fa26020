"""Population-based training's decisions (Jaderberg et al. 2017), with no I/O: which member
copies which (exploit: truncation selection) and the settings it goes on with (explore: the
winner's settings, each multiplied by a perturbation factor or, with a small probability,
drawn afresh from its initial distribution, then held inside that distribution's bounds).

Every draw comes from the random.Random the caller passes, so a seeded population decides the
same way given the same scores.
"""

import math
import random
from dataclasses import dataclass

KINDS = ("log_uniform", "uniform", "values")


@dataclass(frozen=True)
class Explore:
    """A setting PBT moves and where its values come from: `log_uniform` or `uniform` over
    [low, high], or `values`, one initial value per member (bounds: their min and max)."""

    setting: str
    kind: str
    values: tuple[float, ...]

    @classmethod
    def of(cls, entry: dict, population: int) -> "Explore":
        """An [[pbt.explore]] entry; ValueError naming the setting and the key it refuses."""
        name = entry.get("setting")
        if not isinstance(name, str) or not name:
            raise ValueError(f"explore: each entry needs setting = NAME, got {entry!r}")
        given = [k for k in KINDS if k in entry]
        unknown = sorted(set(entry) - {"setting", *KINDS})
        if len(given) != 1 or unknown:
            raise ValueError(
                f"explore {name}: needs exactly one of {', '.join(KINDS)}"
                + (f" (unknown keys: {', '.join(unknown)})" if unknown else "")
            )
        kind, raw = given[0], entry[given[0]]
        if not isinstance(raw, list) or not all(_is_number(v) for v in raw):
            raise ValueError(f"explore {name}: {kind} must be an array of numbers, got {raw!r}")
        values = tuple(float(v) for v in raw)
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"explore {name}: {kind} must be finite, got {raw!r}")
        if kind == "values" and len(values) != population:
            raise ValueError(
                f"explore {name}: values needs one per member ({population}), got {len(values)}"
            )
        if kind != "values" and (len(values) != 2 or values[0] > values[1]):
            raise ValueError(f"explore {name}: {kind} must be [low, high], low <= high, got {raw}")
        if kind == "log_uniform" and values[0] <= 0:
            raise ValueError(f"explore {name}: log_uniform needs low > 0, got {values[0]:g}")
        return cls(name, kind, values)

    @property
    def bounds(self) -> tuple[float, float]:
        return min(self.values), max(self.values)

    def sample(self, rng: random.Random) -> float:
        """A fresh value from the initial distribution."""
        low, high = self.bounds
        if self.kind == "log_uniform":
            return math.exp(rng.uniform(math.log(low), math.log(high)))
        if self.kind == "uniform":
            return rng.uniform(low, high)
        return rng.choice(self.values)

    def initial(self, member: int, rng: random.Random) -> float:
        return self.values[member] if self.kind == "values" else self.sample(rng)


@dataclass(frozen=True)
class Member:
    """A member as the controller sees it: its recent score (NaN: none since it last started)
    and its current settings."""

    index: int
    score: float
    settings: dict[str, float]


@dataclass(frozen=True)
class Exploit:
    """`loser` goes on from `winner`'s state with `settings`; `how` says, per setting, what
    explore did ("x0.8", "x1.2", "resampled")."""

    loser: int
    winner: int
    settings: dict[str, float]
    how: dict[str, str]


@dataclass(frozen=True)
class Rules:
    """How members are selected and perturbed."""

    fraction: float = 0.25  # bottom this fraction copies from the top this fraction
    factors: tuple[float, ...] = (0.8, 1.2)
    resample_probability: float = 0.0


def decide(
    members: list[Member], explore: list[Explore], rules: Rules, rng: random.Random
) -> list[Exploit]:
    """Truncation selection over the members with a score: each of the bottom
    max(1, floor(n * fraction)) copies a random one of the top as many, when that one scored
    strictly higher; fewer than two scored members: nothing."""
    scored = sorted((m for m in members if not math.isnan(m.score)), key=lambda m: -m.score)
    if len(scored) < 2:
        return []
    count = max(1, int(len(scored) * rules.fraction))
    top, bottom = scored[:count], scored[-count:]
    decisions = []
    for loser in bottom:
        winner = rng.choice(top)
        if winner.score <= loser.score:
            continue
        settings, how = perturb(winner.settings, explore, rules, rng)
        decisions.append(Exploit(loser.index, winner.index, settings, how))
    return decisions


def perturb(
    settings: dict[str, float], explore: list[Explore], rules: Rules, rng: random.Random
) -> tuple[dict[str, float], dict[str, str]]:
    """The settings explore makes of `settings`, and what it did to each."""
    new, how = dict(settings), {}
    for item in explore:
        if rng.random() < rules.resample_probability:
            value, how[item.setting] = item.sample(rng), "resampled"
        else:
            factor = rng.choice(rules.factors)
            value, how[item.setting] = settings[item.setting] * factor, f"x{factor:g}"
        low, high = item.bounds
        new[item.setting] = min(max(value, low), high)
    return new, how


def check_rules(rules: Rules) -> None:
    """ValueError naming the setting a population could not run with."""
    if not 0 < rules.fraction <= 0.5:
        raise ValueError(f"fraction: must be in (0, 0.5], got {rules.fraction:g}")
    if not rules.factors:
        raise ValueError("perturb: needs at least one factor")
    for factor in rules.factors:
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"perturb: each factor must be > 0, got {factor:g}")
    if not 0 <= rules.resample_probability <= 1:
        raise ValueError(
            f"resample_probability: must be in [0, 1], got {rules.resample_probability:g}"
        )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

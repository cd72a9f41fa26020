"""Network parts every algorithm shares: torsos for vector and image observations, and weights
as plain numpy arrays.

Two torsos: an MLP for 1-D float observations (CartPole, Pendulum) and the Nature-DQN conv
stack for uint8 images laid out [C, H, W] (Atari: a stack of 4 84x84 frames, as the env
gives it and as torch's convolutions read it, so no copy to reorder).

Weights travel over gRPC as raw float32 tensors, never pickle, so the helpers at the bottom
turn a module into an ordered dict name -> numpy array and back.
"""

import functools
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from apexrl.algorithms.base import prefixed


class MLPTorso(nn.Module):
    """Linear layers and an activation (ReLU unless told) on 1-D observations, cast to float32
    (envs may give float64)."""

    def __init__(self, obs_dim: int, hidden: Sequence[int], activation: type[nn.Module] = nn.ReLU):
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for size in hidden:
            layers += [nn.Linear(width, size), activation()]
            width = size
        self.layers = nn.Sequential(*layers)
        self.out_dim = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.layers(obs.float())


class NatureConvTorso(nn.Module):
    """Mnih et al. (2015) conv stack plus its 512-unit layer, on uint8 [B, C, H, W] input."""

    def __init__(self, obs_shape: Sequence[int]):
        super().__init__()
        channels, height, width = obs_shape
        self.convs = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        # Works out the flattened size (3136 for 84x84) instead of hard-coding it.
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, channels, height, width)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, 512), nn.ReLU())
        self.out_dim = 512

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(obs.float() / 255.0))


# Either torso: a module with `out_dim`, the width of its features.
Torso = MLPTorso | NatureConvTorso


def build_torso(
    obs_shape: Sequence[int],
    obs_dtype: npt.DTypeLike,
    hidden: Sequence[int],
    activation: type[nn.Module] = nn.ReLU,
) -> Torso:
    """MLP torso (with `activation`) for 1-D float obs, Nature conv torso for uint8 [C, H, W]
    obs (`.out_dim`)."""
    obs_shape = tuple(obs_shape)
    dtype = np.dtype(obs_dtype)
    if len(obs_shape) == 1 and np.issubdtype(dtype, np.floating):
        return MLPTorso(obs_shape[0], hidden, activation)
    if len(obs_shape) == 3 and dtype == np.uint8:
        return NatureConvTorso(obs_shape)
    raise ValueError(
        f"obs_shape {obs_shape} with obs_dtype {dtype}: expected 1-D float or uint8 [C, H, W]"
    )


def state_to_numpy(module: nn.Module) -> "OrderedDict[str, np.ndarray]":
    """All weights as name -> float32 C-contiguous arrays, copied (no aliasing of live weights)."""
    return OrderedDict(
        (name, tensor.detach().to("cpu", torch.float32).numpy().copy(order="C"))
        for name, tensor in module.state_dict().items()
    )


def load_numpy_state(module: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Copies arrays (as from state_to_numpy) into module's weights, in place.

    Names must match exactly; load_state_dict checks shapes and casts to each
    weight's dtype and device.
    """
    expected = set(module.state_dict().keys())
    got = set(arrays.keys())
    if got != expected:
        missing, unexpected = sorted(expected - got), sorted(got - expected)
        raise ValueError(f"weight names differ: missing {missing}, unexpected {unexpected}")
    # torch.tensor copies, so read-only buffers (np.frombuffer on gRPC bytes) are fine.
    module.load_state_dict({name: torch.tensor(array) for name, array in arrays.items()})


def adam(parameters, lr: float, **options) -> torch.optim.Adam:
    """Adam as every learner here makes it: fused (one kernel over all parameters; a Nature-CNN
    step on one CPU core takes 1.5 ms instead of 10.2, a 128x128 MLP's 0.13 instead of 0.31).

    TargetNetworkLearning and the actor-critics' UnrollLearning make it on first use (an
    update, a checkpoint), not in their constructor: the first Optimizer made imports
    torch._dynamo (about 1.4 CPU s), and the learner publishes its first version, which every
    actor waits for, before it trains."""
    return torch.optim.Adam(parameters, lr=lr, fused=True, **options)


def optimizer_state(
    optimizer: torch.optim.Optimizer, prefix: str
) -> tuple[dict[str, np.ndarray], list]:
    """An optimizer's tensors as prefix/<param index>/<key> arrays, and its param groups."""
    state = optimizer.state_dict()
    arrays = {
        f"{prefix}/{index}/{key}": value.detach().cpu().numpy()
        for index, entries in state["state"].items()
        for key, value in entries.items()
    }
    return arrays, state["param_groups"]


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, arrays: dict[str, np.ndarray], prefix: str, groups: list
) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in arrays.items():
        if name.startswith(prefix + "/"):
            index, key = name[len(prefix) + 1 :].split("/")
            state.setdefault(int(index), {})[key] = torch.from_numpy(value.copy())
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def sync_target(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    """target <- tau * online + (1 - tau) * target, parameter by parameter (Polyak averaging,
    DDPG's soft update); tau 1 is a hard copy. Buffers (batch-norm statistics and the like) are
    copied whole."""
    if tau == 1.0:
        target.load_state_dict(online.state_dict())
        return
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)
        for mine, theirs in zip(target.buffers(), online.buffers(), strict=True):
            mine.copy_(theirs)


class TargetNetworkLearning:
    """The Learning of a Q network with a target copy (dqn, r2d2): the online network is what
    actors get; a checkpoint holds both networks and the optimizer."""

    def __init__(self, build, config, settings, device: torch.device):
        self.config, self.settings = config, settings
        self.online, self.target = build().to(device), build().to(device)
        self.target.load_state_dict(self.online.state_dict())

    @functools.cached_property
    def optimizer(self) -> torch.optim.Adam:
        """Made on first use (see adam)."""
        return adam(self.online.parameters(), self.config.learning_rate)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def step(self, loss: torch.Tensor, update: int) -> None:
        """One clipped gradient step; the target synced every target_update_interval
        (sync_target with target_tau)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        if update % self.settings.target_update_interval == 0:
            sync_target(self.target, self.online, self.settings.target_tau)

    def cloned(self) -> None:
        """After behaviour cloning the target starts from the cloned network."""
        sync_target(self.target, self.online, 1.0)

    def parameters(self) -> dict[str, np.ndarray]:
        return state_to_numpy(self.online)

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {f"online/{k}": v for k, v in state_to_numpy(self.online).items()}
        arrays |= {f"target/{k}": v for k, v in state_to_numpy(self.target).items()}
        optimizer, groups = optimizer_state(self.optimizer, "optimizer")
        return arrays | optimizer, {"param_groups": groups}

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        load_numpy_state(self.online, prefixed(arrays, "online"))
        load_numpy_state(self.target, prefixed(arrays, "target"))
        load_optimizer_state(self.optimizer, arrays, "optimizer", meta["param_groups"])

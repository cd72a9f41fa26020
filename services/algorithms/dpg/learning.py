"""Ape-X DPG (Horgan et al. 2018): DDPG's deterministic policy and critic on n-step transitions,
actors exploring with Gaussian action noise of a per-actor scale."""

import numpy as np
import torch

from apexrl.algorithms.base import Learning, prefixed
from apexrl.algorithms.dpg.losses import critic_loss, policy_loss
from apexrl.algorithms.networks import (
    adam,
    load_numpy_state,
    load_optimizer_state,
    optimizer_state,
    state_to_numpy,
    sync_target,
)

# Element-wise bound on the policy's parameter gradients (Ape-X DPG clips them to [-1, 1]).
POLICY_GRAD_CLIP = 1.0


class DPGLearning(Learning):
    """Critic step, then policy step on the updated critic (DDPG's order), then targets.

    Gradient clipping: the critic's gradient norm to the learner's `max_grad_norm` (as DQN);
    the policy's parameter gradients element-wise to [-1, 1] (POLICY_GRAD_CLIP), our reading
    of Ape-X DPG's gradients "clipped to [-1, 1]" as a clip_by_value on the policy's
    gradients. Not on dQ/da: the tanh head already keeps actions inside the bounds, which is
    what clipping dQ/da at the action (inverting gradients) is for. With Adam normalising
    the step the clip rarely binds; it keeps one outsized batch from turning the policy.

    Targets: policy and critic synced every `target_update_interval` updates ([dpg]), a hard
    copy with target_tau 1 (Ape-X DPG: every 100 batches), DDPG's soft update with target_tau
    0.01 and interval 1.
    """

    def __init__(self, build, config, settings, device: torch.device):
        self.config, self.settings = config, settings
        self.online, self.target = build().to(device), build().to(device)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        self.critic_optimizer = adam(self.online.critic.parameters(), config.learning_rate)
        # One learning rate for both by default (as TD3); DDPG's paper: 1e-4 policy, 1e-3 critic.
        policy_rate = settings.policy_learning_rate or config.learning_rate
        self.policy_optimizer = adam(self.online.policy.parameters(), policy_rate)

    def update(self, batch, weights, step):
        online, target = self.online, self.target
        loss, td_errors, q = critic_loss(
            online.critic, target.policy, target.critic, batch, weights
        )
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(online.critic.parameters(), self.config.max_grad_norm)
        self.critic_optimizer.step()

        # The policy's gradient flows through the critic, which this step must leave alone.
        online.critic.requires_grad_(False)
        try:
            actor_loss = policy_loss(online.policy, online.critic, batch["obs"])
            self.policy_optimizer.zero_grad(set_to_none=True)
            actor_loss.backward()
        finally:
            online.critic.requires_grad_(True)
        torch.nn.utils.clip_grad_value_(online.policy.parameters(), POLICY_GRAD_CLIP)
        self.policy_optimizer.step()

        if step % self.settings.target_update_interval == 0:
            sync_target(target, online, self.settings.target_tau)
        figures = {
            "loss": loss.item(),
            "q_mean": q.mean().item(),
            "policy_loss": actor_loss.item(),
        }
        return td_errors.abs(), figures

    def parameters(self) -> dict[str, np.ndarray]:
        return state_to_numpy(self.online)

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {f"online/{k}": v for k, v in state_to_numpy(self.online).items()}
        arrays |= {f"target/{k}": v for k, v in state_to_numpy(self.target).items()}
        critic, critic_groups = optimizer_state(self.critic_optimizer, "critic_optimizer")
        policy, policy_groups = optimizer_state(self.policy_optimizer, "policy_optimizer")
        meta = {"critic_param_groups": critic_groups, "policy_param_groups": policy_groups}
        return arrays | critic | policy, meta

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        load_numpy_state(self.online, prefixed(arrays, "online"))
        load_numpy_state(self.target, prefixed(arrays, "target"))
        load_optimizer_state(
            self.critic_optimizer, arrays, "critic_optimizer", meta["critic_param_groups"]
        )
        load_optimizer_state(
            self.policy_optimizer, arrays, "policy_optimizer", meta["policy_param_groups"]
        )

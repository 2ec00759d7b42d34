"""DQN with epsilon-greedy exploration over valid actions and prioritized replay (seed 003, III-F).

* :class:`PrioritizedReplayBuffer`: SB3's :class:`~stable_baselines3.common.buffers.ReplayBuffer` with
  proportional prioritized sampling (Schaul et al., 2016): transition ``i`` is drawn with probability
  ``p_i^alpha / sum_j p_j^alpha``, new transitions get the largest priority so far, and each sample
  carries the importance weight ``(n * P(i))^-beta`` divided by the batch's largest.
* :class:`Sced2DQN`: SB3's :class:`~stable_baselines3.DQN` (unmodified, subclassed) whose random
  actions (warm-up and epsilon) are drawn among the valid actions (the mask at the observation's
  end, :mod:`trainer.sced2.env`), and whose update weighs the Huber loss by the importance weights,
  anneals ``beta`` linearly from ``beta0`` to 1 over training, and writes ``|TD error| + eps`` back
  as the sampled transitions' priorities.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import DQN
from stable_baselines3.common.buffers import ReplayBuffer
from torch.nn import functional as F

__all__ = ["PrioritizedReplayBuffer", "Sced2DQN", "valid_random_actions"]


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay over SB3's replay buffer (module docstring).

    :param alpha: priority exponent (0: uniform).
    :param beta0: initial importance-sampling exponent (the learner anneals it to 1).
    :param eps: added to ``|TD error|`` so that no transition gets priority 0.
    :param seed: seeds the sampling.
    """

    def __init__(self, *args: Any, alpha: float = 0.6, beta0: float = 0.4, eps: float = 1e-3, seed: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.n_envs != 1:
            raise ValueError("PrioritizedReplayBuffer supports one environment")
        self.alpha, self.beta, self.eps = float(alpha), float(beta0), float(eps)
        self.beta0 = float(beta0)
        self.priorities = np.zeros(self.buffer_size, dtype=np.float64)
        self.max_priority = 1.0
        self._rng = np.random.default_rng(seed)
        #: indices and importance weights of the last :meth:`sample`
        self.last_indices = np.zeros(0, dtype=np.int64)
        self.last_weights = np.zeros(0, dtype=np.float32)

    def add(self, *args: Any, **kwargs: Any) -> None:
        self.priorities[self.pos] = self.max_priority
        super().add(*args, **kwargs)

    def sample(self, batch_size: int, env=None):
        n = self.buffer_size if self.full else self.pos
        p = self.priorities[:n] ** self.alpha
        p /= p.sum()
        idx = self._rng.choice(n, size=batch_size, p=p)
        w = (n * p[idx]) ** (-self.beta)
        self.last_indices = idx
        self.last_weights = (w / w.max()).astype(np.float32)
        return self._get_samples(idx, env=env)

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Priorities of ``indices`` := ``|td_errors| + eps``."""
        pr = np.abs(np.asarray(td_errors, dtype=np.float64)).reshape(-1) + self.eps
        self.priorities[indices] = pr
        self.max_priority = max(self.max_priority, float(pr.max()))


def valid_random_actions(obs: np.ndarray, n_actions: int, rng: np.random.Generator) -> np.ndarray:
    """One uniformly random valid action per observation (``[B, D]``, the mask in its last ``n_actions``)."""
    obs = np.asarray(obs).reshape(-1, np.asarray(obs).shape[-1])
    out = np.empty(len(obs), dtype=np.int64)
    for i, o in enumerate(obs):
        valid = np.flatnonzero(o[-n_actions:] > 0.5)
        out[i] = rng.choice(valid) if valid.size else n_actions - 1
    return out


class Sced2DQN(DQN):
    """SB3's DQN with valid-action exploration and prioritized replay (module docstring)."""

    def _setup_model(self) -> None:
        super()._setup_model()
        self._explore_rng = np.random.default_rng(self.seed if self.seed is not None else 0)

    def _random_actions(self, observation: np.ndarray) -> np.ndarray:
        return valid_random_actions(observation, int(self.action_space.n), self._explore_rng)

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = False):
        if not deterministic and self._explore_rng.random() < self.exploration_rate:
            obs = np.asarray(observation)
            acts = self._random_actions(obs)
            return (acts if obs.ndim > 1 else acts[0]), state
        return self.policy.predict(observation, state, episode_start, deterministic)

    def _sample_action(self, learning_starts: int, action_noise=None, n_envs: int = 1):
        if self.num_timesteps < learning_starts:
            action = self._random_actions(self._last_obs)
        else:
            action, _ = self.predict(self._last_obs, deterministic=False)
        return action, action

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        buf = self.replay_buffer
        prioritized = isinstance(buf, PrioritizedReplayBuffer)
        if prioritized:
            buf.beta = buf.beta0 + (1.0 - buf.beta0) * (1.0 - self._current_progress_remaining)
        losses = []
        for _ in range(gradient_steps):
            data = buf.sample(batch_size, env=self._vec_normalize_env)
            discounts = data.discounts if getattr(data, "discounts", None) is not None else self.gamma
            with th.no_grad():
                next_q = self.q_net_target(data.next_observations).max(dim=1).values.reshape(-1, 1)
                target = data.rewards + (1 - data.dones) * discounts * next_q
            q = th.gather(self.q_net(data.observations), dim=1, index=data.actions.long())
            per = F.smooth_l1_loss(q, target, reduction="none")
            if prioritized:
                w = th.as_tensor(buf.last_weights, device=q.device).reshape(-1, 1)
                loss = (w * per).mean()
                buf.update_priorities(buf.last_indices, (q - target).detach().cpu().numpy())
            else:
                loss = per.mean()
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", float(np.mean(losses)))

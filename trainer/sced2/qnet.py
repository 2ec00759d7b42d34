"""The torch mirror of SCED2's Q-network (:class:`policies.sced2.Sced2Net`) and its SB3 policy.

:class:`Sced2TorchQ` computes exactly what :meth:`policies.sced2.Sced2Net.q_values` computes (the same
layers, names and shapes, float32; tested), on a batch of the environment's observations (the
codec's observation followed by the action mask, :mod:`trainer.sced2.env`), and sets the Q-value of
every masked action to :data:`policies.sced2.MASKED_Q`, so that SB3's DQN acts and bootstraps over
valid actions only. :func:`export_tensors` gives the numpy tensors :func:`policies.sced2.save_sced2`
writes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.dqn.policies import DQNPolicy
from torch import nn

from policies.codecs.sced2 import N_STATS, Sced2Spec
from policies.sced2 import MASKED_Q, TENSOR_NAMES, tensor_shapes

__all__ = ["Sced2DQNPolicy", "Sced2TorchQ", "export_tensors"]


class Sced2TorchQ(BasePolicy):
    """SCED2's shared-weight Q-network in torch (see :mod:`policies.sced2` for the architecture).

    :param spec: the codec spec (its ``nodes`` is ignored: ``N`` comes from the observation's length).
    :param hidden: ``H``; :param head: ``Hq``.
    """

    def __init__(self, observation_space: spaces.Box, action_space: spaces.Discrete, spec: Sced2Spec,
                 hidden: int = 32, head: int = 64, **kwargs: Any) -> None:
        super().__init__(observation_space, action_space, **kwargs)
        self.spec, self.hidden, self.head = spec, hidden, head
        shapes = tensor_shapes(spec, hidden, head)
        self.lin = nn.ModuleDict({p.replace(".", "_"): nn.Linear(shapes[p][0][1], shapes[p][0][0]) for p in TENSOR_NAMES})

    def _l(self, name: str) -> nn.Linear:
        return self.lin[name.replace(".", "_")]

    def q_all(self, obs: th.Tensor) -> th.Tensor:
        """``[B, J + 1]`` Q-values of ``[B, D]`` observations (mask ignored)."""
        spec = self.spec
        M, J, F, k = spec.gpus_per_node, spec.jobs, spec.job_features, spec.k
        B = obs.shape[0]
        n_gpu = obs.shape[1] - (J + 1) - J * F - N_STATS
        gpu = obs[:, :n_gpu].reshape(B, -1, M)
        jobs = obs[:, n_gpu: n_gpu + J * F].reshape(B, J, F)
        stats = obs[:, n_gpu + J * F: n_gpu + J * F + N_STATS]
        busy = (gpu > 0).float().mean(dim=2, keepdim=True)
        S = th.relu(self._l("srv.1")(th.relu(self._l("srv.0")(th.cat([gpu, busy], dim=2)))))
        pooled = th.cat([S.mean(dim=1), S.max(dim=1).values], dim=1)
        G = th.relu(self._l("job.1")(th.relu(self._l("job.0")(jobs))))
        present = (jobs[:, :, k] > 0).float().unsqueeze(2)
        mean_g = (G * present).sum(dim=1) / present.sum(dim=1).clamp(min=1.0)
        ctx = th.cat([pooled, stats], dim=1)
        x = th.cat([G, ctx.unsqueeze(1).expand(B, J, ctx.shape[1])], dim=2)
        q_jobs = self._l("q.1")(th.relu(self._l("q.0")(x))).squeeze(2)
        q_none = self._l("none.1")(th.relu(self._l("none.0")(th.cat([ctx, mean_g], dim=1))))
        return th.cat([q_jobs, q_none], dim=1)

    def forward(self, obs: th.Tensor) -> th.Tensor:
        """``[B, J + 1]`` Q-values with masked actions at :data:`MASKED_Q`."""
        mask = obs[:, -(self.spec.jobs + 1):] > 0.5
        return th.where(mask, self.q_all(obs), th.full_like(mask, MASKED_Q, dtype=obs.dtype))

    def _predict(self, observation: th.Tensor, deterministic: bool = True) -> th.Tensor:
        return self(observation).argmax(dim=1).reshape(-1)


class Sced2DQNPolicy(DQNPolicy):
    """SB3's :class:`DQNPolicy` with :class:`Sced2TorchQ` as its Q-network (and target network).

    ``policy_kwargs``: ``spec`` (the :class:`Sced2Spec` as a dict), ``hidden``, ``head``.
    """

    def __init__(self, observation_space, action_space, lr_schedule, spec: dict, hidden: int = 32, head: int = 64,
                 **kwargs: Any) -> None:
        self._sced2 = (Sced2Spec.from_dict(spec), int(hidden), int(head))
        kwargs.pop("net_arch", None)
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)

    def make_q_net(self) -> Sced2TorchQ:  # type: ignore[override]
        spec, hidden, head = self._sced2
        return Sced2TorchQ(self.observation_space, self.action_space, spec, hidden, head).to(self.device)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        spec, hidden, head = self._sced2
        data.update(spec=spec.to_dict(), hidden=hidden, head=head)
        return data


def export_tensors(q: Sced2TorchQ) -> dict[str, np.ndarray]:
    """The network's tensors as numpy float32, named as :data:`policies.sced2.TENSOR_NAMES`."""
    out = {}
    for p in TENSOR_NAMES:
        lin = q.lin[p.replace(".", "_")]
        out[p + ".weight"] = lin.weight.detach().cpu().numpy().astype(np.float32)
        out[p + ".bias"] = lin.bias.detach().cpu().numpy().astype(np.float32)
    return out

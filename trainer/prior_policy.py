"""sb3-contrib policy whose logits are ``action_net(latent) + AdmissionPrior(obs)``.

Stable-Baselines3 and sb3-contrib are used unmodified: the policy is a
subclass of :class:`sb3_contrib.common.maskable.policies.MaskableActorCriticPolicy`
with a features extractor that flattens the observation (exactly as SB3's
``FlattenExtractor``) and, on the way, computes the prior logits of the same
batch from its option-speed channels (see :mod:`policies.prior`). Every path
that builds an action distribution (``forward``, ``evaluate_actions``,
``get_distribution``) runs the features extractor on its observations right
before ``_get_action_dist_from_latent``, which adds the stored prior.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from sb3_contrib.common.maskable.distributions import MaskableDistribution
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.torch_layers import FlattenExtractor

from policies.prior import AdmissionPrior

__all__ = ["MaskablePriorPolicy", "PriorFlattenExtractor"]


class PriorFlattenExtractor(FlattenExtractor):
    """Flatten ``[B, C, N, 2G]`` to ``[B, C*N*2G]``; keep the prior logits of the batch.

    :param ks: number of placement actions ``K * S`` (the first ``ks`` channels are option speeds).
    :param theta: see :class:`policies.prior.AdmissionPrior`.
    :param scale: see :class:`policies.prior.AdmissionPrior`.
    """

    def __init__(self, observation_space: gym.Space, ks: int, theta: float = 0.8, scale: float = 1.0) -> None:
        super().__init__(observation_space)
        self.ks = int(ks)
        self.prior = AdmissionPrior(theta, scale)
        self.last_prior: torch.Tensor | None = None

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        g = observations.shape[-1] // 2
        speeds = observations[:, : self.ks, :, g:].flatten(2).amax(dim=2)  # [B, K*S], right half only
        self.last_prior = self.prior.logits_torch(speeds)  # [B, K*S + 1]
        return super().forward(observations)


class MaskablePriorPolicy(MaskableActorCriticPolicy):
    """MaskablePPO policy with the admission prior added to the action logits.

    Use with ``features_extractor_class=PriorFlattenExtractor`` and a shared
    features extractor (the default).
    """

    def _get_action_dist_from_latent(self, latent_pi: torch.Tensor) -> MaskableDistribution:
        fx = self.pi_features_extractor
        if not isinstance(fx, PriorFlattenExtractor) or fx.last_prior is None:
            raise RuntimeError("MaskablePriorPolicy needs PriorFlattenExtractor run on the same batch first")
        logits = self.action_net(latent_pi) + fx.last_prior
        return self.action_dist.proba_distribution(action_logits=logits)

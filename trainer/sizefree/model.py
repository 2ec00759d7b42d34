"""Torch mirror of :class:`policies.sizefree.SizeFreeNet` and the MaskablePPO policy class around it.

:class:`CandidateScorer` computes the same scores as the numpy network from the same tensors
(``cand.0``, ``cand.1``, ``cand.2``; :meth:`CandidateScorer.tensors` exports them). The critic
(:class:`SizeFreeExtractor`'s value branch) mean-pools the first hidden layer over the present
candidate rows, joins the context and maps it to ``H`` values; it is used in training only.

:class:`SizeFreeMaskablePolicy` subclasses sb3-contrib's ``MaskableActorCriticPolicy`` (unmodified
library): its ``mlp_extractor`` returns the candidates' scores as the actor latent and its
``action_net`` is the identity, so the logits are the scores (pointer-style head).
"""

from __future__ import annotations

import numpy as np
import torch
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from torch import nn

from policies.codecs.sizefree import N_CTX, SizeFreeSpec

__all__ = ["CandidateScorer", "SizeFreeExtractor", "SizeFreeMaskablePolicy"]


class CandidateScorer(nn.Module):
    """The shared candidate MLP ``F + C -> H -> H -> 1`` (module docstring)."""

    def __init__(self, spec: SizeFreeSpec, hidden: int = 64) -> None:
        super().__init__()
        self.spec, self.hidden = spec, hidden
        self.l0 = nn.Linear(spec.cand_features + N_CTX, hidden)
        self.l1 = nn.Linear(hidden, hidden)
        self.l2 = nn.Linear(hidden, 1)

    def split(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        R = self.spec.n_candidates
        F = self.spec.cand_features
        rows = obs[:, : R * F].reshape(-1, R, F)
        ctx = obs[:, R * F:]
        return rows, ctx

    def first(self, rows: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        x = torch.cat([rows, ctx.unsqueeze(1).expand(-1, rows.shape[1], -1)], dim=-1)
        return torch.relu(self.l0(x))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, J * P + 1]`` scores."""
        rows, ctx = self.split(obs)
        h = torch.relu(self.l1(self.first(rows, ctx)))
        return self.l2(h).squeeze(-1)

    def load_tensors(self, tensors: dict[str, np.ndarray]) -> None:
        """Set the weights from :meth:`tensors`' layout (a checkpoint's, :data:`policies.sizefree.TENSOR_NAMES`)."""
        with torch.no_grad():
            for name, layer in (("cand.0", self.l0), ("cand.1", self.l1), ("cand.2", self.l2)):
                w, b = tensors[name + ".weight"], tensors[name + ".bias"]
                if tuple(w.shape) != tuple(layer.weight.shape) or tuple(b.shape) != tuple(layer.bias.shape):
                    raise ValueError(f"{name}: shape {tuple(w.shape)} does not match the scorer's "
                                     f"{tuple(layer.weight.shape)} (hidden {self.hidden})")
                layer.weight.copy_(torch.as_tensor(w))
                layer.bias.copy_(torch.as_tensor(b))

    def tensors(self) -> dict[str, np.ndarray]:
        out = {}
        for name, layer in (("cand.0", self.l0), ("cand.1", self.l1), ("cand.2", self.l2)):
            out[name + ".weight"] = layer.weight.detach().cpu().numpy().astype(np.float32)
            out[name + ".bias"] = layer.bias.detach().cpu().numpy().astype(np.float32)
        return out


class SizeFreeExtractor(nn.Module):
    """SB3's ``mlp_extractor``: actor latent = candidate scores, critic latent = pooled ``H`` values."""

    def __init__(self, spec: SizeFreeSpec, hidden: int = 64) -> None:
        super().__init__()
        self.scorer = CandidateScorer(spec, hidden)
        self.critic = nn.Sequential(nn.Linear(hidden + N_CTX, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.latent_dim_pi = spec.n_candidates
        self.latent_dim_vf = hidden

    def forward_actor(self, obs: torch.Tensor) -> torch.Tensor:
        return self.scorer(obs)

    def forward_critic(self, obs: torch.Tensor) -> torch.Tensor:
        rows, ctx = self.scorer.split(obs)
        h = self.scorer.first(rows, ctx)
        present = rows[..., 1:2]
        pooled = (h * present).sum(1) / present.sum(1).clamp(min=1.0)
        return self.critic(torch.cat([pooled, ctx], dim=-1))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(obs), self.forward_critic(obs)


class SizeFreeMaskablePolicy(MaskableActorCriticPolicy):
    """MaskablePPO policy with the pointer-style candidate scorer (module docstring).
    ``policy_kwargs``: ``spec`` (a :class:`SizeFreeSpec` dict) and ``hidden``."""

    def __init__(self, *args, spec: dict | None = None, hidden: int = 64, **kwargs) -> None:
        self._sf_spec = SizeFreeSpec.from_dict(spec) if spec is not None else SizeFreeSpec()
        self._sf_hidden = hidden
        kwargs.setdefault("ortho_init", False)
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = SizeFreeExtractor(self._sf_spec, self._sf_hidden)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        self.action_net = nn.Identity()
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    @property
    def scorer(self) -> CandidateScorer:
        return self.mlp_extractor.scorer

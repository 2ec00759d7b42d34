"""A valid policy checkpoint with random weights, for tests that need one on disk (test_rl, test_evaluate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from policies.checkpoint import save_checkpoint
from policies.cluster import ClusterSpec
from policies.codecs.deepshare import ObsSpec


def write_random_checkpoint(path: str | Path, cluster: ClusterSpec, seed: int = 0,
                            reward: dict | None = None) -> Path:
    """Save a one-hidden-layer (16 units) MaskablePPO-layout checkpoint for ``cluster`` at ``path``.

    :param reward: the checkpoint's reward metadata (default ``progress`` with W1 0.4).
    :returns: the JSON path :func:`save_checkpoint` wrote.
    """
    spec = ObsSpec.for_cluster(cluster)
    rng = np.random.default_rng(seed)
    n_in = int(np.prod(spec.shape))
    t = {
        "mlp_extractor.policy_net.0.weight": rng.normal(size=(16, n_in)).astype(np.float32) * 0.05,
        "mlp_extractor.policy_net.0.bias": np.zeros(16, np.float32),
        "action_net.weight": rng.normal(size=(spec.n_actions, 16)).astype(np.float32),
        "action_net.bias": np.zeros(spec.n_actions, np.float32),
    }
    return save_checkpoint(
        path,
        t,
        algo="maskable-ppo",
        mode="rl-base",
        cluster=cluster,
        spec=spec,
        layers=["mlp_extractor.policy_net.0", "action_net"],
        activation="tanh",
        reward=reward or {"kind": "progress", "w1": 0.4, "w2": 0.6},
        training={},
    )

"""Record (or check) the golden episodes of the Gymnasium environment (``trainer.env.PlacementEnv``).

    python tests/golden/record_env.py                 # rewrite tests/golden/env.json
    python tests/golden/record_env.py --full F.pkl    # also dump every step (obs hash, mask, action, reward, ...)
    python tests/golden/record_env.py --compare F.pkl # compare every step with such a dump

Each case plays episodes of one environment with a seeded random policy that picks a valid action
uniformly (and, with probability ``eps``, any action, valid or not, to exercise the invalid-action
penalty). ``tests/golden/env.json`` keeps per episode the step count, the sum of rewards, the final
simulated time, the jobs finished, whether it was terminated or truncated, and a SHA-256 digest of
the actions, masks and termination flags of every step; ``tests/test_env.py`` replays the cases and
compares (rewards within 1e-9 relative).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import pickle
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from policies.cluster import ClusterSpec  # noqa: E402
from policies.perf import ContentionModel  # noqa: E402
from trainer.env import PlacementEnv  # noqa: E402
from trainer.traces import load_trace  # noqa: E402

T0 = "data/traces/deepshare/simulate/trace0.json"
POISSON = "tests/golden/poisson-16x8.csv"
HEAVY = "tests/golden/heavy-4x8.csv"

#: (case name, cluster, [(trace file, first job, end job)], env keyword arguments, episodes, eps)
CASES = [
    ("t0-progress", "4x8", [(T0, 0, 48), (T0, 48, 96)], {"reward": "progress"}, 2, 0.0),
    ("t0-progress-noshape", "4x8", [(T0, 0, 48)], {"reward": "progress", "shaping": False}, 1, 0.0),
    ("t0-jct", "4x8", [(T0, 0, 48)], {"reward": "jct"}, 1, 0.05),
    ("t0-jct-shape", "4x8", [(T0, 96, 144)], {"reward": "jct", "shaping": True, "gamma": 0.95}, 1, 0.0),
    ("t0-jct-rel", "4x8", [(T0, 0, 48), (T0, 144, 192)], {"reward": "jct-rel"}, 2, 0.0),
    ("t0-seed", "4x8", [(T0, 0, 48)], {"reward": "seed", "w1": 0.3}, 1, 0.05),
    ("t0-trunc", "4x8", [(T0, 0, 48)], {"reward": "jct", "max_steps": 30}, 2, 0.0),
    ("poisson-jct-rel-plan", "16x8", [(POISSON, 0, 60)], {"reward": "jct-rel", "order": "plan"}, 1, 0.0),
    ("poisson-progress", "16x8", [(POISSON, 30, 90)], {"reward": "progress"}, 1, 0.05),
    ("poisson-seed-noshape", "16x8", [(POISSON, 0, 60)], {"reward": "seed", "shaping": False}, 1, 0.0),
    ("heavy-jct-fill", "4x8", [(HEAVY, 0, 48)], {"reward": "jct", "order": "fill", "invalid_penalty": -0.3}, 1, 0.1),
]


def _traces(cluster: ClusterSpec, parts) -> list:
    cache: dict[str, list] = {}
    out = []
    for src, a, b in parts:
        if src not in cache:
            cache[src] = load_trace(REPO / src, cluster=cluster)
        out.append(cache[src][a:b])
    return out


def play(case) -> list[list[tuple]]:
    """Every step of every episode of ``case``: ``(obs sha256, mask bytes, action, reward, terminated,
    truncated, time, finished)``."""
    _name, cl, parts, kwargs, episodes, eps = case
    cluster = ClusterSpec.parse(cl)
    perf = ContentionModel(cluster)
    env = PlacementEnv(_traces(cluster, parts), cluster, perf=perf, **kwargs)
    rng = np.random.default_rng(1234)
    out = []
    for ep in range(episodes):
        obs, _info = env.reset(seed=100 + ep)
        steps = [(hashlib.sha256(obs.tobytes()).hexdigest(), b"", -1, 0.0, False, False, _info["time"], 0)]
        while True:
            m = env.action_masks()
            if eps > 0 and rng.random() < eps:
                a = int(rng.integers(len(m)))
            else:
                a = int(rng.choice(np.flatnonzero(m)))
            obs, r, term, trunc, info = env.step(a)
            steps.append((hashlib.sha256(obs.tobytes()).hexdigest(), m.tobytes(), a, float(r), bool(term),
                          bool(trunc), float(info["time"]), int(info["finished"])))
            if term or trunc:
                break
        out.append(steps)
    return out


def summary(episodes: list[list[tuple]]) -> list[dict]:
    """Per episode: steps, reward sum, final time, finished jobs, end flags and the digest of actions, masks, flags."""
    out = []
    for steps in episodes:
        h = hashlib.sha256()
        for _o, m, a, _r, term, trunc, _t, fin in steps:
            h.update(m + f"|{a}|{int(term)}{int(trunc)}|{fin};".encode())
        last = steps[-1]
        out.append({
            "steps": len(steps) - 1,
            "reward_sum": math.fsum(s[3] for s in steps),
            "time": last[6],
            "finished": last[7],
            "terminated": last[4],
            "truncated": last[5],
            "digest": h.hexdigest(),
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", type=Path, help="also write every step of every case to this pickle")
    ap.add_argument("--compare", type=Path, help="compare every step with this pickle (written by --full)")
    args = ap.parse_args()
    full, summ = {}, {}
    for case in CASES:
        t0 = time.perf_counter()
        full[case[0]] = play(case)
        summ[case[0]] = summary(full[case[0]])
        steps = sum(s["steps"] for s in summ[case[0]])
        print(f"{case[0]}: {steps} steps, {time.perf_counter() - t0:.2f} s", flush=True)
    if args.compare:
        want = pickle.loads(args.compare.read_bytes())
        bad, worst = 0, 0.0
        for name, eps in full.items():
            for e, (g, w) in enumerate(zip(eps, want[name], strict=True)):
                if len(g) != len(w):
                    print(f"{name} episode {e}: {len(g) - 1} steps, recorded {len(w) - 1}")
                    bad += 1
                for i, (gs, ws) in enumerate(zip(g, w)):
                    same = gs[:3] == ws[:3] and gs[4:6] == ws[4:6] and gs[7] == ws[7]
                    close = (math.isclose(gs[3], ws[3], rel_tol=1e-9, abs_tol=1e-12)
                             and math.isclose(gs[6], ws[6], rel_tol=1e-12))
                    if gs[3] != ws[3]:
                        worst = max(worst, abs(gs[3] - ws[3]) / abs(ws[3]) if ws[3] else math.inf)
                    if not (same and close):
                        print(f"{name} episode {e} step {i}: {gs[2:]} != {ws[2:]} "
                              f"(obs, mask equal: {gs[:2] == ws[:2]})")
                        bad += 1
                        break
        n = sum(len(s) - 1 for eps in full.values() for s in eps)
        print(f"compared {n} steps: {'all equal' if not bad else f'{bad} differences'}; "
              f"largest relative difference of a reward: {worst:.3g}")
        sys.exit(1 if bad else 0)
    if args.full:
        args.full.write_bytes(pickle.dumps(full))
    (HERE / "env.json").write_text(json.dumps(summ, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""``rl-sf`` training: the one-pick-per-step Gymnasium environment (:mod:`trainer.sizefree.env`), the
torch mirror of the candidate scorer and its MaskablePPO policy class (:mod:`trainer.sizefree.model`),
behaviour cloning of a heuristic then MaskablePPO fine-tuning (:mod:`trainer.sizefree.train`). The
policy itself is :mod:`policies.sizefree`."""

"""DL2's training: supervised warm-up on DRF, then online actor-critic RL (:mod:`trainer.dl2.train`);
``rlsched train-dl2`` (:mod:`trainer.dl2.cli`)."""

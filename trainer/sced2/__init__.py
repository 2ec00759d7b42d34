"""SCED2 (seed 003) training: Philly-derived job sequences (:mod:`trainer.sced2.sequences`), the
one-pick-per-step Gymnasium environment (:mod:`trainer.sced2.env`), the torch mirror of the
shared-weight Q-network (:mod:`trainer.sced2.qnet`), DQN with prioritized replay
(:mod:`trainer.sced2.dqn`) and the training run (:mod:`trainer.sced2.train`). The policy itself is
:mod:`policies.sced2`."""

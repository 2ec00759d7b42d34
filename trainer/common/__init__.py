"""Training pieces shared by the learned-policy families: the one-pick Gymnasium environment base
(:mod:`trainer.common.pick_env`) and the train-command shell (:mod:`trainer.common.train_cli`)."""

"""Chic / Chic-Pair (seed 001): training by the modified cross-entropy method (:mod:`trainer.chic.train`),
evaluation and the docs' Chic sections (:mod:`trainer.chic.results`), the CLI (:mod:`trainer.chic.cli`)."""

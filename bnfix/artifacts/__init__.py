"""Artifact front-end: checkpoints, saved models and graphs lifted into BN layers for `bnfix inspect`."""

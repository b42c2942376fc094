"""Experiments that reproduce the lectures' results; run ``python -m experiments --help``."""

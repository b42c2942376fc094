"""Experiments that reproduce results of private optimisation theory (``python -m experiments``)."""

"""Experiments that reproduce dpjax's results; ``python -m experiments --help`` lists them."""

"""Benchmarks of dpjax's DP-SGD step against a non-private step (``python -m benchmarks``)."""

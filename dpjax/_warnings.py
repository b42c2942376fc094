"""Warnings shared across dpjax (one class per kind, importable from one place)."""


class PrivacyLeakWarning(UserWarning):
    """Something is released outside the stated privacy guarantee, or the guarantee is void."""

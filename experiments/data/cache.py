"""Where the data files live, and the checks every loader runs before reading one.

The cache folder is ``$DPJAX_DATA`` when that environment variable is set, else
``~/.cache/dpjax/data``; it lies outside the repository, and ``make data`` fills it. A file is
read only when it exists AND its SHA-256 equals the one kept in
:data:`experiments.data.checksums.FILES`; otherwise the loader stops with an error that says how
to get the file.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

from experiments.data import checksums

ENV_VAR = "DPJAX_DATA"
DEFAULT_DIR = pathlib.Path("~/.cache/dpjax/data")
FETCH_HINT = "make data"


class DataMissingError(FileNotFoundError):
    """A data file is not in the cache folder (the message says how to get it)."""


class ChecksumError(ValueError):
    """A data file's SHA-256 differs from the one kept in the repository."""


def data_dir() -> pathlib.Path:
    """The cache folder: ``$DPJAX_DATA`` or ``~/.cache/dpjax/data`` (not created here)."""
    value = os.environ.get(ENV_VAR, "").strip()
    return pathlib.Path(value).expanduser() if value else DEFAULT_DIR.expanduser()


def sha256(path: pathlib.Path) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def how_to_get(dataset: str) -> str:
    """The instruction printed when ``dataset``'s files are missing or corrupted."""
    source = checksums.SOURCES[dataset]
    return (
        f"Get it with `{FETCH_HINT}` (or `python -m experiments.data fetch {dataset}`), which "
        f"runs `{source['client']}` and unpacks {source['inside']} of {source['archive']} into "
        f"{data_dir() / dataset}. Set {ENV_VAR} to use another folder "
        f"(now: {data_dir()})."
    )


def verified_path(relative: str) -> pathlib.Path:
    """The cached file ``relative`` (e.g. ``"mnist/train-labels-idx1-ubyte"``), checked.

    Raises:
        ValueError: ``relative`` has no checksum in the repository.
        DataMissingError: the file is not in the cache folder.
        ChecksumError: its SHA-256 is not the one kept in the repository.
    """
    if relative not in checksums.FILES:
        raise ValueError(f"relative must be a file listed in checksums.FILES; got {relative!r}")
    dataset = relative.split("/", 1)[0]
    path = data_dir() / relative
    if not path.is_file():
        raise DataMissingError(f"{dataset}: data file {path} is missing. {how_to_get(dataset)}")
    found, expected = sha256(path), checksums.FILES[relative]
    if found != expected:
        raise ChecksumError(
            f"{dataset}: {path} has SHA-256 {found}, expected {expected} (the file is corrupted "
            f"or not the release dpjax was checked against). Delete it and run `{FETCH_HINT}`."
        )
    return path

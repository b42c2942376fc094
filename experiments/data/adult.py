"""UCI Adult (Kohavi 1996; ``adult.data`` 32 561 rows, ``adult.test`` 16 281 rows), one-hot
encoded into 105 features with every row of norm ≤ 1, labels ±1 (+1: income > 50K).

Preprocessing. The privacy theorems of Chaudhuri, Monteleoni, Sarwate (2011), *Differentially
private empirical risk minimization*, JMLR 12 (https://jmlr.org/papers/v12/chaudhuri11a.html,
Theorems 6 and 9) assume every row has ‖x‖ ≤ 1; their Adult experiments drop the records with
missing values and encode the categorical attributes as binary indicators. Here:

1. rows holding a missing value (``?``) are dropped (30 162 training, 15 060 test rows remain);
2. the 8 categorical attributes become one-hot blocks over the category lists published in
   ``adult.names`` (99 indicators; a category outside the list is an error);
3. the 6 continuous attributes are divided by fixed constants, the ranges of the published
   release (age 90, fnlwgt 1 490 400, education-num 16, capital-gain 99 999 — the census
   top-code —, capital-loss 4 356, hours-per-week 99), and clipped to [0, 1]: constants in
   the code, never statistics computed from the rows being trained on;
4. every row is divided by √14, the largest norm a row can have after steps 2–3 (8 ones and 6
   values ≤ 1), so ‖x‖ ≤ 1 holds for every possible record, the neighbour included.

Step 4 is a fixed, data-independent map; a per-row projection x/‖x‖ would also be
data-independent but changes the geometry row by row.
"""

from __future__ import annotations

import math

import numpy as np

from experiments.data import cache

COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country",
)  # fmt: skip

# adult.names: the category lists of the categorical attributes (public schema)
CATEGORIES: dict[str, tuple[str, ...]] = {
    "workclass": (
        "Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
        "Without-pay", "Never-worked",
    ),
    "education": (
        "Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm",
        "Assoc-voc", "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate",
        "5th-6th", "Preschool",
    ),
    "marital-status": (
        "Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
        "Married-spouse-absent", "Married-AF-spouse",
    ),
    "occupation": (
        "Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
        "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
        "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv",
        "Armed-Forces",
    ),
    "relationship": (
        "Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried",
    ),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "sex": ("Female", "Male"),
    "native-country": (
        "United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
        "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba",
        "Iran", "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico",
        "Portugal", "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan",
        "Haiti", "Columbia", "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand",
        "Yugoslavia", "El-Salvador", "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands",
    ),
}  # fmt: skip

# fixed scale of each continuous attribute (the ranges of the published release)
CONTINUOUS_SCALE: dict[str, float] = {
    "age": 90.0,
    "fnlwgt": 1_490_400.0,
    "education-num": 16.0,
    "capital-gain": 99_999.0,
    "capital-loss": 4_356.0,
    "hours-per-week": 99.0,
}
POSITIVE = ">50K"
ROW_SCALE = math.sqrt(len(CATEGORIES) + len(CONTINUOUS_SCALE))  # √14: the largest row norm
SPLITS = {"train": "adult/adult.data", "test": "adult/adult.test"}


def feature_names() -> list[str]:
    """The 105 column names: the continuous attributes, then ``attribute=category``."""
    names = list(CONTINUOUS_SCALE)
    for column, values in CATEGORIES.items():
        names += [f"{column}={v}" for v in values]
    return names


def parse_records(text: str, *, name: str = "adult") -> tuple[list[list[str]], int]:
    """Complete records of an ``adult.data``/``adult.test`` text, and the count dropped.

    Blank lines and the test file's ``|1x3 Cross validator`` line are skipped; a record with a
    ``?`` field is dropped (counted); a line that is not 15 comma-separated fields is an error.
    """
    records, dropped = [], 0
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("|"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(COLUMNS) + 1:
            raise ValueError(f"{name} line {number}: expected 15 fields; got {len(fields)}")
        if "?" in fields:
            dropped += 1
            continue
        records.append(fields)
    return records, dropped


def encode(records: list[list[str]], *, name: str = "adult") -> tuple[np.ndarray, np.ndarray]:
    """Features (n, 105) float64 with ‖x‖ ≤ 1 and labels (n,) int ±1 of parsed records."""
    width = len(feature_names())
    X = np.zeros((len(records), width))
    y = np.empty(len(records), dtype=np.int64)
    position = {c: i for i, c in enumerate(COLUMNS)}
    for row, fields in enumerate(records):
        for j, (column, scale) in enumerate(CONTINUOUS_SCALE.items()):
            X[row, j] = min(max(float(fields[position[column]]) / scale, 0.0), 1.0)
        offset = len(CONTINUOUS_SCALE)
        for column, values in CATEGORIES.items():
            value = fields[position[column]]
            if value not in values:
                raise ValueError(f"{name}: {column} must be in adult.names' list; got {value!r}")
            X[row, offset + values.index(value)] = 1.0
            offset += len(values)
        label = fields[-1].rstrip(".")  # adult.test writes ">50K." and "<=50K."
        if label not in (POSITIVE, "<=50K"):
            raise ValueError(f"{name}: the income label must be >50K or <=50K; got {label!r}")
        y[row] = 1 if label == POSITIVE else -1
    return X / ROW_SCALE, y


def load_adult(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Adult ``split`` ("train": adult.data, 30 162 complete rows; "test": adult.test, 15 060):
    features (n, 105) float64 with every ‖x‖ ≤ 1 and labels ±1 (+1: income > 50K).

    Reads ``$DPJAX_DATA/adult/adult.{data,test}`` after checking their SHA-256.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)!r}; got {split!r}")
    path = cache.verified_path(SPLITS[split])
    records, _ = parse_records(path.read_text(encoding="latin-1"), name=str(path))
    return encode(records, name=str(path))

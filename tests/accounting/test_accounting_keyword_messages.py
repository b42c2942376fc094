"""Error messages name the public keyword ``accounting=``, not an internal ``method=``."""

import pathlib

import dpjax


def test_no_message_in_dpjax_says_method_equals_for_accounting():
    root = pathlib.Path(dpjax.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "method='" in line and ("rdp" in line or "pld" in line):
                offenders.append(f"{path.name}:{n}")
            if "method={method" in line or '``method="rdp"``' in line:
                offenders.append(f"{path.name}:{n}")
    assert offenders == []

"""Matrix-factorization (correlated-noise) mechanisms: strategies, streaming noise, accounting.

Placeholder of the mfnoise branch: helper ``mf`` owns this file (the lead takes mf's version and
adds ``streaming``, ``accounting`` and ``config`` to it at merge).
"""

"""Corpus preparation: one folder per corpus (data/<name>/prepare.py), shared code in common.py."""

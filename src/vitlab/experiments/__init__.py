"""Experiments that test the paper's claims at laptop scale; each writes its numbers (CSV/JSON) and
figures (PNG) to a folder and prints a table. `demo`: the mini experiment (`vitlab demo`)."""

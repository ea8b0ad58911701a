"""The hub's neutral helpers: what several apps share, importing no app.

Choice sets, the gate types, the content-addressed store, JSON input, downloads, the
figure style, the accuracy rule and hand-written SQL. pyproject.toml's import-linter
contract keeps this package below every app.
"""

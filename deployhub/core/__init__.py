"""The hub's neutral helpers: what several apps share, importing no app.

choices (choice sets with a label and a colour), gates (the gate types every release
gate speaks), store (the content-addressed store), json_input (the JSON and text people
and devices send), downloads (a download's name), figure_style (a colour per precision,
a symbol per backend), accuracy (how an evaluation is judged), handwritten (hand-written
SQL for the device calls), worker_dist (the worker wheel the hub serves) and sections
(the parts of a page that apps above its owner contribute).
pyproject.toml's import-linter contract keeps this package below every app.
"""

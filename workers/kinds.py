"""The job kinds of the device protocol (docs/protocol.md), each spelled here once.

The hub's JobKind takes its values from here and the worker's runner keys its
work on them, so hub and device cannot disagree on a name.
"""

BENCHMARK = "benchmark"
NOOP = "noop"
EXPORT = "export"
COMPILE = "compile"
EVALUATE = "evaluate"
PARITY = "parity"
COMPARE = "compare"

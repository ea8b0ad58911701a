"""The Pareto frontier over (latency, accuracy, memory): lower, higher and lower are better.

A build is on the frontier when no other build is at least as good on every axis and
strictly better on one. Equal builds do not dominate each other (both stay); a build
better on two axes and worse on the third stays too. A memory that was not measured
is left out of that comparison (None), so it neither wins nor loses on memory.
"""

import math


def _better_or_equal(a, b):
    """Return (no worse on every axis, strictly better on one) of a against b."""
    pairs = [(-a[0], -b[0]), (a[1], b[1])]
    if a[2] is not None and b[2] is not None:
        pairs.append((-a[2], -b[2]))
    no_worse = all(x >= y for x, y in pairs)
    return no_worse, no_worse and any(x > y for x, y in pairs)


def dominates(a, b):
    """Tell whether build a = (latency, accuracy, memory) dominates build b."""
    return _better_or_equal(a, b)[1]


def pareto_front(points):
    """Return the indices of the points on the frontier, in the order of `points`.

    points: [(latency_ms, accuracy, memory_mb or None)]. Sorted by latency, then
    accuracy, then memory, a point can only be dominated by one before it, and by
    then by one on the frontier: O(n * frontier), not O(n²).
    """

    def key(index):
        latency, accuracy, memory = points[index]
        return (latency, -accuracy, math.inf if memory is None else memory)

    front = []
    for index in sorted(range(len(points)), key=key):
        if not any(dominates(points[kept], points[index]) for kept in front):
            front.append(index)
    return sorted(front)

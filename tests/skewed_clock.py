"""Run a module with this process's wall clock shifted: a device whose clock is off.

    python -m tests.skewed_clock SECONDS -m MODULE [ARGS...]

`time.time`, `time.time_ns` and `datetime.datetime.now/utcnow/today` read SECONDS
ahead (negative: behind) of the machine's clock, for everything the module imports
afterwards (the worker, Celery, kombu, logging). Monotonic clocks are untouched, as
on a real machine whose wall clock is wrong. The fault soak starts a worker this way
(faketime is not installed here).
"""

import datetime as datetime_module
import runpy
import sys
import time


def skew(offset):
    """Shift the wall clock of this process by `offset` seconds."""
    real_time, real_time_ns, real_datetime = time.time, time.time_ns, datetime_module.datetime
    time.time = lambda: real_time() + offset
    time.time_ns = lambda: real_time_ns() + int(offset * 1e9)

    class SkewedDatetime(real_datetime):
        @classmethod
        def now(cls, tz=None):
            return real_datetime.now(tz) + datetime_module.timedelta(seconds=offset)

        @classmethod
        def utcnow(cls):
            return real_datetime.now(datetime_module.UTC).replace(tzinfo=None) + (
                datetime_module.timedelta(seconds=offset)
            )

        @classmethod
        def today(cls):
            return cls.now()

    datetime_module.datetime = SkewedDatetime


def main(argv):
    if len(argv) < 3 or argv[1] != "-m":
        sys.exit("usage: python -m tests.skewed_clock SECONDS -m MODULE [ARGS...]")
    skew(float(argv[0]))
    module = argv[2]
    sys.argv = [module, *argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])

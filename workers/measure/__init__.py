"""Measurement on the device: how fast a model or engine runs and how steady that figure is.

benchmark.py is the harness (warm-up, timed runs, stability, batch sweeps); latency.py
summarises the timings; server_scenario.py replays a server's arrivals; gpu_timing.py
reads the GPU's own clock and state; side_by_side.py times several engines in turn in
one process; feeds.py makes the inputs every run is fed, from the version's signature.
"""

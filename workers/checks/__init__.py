"""What a worker checks of a model, and the hub checks with the same code.

preprocessing.py reads and runs a version's preprocessing spec, and parity.py checks a
parity pack against it; golden.py reads golden pairs and compares an engine's outputs
with them; evaluate.py compares an engine with its FP32 source on a dataset (scored by
workers/tasks/); export.py exports a .pt2 program to ONNX and convert.py converts an ONNX
model's opset, each checking how far the result strays from its source.
"""

"""Fast paths and their measurement: CPU inference with Linear weights packed once (cpu_inference.py),
CPU training with the faster matrix library per product (cpu_training.py), and `vitlab bench`
(bench.py)."""

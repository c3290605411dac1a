"""Datasets: the synthetic dataset X of the mini experiment, bundled real digits, Fashion-MNIST, image
folders; data kept in memory as uint8 tensors and augmented per batch (memory.py); the seeded subsets the
experiments train on (subsets.py)."""

from vitlab.data.synthetic import make_dataset_x

__all__ = ["make_dataset_x"]

"""Datasets: the seed's synthetic dataset X, bundled real digits, and image folders."""

from vitlab.data.synthetic import make_dataset_x

__all__ = ["make_dataset_x"]

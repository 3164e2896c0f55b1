"""Helpers shared by several test modules: the cluster in a box lives in ``cluster/``."""

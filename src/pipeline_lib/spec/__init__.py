"""Torch-free description of an experiment: config, run paths, shared names, identities."""

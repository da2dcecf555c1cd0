"""Evaluation of kept snapshots: the one-pass H_eff sweep and its summary."""

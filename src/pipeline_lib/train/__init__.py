"""Training: batch plan, lr schedules, optimizers, spike guard, weights EMA (and the loop).

Import the submodules themselves: this package imports nothing, so the torch-free units
(``schedule``, ``batch_plan``, ``spike_guard``) load without torch.
"""

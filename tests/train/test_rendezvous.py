"""The derived rendezvous port and the one line of a rendezvous that never completed (the
address derived from a real allocation is tested under the two-node cluster:
tests/workflow/test_slurm_nodes.py)."""

from __future__ import annotations

from pipeline_lib.train.rendezvous import (
    Rendezvous,
    after_node_loss,
    rendezvous_failure,
    rendezvous_port,
)

RDZV = Rendezvous("10.241.17.1:24242", 3, ("node1", "node2", "node3"), 30)
# what torchrun prints on a node whose rendezvous timed out, as srun --label shows it
TIMED_OUT = [
    "0: Traceback (most recent call last):\n",
    "0:   File \".../dynamic_rendezvous.py\", line 680, in _run\n",
    "0: torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n",
    "2: torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n",
    "srun: error: node1: task 0: Exited with exit code 1\n",
]


def test_the_port_is_20000_plus_the_job_id_mod_20000() -> None:
    assert rendezvous_port("4242") == 24242
    assert rendezvous_port("20000") == 20000 and rendezvous_port("59999") == 39999


def test_a_timed_out_rendezvous_names_the_nodes_that_did_not_join_and_the_timeout() -> None:
    line = rendezvous_failure(RDZV, TIMED_OUT)
    assert line == ("the rendezvous at 10.241.17.1:24242 did not complete within 30 s: node2 "
                    "did not join (a node whose torchrun did not start, or that cannot reach "
                    "10.241.17.1:24242; train.rdzv_timeout_s sets the wait)")
    assert "\n" not in line


def test_without_labels_it_says_how_many_nodes_were_expected() -> None:
    lone = Rendezvous("127.0.0.1:29400", 2, (), 5)
    line = rendezvous_failure(lone, ["torch.distributed.elastic.rendezvous.api."
                                   "RendezvousTimeoutError\n"])
    assert line is not None and "within 5 s: fewer than 2 nodes joined" in line


def test_other_failures_are_not_a_rendezvous_timeout() -> None:
    assert rendezvous_failure(RDZV, ["0: RuntimeError: connection reset by peer\n"]) is None


def test_going_on_after_a_node_loss_is_asked_for_and_needs_a_slurm_job() -> None:
    """No min_nnodes, or no SLURM job to ask which nodes are left: the failure stands (the
    nodes left are read from a real allocation in tests/workflow/test_slurm_nodes.py)."""
    assert after_node_loss(RDZV, "", 0, {"SLURM_JOB_ID": "4242"}) is None
    assert after_node_loss(RDZV, "", 2, {}) is None
    assert after_node_loss(Rendezvous("n1:1", 2, (), 5), "n1:1", 1, {"SLURM_JOB_ID": "1"}) is None

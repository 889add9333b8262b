"""Rollouts: the batched sampler (``runner.py``), the chat template and tool-call
parsing (``chat.py``), oracle traces (``oracle.py``) and the teacher's privileged view
of a trajectory (``privileged.py``).

This package samples and renders; it does not score, train or talk to the teacher.
It exports nothing itself.
"""

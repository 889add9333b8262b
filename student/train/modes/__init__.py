"""The training modes as functions over a :class:`~miniverl.student.train.state.TrainState`:
``sft``, ``offline_kd``, ``opd``, ``replay``, ``dpo``; one module each.

Each mode's cycle returns what it did (a ``CycleResult``) and leaves logging,
evaluation and checkpoints to ``loop.py``. This package exports nothing itself.
"""

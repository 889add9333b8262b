"""The training modes, one class each over a :class:`~miniverl.student.train.state.TrainState`:
``sft``, ``offline_kd`` (with GKD mixing), ``opd``, ``replay``, ``dpo``, ``rl``; one module each,
peers (none imports another).

Each mode's ``cycle`` returns what it did (a ``CycleResult``) and leaves logging,
evaluation and checkpoints to ``loop.py``. This package exports nothing itself.
"""

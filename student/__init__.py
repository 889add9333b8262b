"""The student process: environments, rollouts, losses, trainer, targets cache, checkpoints,
eval. Run with ``python -m miniverl.student``.

Never imports ``miniverl.teacher_server``.
"""

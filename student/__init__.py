"""The student process, in rooms: ``train/`` (the loop over explicit state, modes, teacher
link, updates, losses), ``rollout/`` (runner, chat template, oracle, privileged view),
``environments/`` (public, torch-free), ``report/``, ``benchmark/``; at this level the
targets cache, checkpoints, eval, the control socket and the entry points. Run with
``python -m miniverl.student``.

Never imports ``miniverl.teacher_server``.
"""

"""The student's training: the loop over explicit state, the modes, the teacher link,
updates and losses.

Start at ``trainer.py`` (the public :class:`~miniverl.student.train.trainer.Trainer`),
then ``loop.py`` (one cycle, top to bottom). This package exports nothing itself.
"""

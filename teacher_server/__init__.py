"""The teacher process: load a frozen teacher, score the states the student visited, serve them
over mvl-score/1, reload, park and wake. Run with ``python -m miniverl.teacher_server``.

Never imports ``miniverl.student``.
"""

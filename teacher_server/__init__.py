"""The teacher process: load a frozen teacher, score the states the student visited, serve them
over mvl-score/1, reload, park and wake. Run with ``python -m miniverl.teacher_server``.

Rooms: ``server`` (ROUTER loop, admission), ``batcher`` (queue, coalescing, deadlines),
``lifecycle`` (load, reload, park/wake, shutdown), ``server_state`` (the server's state and
shared reply helpers), ``backend`` (the Backend interface), ``torch_backend`` (the
built-in backend), ``scorers`` (scorer plug-ins and the loader), ``loader``,
``scoring``, ``prefix_cache``, ``jsonlog``.

Never imports ``miniverl.student``.
"""

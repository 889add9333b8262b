"""The student's side of its teacher: four links, the one contract they keep, and the
connect that picks one.

An update asks its link for the same few things whatever the teacher
(:class:`~miniverl.student.train.teacher.link.Link`, a ``typing.Protocol``): bind the
update to one student version and the teacher now live (``begin_update``), send each
episode with the positions it trains on (``submit``), collect the targets for that
version (``collect``), and the link's counters. A run picks its link once, when it
connects (``connect.py``), never per update:

- ``link.py``: the contract and what the links share (``Scored``: an episode, its
  positions and the accepted reply; ``TeacherSide``: what a run knows about its
  teacher; ``RouteSide``: one route's), and the plain link (``TeacherLink``: the
  episode's own tokens) with the privileged one (``PrivilegedLink``: the privileged
  teacher's view of them, ``teacher.mode: privileged_context``);
- ``xvocab.py``: the link of a teacher with another tokenizer (``XvocabLink``: the
  episode's rendered messages, the reply re-aligned to the student's positions), with
  ``cross_vocab.py`` (the vocabulary map, byte groups and their formulas);
- ``routed.py``: several teachers (``RoutedLink``: each route with one of the links
  above, docs/several-teachers.md);
- ``connect.py``: connect, qualify, retarget and the memory strategy; picks the link.

This package computes no loss and samples nothing. Nothing is imported here, so each
module can be imported alone (the objectives import ``link.Scored`` without the
connect).
"""

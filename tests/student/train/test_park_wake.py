"""The student's side of park and wake (docs/gpu.md, "Park and wake"): before ``WAKE`` the
student hands its cached free blocks back to the device, so the teacher's weights find
room in exactly the small-GPU case ``teacher.memory: swap`` exists for."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from miniverl.student.train.teacher import connect as link


def _state(device: str, order: list[str]):
    client = SimpleNamespace(wake=lambda: order.append("wake"),
                             park=lambda: order.append("park"))
    return SimpleNamespace(policy=SimpleNamespace(device=torch.device(device)),
                           teacher=SimpleNamespace(client=client))


def test_student_empties_its_cuda_cache_before_wake(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: order.append("empty_cache"))
    link.wake(_state("cuda", order))
    assert order == ["empty_cache", "wake"]
    order.clear()
    link.park(_state("cuda", order))
    assert order == ["park"]


def test_cpu_student_wakes_without_touching_cuda(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: order.append("empty_cache"))
    link.wake(_state("cpu", order))
    assert order == ["wake"]

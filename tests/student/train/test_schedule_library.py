"""Why the learning-rate schedule is the project's own (``updates.Schedule``), not
``transformers.get_scheduler`` phases chained by ``torch.optim.lr_scheduler.SequentialLR``
(docs/training.md, "The learning-rate schedule").

Each test measures one thing the schedule does that the libraries' schedulers do not;
if a release gives it, its test fails and the choice is worth making again.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from miniverl.student.train.updates import lr_factor  # noqa: E402


def _optimizer(lr: float = 1.0) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_the_first_warmup_step_trains_where_transformers_warmup_gives_it_no_rate():
    # Ours: step s of a W-step warm-up runs at (s + 1) / W of the peak, so the first
    # optimizer step moves the weights; transformers' warm-up starts at 0.
    hf = transformers.get_scheduler("linear", _optimizer(), num_warmup_steps=4,
                                    num_training_steps=10)
    assert hf.get_last_lr() == [0.0]
    assert lr_factor(0, warmup=4, total=10, schedule="linear") == 0.25


def test_torch_phase_schedulers_cannot_start_a_phase_above_the_optimizers_rate():
    # train.sft_warmup_lr is usually above train.lr (docs/training.md): a phase at its own
    # peak needs a factor above 1 of the optimizer's rate, which torch's phase schedulers
    # refuse (and CosineAnnealingLR always decays from the optimizer's own rate).
    with pytest.raises(ValueError):
        torch.optim.lr_scheduler.LinearLR(_optimizer(), start_factor=2.0, end_factor=1.0)
    with pytest.raises(ValueError):
        torch.optim.lr_scheduler.ConstantLR(_optimizer(), factor=2.0)



def test_sequential_phases_switch_at_the_steps_they_were_built_with():
    # train.sft_warmup_until_loss ends the SFT warm-up at a step known only when it
    # happens; SequentialLR switches phase at the milestones it was given when built.
    opt = _optimizer()
    phases = [torch.optim.lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=10**6),
              torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0)]
    sequential = torch.optim.lr_scheduler.SequentialLR(opt, phases, milestones=[5])
    rates = []
    for _ in range(7):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sequential.step()
    assert rates == [0.5] * 5 + [1.0] * 2

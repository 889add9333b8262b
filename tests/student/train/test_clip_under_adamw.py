"""What the gradient clip does to the student's updates under AdamW (docs/distillbench.md,
"The shared collapse at lr 1e-3").

``finish_step`` clips the gradient to ``train.max_grad_norm`` and steps AdamW. AdamW's step
divides the running mean of the gradients by the root of their running mean square, so a
clip that binds on every update (every gradient rescaled to the same norm) gives nearly
the same steps whatever its value (within 1% here: AdamW's eps is all that tells them
apart): the step size is set by the rate, not by the clip. What the
clip changes is each update's weight against the others (each counts as if its norm
were the clip), which a clip that never binds leaves alone.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from miniverl.student.train.updates import finish_step


def _steps(clip: float, scales: list[float]) -> list[torch.Tensor]:
    """AdamW (lr 1e-3, the torch defaults otherwise) from one start, one finish_step per
    gradient: gradient t is a fixed random direction of norm ``scales[t]``."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(64, 64) * 0.02)
    optimizer = torch.optim.AdamW([weight], lr=1e-3, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    policy = SimpleNamespace(quantization="none", model=None, grad_scaler=None)
    gen = torch.Generator().manual_seed(1)
    seen = []
    for scale in scales:
        direction = torch.randn(64, 64, generator=gen)
        weight.grad = direction / direction.norm() * scale
        finish_step(policy, optimizer, scheduler, clip)
        seen.append(weight.detach().clone())
    return seen


def _relative(a: torch.Tensor, b: torch.Tensor, start: torch.Tensor) -> float:
    return float((a - b).norm() / (a - start).norm())


def test_a_clip_that_always_binds_leaves_adamws_steps_nearly_unchanged_by_its_value():
    scales = [0.3, 1.1, 0.5, 2.0, 0.9, 0.4, 1.5, 0.7]  # version 4's OPD norms: 0.3-1.1
    tight, loose = _steps(0.05, scales), _steps(0.2, scales)  # both bind on every update
    free = _steps(1e6, scales)  # never binds: each update keeps its own weight
    torch.manual_seed(0)
    start = torch.randn(64, 64) * 0.02
    for t, (a, b, c) in enumerate(zip(tight, loose, free, strict=True)):
        # Within 1% of the distance travelled (AdamW's eps, 1e-8, on the few coordinates
        # whose gradient is near it, is all that differs) ...
        assert _relative(a, b, start) < 0.01
        # ... while the unclipped run is 15% or more away from the second update on.
        if t > 0:
            assert _relative(a, c, start) > 0.15
    # The first step moves the weights by the rate, 1e-3, per coordinate at most,
    # whatever the clip: the step size is the rate's.
    for run in (tight, loose, free):
        assert abs(float((run[0] - start).abs().max()) - 1e-3) < 1e-6

"""The fused label-smoothed loss against F.cross_entropy, the plain eager path it replaces."""

import pytest
import torch
import torch.nn.functional as F

from nmt.models.loss import label_smoothed_nll

PAD = 0


def reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    return F.cross_entropy(logits.float(), target, ignore_index=PAD, label_smoothing=eps, reduction="sum")


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [None, 50, 1000])  # CPU default, 13 chunks (last ragged), one (GPU)
def test_fused_loss_and_gradient_match_cross_entropy(eps, dtype, chunk):
    torch.manual_seed(0)
    n, v = 603, 2000  # the CPU default chunk is 262 rows of 2,000: 3 chunks
    target = torch.randint(1, v, (n,))
    target[::7] = PAD  # padding rows contribute nothing
    logits = (3 * torch.randn(n, v)).to(dtype)
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    fused = label_smoothed_nll(a, target, eps, PAD, chunk)
    ref = reference(b, target, eps)
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-3)
    (fused * 0.37).backward()  # a non-unit upstream gradient, as the trainer's token scaling gives
    (ref * 0.37).backward()
    assert a.grad.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-4}
    torch.testing.assert_close(a.grad, b.grad, **tol)
    assert a.grad[::7].abs().sum() == 0
    torch.testing.assert_close(a.detach(), logits)  # the logits themselves are left untouched


def test_no_grad_path_matches():
    torch.manual_seed(1)
    logits, target = torch.randn(50, 300), torch.randint(0, 300, (50,))
    with torch.no_grad():
        torch.testing.assert_close(label_smoothed_nll(logits, target, 0.1, PAD), reference(logits, target, 0.1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_loss_stays_finite_and_exact_where_the_target_has_no_probability_left(dtype):
    """A confidently wrong row (the target's logit 200 below the top one: its softmax probability underflows
    to 0) still has the exact loss and gradient: the log-sum-exp comes from the largest probability, not
    the target's."""
    logits = torch.zeros(4, 300)
    logits[:, 5] = 100.0
    logits[:, 7] = -100.0
    target = torch.tensor([7, 5, 9, PAD])
    a = logits.to(dtype).requires_grad_()
    b = logits.to(dtype).requires_grad_()
    fused = label_smoothed_nll(a, target, 0.1, PAD)
    ref = reference(b, target, 0.1)
    assert torch.isfinite(fused)
    torch.testing.assert_close(fused, ref, rtol=1e-6, atol=1e-4)
    fused.backward()
    ref.backward()
    torch.testing.assert_close(a.grad.float(), b.grad.float(), rtol=1e-5, atol=1e-6)

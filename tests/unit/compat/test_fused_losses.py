"""funasr_recipe/compat/fused_losses.py against funasr's own CTC, label-smoothing and accuracy code."""

from __future__ import annotations

import pytest
import torch

from funasr_recipe.compat import fused_losses

fused_losses.apply()
from funasr.losses.label_smoothing_loss import LabelSmoothingLoss  # noqa: E402
from funasr.metrics import compute_acc  # noqa: E402
from funasr.models.ctc.ctc import CTC  # noqa: E402

ORIGINAL_CTC = CTC.forward.__wrapped_original__
ORIGINAL_LS = LabelSmoothingLoss.forward.__wrapped_original__
ORIGINAL_ACC = fused_losses.th_accuracy.__wrapped_original__


def _ctc_batch(vocab: int = 3000, dim: int = 16, impossible: bool = True):
    torch.manual_seed(0)
    hs = torch.randn(5, 12, dim)
    hlens = torch.tensor([12, 10, 7, 12, 3])
    ys = torch.randint(1, 60, (5, 4))
    ys[1, 1] = ys[1, 0]  # a repeated label needs a blank between: one more frame
    ylens = torch.tensor([4, 3, 2, 4, 4 if impossible else 2])  # 4 distinct labels cannot fit 3 frames
    return CTC(odim=vocab, encoder_output_size=dim), hs, hlens, ys, ylens


def _loss_and_grads(forward, ctc, hs, *rest, autocast: bool = False):
    hs = hs.clone().requires_grad_()
    ctc.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = forward(ctc, hs, *rest)
    loss.sum().backward()
    return loss.detach().float(), hs.grad, ctc.ctc_lo.weight.grad.clone(), ctc.ctc_lo.bias.grad.clone()


@pytest.mark.parametrize("reduce", [True, False])
def test_ctc_matches_funasr_with_an_impossible_utterance_left_out(reduce, caplog):
    ctc, *batch = _ctc_batch()
    ctc.reduce = reduce
    ref = _loss_and_grads(ORIGINAL_CTC, ctc, *batch)
    new = _loss_and_grads(CTC.forward, ctc, *batch)
    assert torch.isfinite(ref[0]).all() and ref[0].shape == new[0].shape
    for a, b in zip(ref, new, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert "1/5 samples got nan grad" in caplog.text


def test_ctc_without_ignore_nan_grad_keeps_funasr_inf_loss():
    ctc, *batch = _ctc_batch()
    ctc.ignore_nan_grad = False
    assert torch.isinf(_loss_and_grads(CTC.forward, ctc, *batch)[0]).all()
    ctc, *batch = _ctc_batch(impossible=False)
    ctc.ignore_nan_grad = False
    ref, new = _loss_and_grads(ORIGINAL_CTC, ctc, *batch), _loss_and_grads(CTC.forward, ctc, *batch)
    for a, b in zip(ref, new, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_ctc_under_bf16_autocast_with_bf16_weights_as_deepspeed_runs_it():
    """bf16 rounds differently in each: against the fp32 result, no further off than funasr's bf16 step."""
    ctc, *batch = _ctc_batch(vocab=25055, impossible=False)
    exact = _loss_and_grads(ORIGINAL_CTC, ctc, *batch)
    ctc = ctc.to(torch.bfloat16)
    ref = _loss_and_grads(ORIGINAL_CTC, ctc, *batch, autocast=True)
    new = _loss_and_grads(CTC.forward, ctc, *batch, autocast=True)

    def error(x: torch.Tensor, truth: torch.Tensor) -> float:
        return float((x.float() - truth).norm() / truth.norm())

    for truth, a, b in zip(exact, ref, new, strict=True):
        assert b.dtype == a.dtype
        assert error(b, truth) <= 1.5 * error(a, truth) + 1e-3, (error(b, truth), error(a, truth))


@pytest.mark.parametrize("smoothing,normalize", [(0.1, True), (0.1, False), (0.0, True)])
def test_label_smoothing_matches_funasr(smoothing, normalize):
    torch.manual_seed(1)
    crit = LabelSmoothingLoss(size=500, padding_idx=-1, smoothing=smoothing, normalize_length=normalize)
    x = torch.randn(3, 6, 500, requires_grad=True)
    target = torch.randint(0, 500, (3, 6))
    target[0, 4:] = -1
    ref = ORIGINAL_LS(crit, x, target)
    (g_ref,) = torch.autograd.grad(ref, x)
    new = crit(x, target)
    (g_new,) = torch.autograd.grad(new, x)
    torch.testing.assert_close(new, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_new, g_ref, rtol=1e-4, atol=1e-8)
    assert g_new[0, 4:].abs().max() == 0  # padding rows


def test_accuracy_takes_the_first_maximum_as_argmax_does():
    out = torch.zeros(2, 3, 5, dtype=torch.bfloat16)  # every row a five-way tie: argmax says class 0
    target = torch.tensor([[0, 1, -1], [0, 0, 3]])
    assert fused_losses.th_accuracy(out.view(-1, 5), target, -1) == ORIGINAL_ACC(out.view(-1, 5), target, -1)
    out = torch.randn(4, 7, 50)
    target = torch.randint(0, 50, (4, 7))
    target[out.argmax(2) == target] = -1
    target[0, 0] = int(out[0, 0].argmax())
    rows = out.view(-1, 50)
    assert fused_losses.th_accuracy(rows, target, -1) == ORIGINAL_ACC(rows, target, -1)
    assert compute_acc.th_accuracy is fused_losses.th_accuracy


def test_sensevoice_step_is_unchanged():
    """The unmodified SenseVoiceSmall class: loss, stats and every gradient, patched vs funasr's code."""
    from funasr.models.sense_voice.model import SenseVoiceSmall

    torch.manual_seed(2)
    model = SenseVoiceSmall(encoder="SenseVoiceEncoderSmall", input_size=560, vocab_size=25055,
                            encoder_conf={"output_size": 32, "attention_heads": 2, "linear_units": 64,
                                          "num_blocks": 1, "tp_blocks": 1, "dropout_rate": 0.0,
                                          "positional_dropout_rate": 0.0, "attention_dropout_rate": 0.0,
                                          "kernel_size": 11, "sanm_shfit": 0},
                            lsm_weight=0.1, length_normalized_loss=True).train()
    speech, lens = torch.randn(3, 9, 560), torch.tensor([9, 7, 5])
    lid, emo, event, itn = 24884, 25004, 25016, 25016 - 2  # language, emotion, event, text-norm ids
    text = torch.tensor([[lid, emo, event, itn, 5, 6, 7], [lid, emo, event, itn, 8, 9, -1],
                         [lid, emo, event, itn, 10, -1, -1]])
    text[:, 3] = next(iter(model.textnorm_int_dict))
    tlens = torch.tensor([7, 6, 5])

    def run(patched: bool):
        torch.manual_seed(3)  # the class draws the language prompt at random
        CTC.forward = patched_ctc if patched else ORIGINAL_CTC
        LabelSmoothingLoss.forward = patched_ls if patched else ORIGINAL_LS
        model.zero_grad()
        loss, stats, _ = model(speech, lens.clone(), text, tlens)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return loss.detach(), stats, grads

    patched_ctc, patched_ls = CTC.forward, LabelSmoothingLoss.forward
    try:
        ref, new = run(False), run(True)
    finally:
        CTC.forward, LabelSmoothingLoss.forward = patched_ctc, patched_ls
    torch.testing.assert_close(new[0], ref[0], rtol=1e-5, atol=1e-5)
    assert new[1]["acc_rich"] == ref[1]["acc_rich"]
    assert new[2].keys() == ref[2].keys() and "ctc.ctc_lo.weight" in new[2]
    for name in ref[2]:
        torch.testing.assert_close(new[2][name], ref[2][name], rtol=1e-4, atol=1e-5)


def test_unusual_configurations_keep_funasr_code():
    """Without an output layer (the fast path would call None) funasr's own code runs, unchanged."""
    torch.manual_seed(4)
    ctc = CTC(odim=40, encoder_output_size=40, extra_linear=False)
    hs, hlens = torch.randn(2, 8, 40), torch.tensor([8, 6])
    ys, ylens = torch.randint(1, 40, (2, 3)), torch.tensor([3, 2])
    batch = (hs, hlens, ys, ylens)
    torch.testing.assert_close(CTC.forward(ctc, *batch), ORIGINAL_CTC(ctc, *batch))
    fused_losses.apply()  # idempotent: still one level of wrapping
    assert CTC.forward.__wrapped_original__ is ORIGINAL_CTC

"""funasr_recipe/train/lr_schedule.py: the curve's values, resume through state_dict (and torch.save with
weights_only), restarts on stalled validation, and registration in funasr's scheduler table.

  .venv/bin/python -m pytest tests/unit/train/test_lr_schedule.py -q
"""

from __future__ import annotations

import io
import logging
import math

import pytest
import torch
from omegaconf import OmegaConf

from funasr_recipe.train.lr_schedule import WarmupCosineLR, register

# Each test steps the optimizer before the scheduler, as the trainers do; a stray order warning from torch
# is not what these tests are about.
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")

PEAK, WARMUP, TOTAL = 1e-3, 100, 1100
FLOOR = 0.01 * PEAK


def build(lrs: tuple[float, ...] = (PEAK,), **conf) -> tuple[torch.optim.Optimizer, WarmupCosineLR]:
    """An optimizer with one param group per lr, and the scheduler on it built from ``conf``."""
    groups = [{"params": [torch.nn.Parameter(torch.ones(2))], "lr": lr} for lr in lrs]
    optim = torch.optim.AdamW(groups)
    return optim, WarmupCosineLR(optim, **{"warmup_steps": WARMUP, **conf})


def advance(optim: torch.optim.Optimizer, sched: WarmupCosineLR, until: int) -> dict[int, list[float]]:
    """Training steps up to step ``until``: {optimizer step (from 1): the lrs it used}, read from the
    optimizer itself."""
    seen = {}
    while sched.last_epoch < until:
        for group in optim.param_groups:
            group["params"][0].grad = torch.ones(2)
        seen[sched.last_epoch + 1] = [g["lr"] for g in optim.param_groups]
        optim.step()
        sched.step()
    return seen


def full_run(**conf) -> dict[int, float]:
    optim, sched = build(**conf)
    sched.set_total_steps(TOTAL)
    return {s: lrs[0] for s, lrs in advance(optim, sched, TOTAL + 50).items()}


def test_curve_values() -> None:
    lr = full_run()
    assert lr[50] == pytest.approx(5e-4, rel=1e-12)
    assert lr[100] == pytest.approx(PEAK, rel=1e-12)
    assert lr[600] == pytest.approx(FLOOR + (PEAK - FLOOR) / 2, rel=1e-12)
    assert lr[1100] == pytest.approx(FLOOR, rel=1e-12)
    assert all(lr[s] == pytest.approx(FLOOR, rel=1e-12) for s in range(1101, TOTAL + 51))
    assert lr[1] == pytest.approx(PEAK / WARMUP, rel=1e-12)
    assert all(lr[s] < lr[s + 1] for s in range(1, WARMUP))  # warmup climbs
    after = [lr[s] for s in range(WARMUP, TOTAL + 51)]
    assert all(a >= b for a, b in zip(after, after[1:], strict=False))
    assert after[0] > after[-1]  # and it does decay


def test_param_groups_scale_by_their_own_base_lr() -> None:
    lrs = (PEAK, 2e-4, 5e-5)
    optim, sched = build(lrs)
    sched.set_total_steps(TOTAL)
    seen = advance(optim, sched, TOTAL)
    for step, factor in ((50, 0.5), (100, 1.0), (600, 0.505), (1100, 0.01)):
        assert seen[step] == pytest.approx([base * factor for base in lrs], rel=1e-12), step
    assert sched.get_last_lr() == [g["lr"] for g in optim.param_groups]


def resume(optim_state: dict, sched_state: dict, **conf) -> tuple[torch.optim.Optimizer, WarmupCosineLR]:
    """As funasr/DeepSpeed resume: built from the config (total unknown), then the states loaded, then the
    trainer hook's set_total_steps again."""
    optim, sched = build(**conf)
    optim.load_state_dict(optim_state)
    sched.load_state_dict(sched_state)
    sched.set_total_steps(TOTAL)
    return optim, sched


def test_resume_continues_the_same_curve(caplog: pytest.LogCaptureFixture) -> None:
    expected = full_run()
    optim, sched = build()
    sched.set_total_steps(TOTAL)
    before = {s: lrs[0] for s, lrs in advance(optim, sched, 300).items()}
    with caplog.at_level(logging.INFO, logger="funasr_recipe.train.lr_schedule"):
        optim2, sched2 = resume(optim.state_dict(), sched.state_dict())
    assert not caplog.records  # the same total again is no change, and says nothing
    assert optim2.param_groups[0]["lr"] == expected[301]  # set_total_steps again changed nothing
    after = {s: lrs[0] for s, lrs in advance(optim2, sched2, TOTAL + 50).items()}
    assert {**before, **after} == expected  # exactly, not approximately


def test_resume_through_torch_save_weights_only() -> None:
    expected = full_run()
    optim, sched = build()
    sched.set_total_steps(TOTAL)
    advance(optim, sched, 300)
    buf = io.BytesIO()
    torch.save({"optimizer": optim.state_dict(), "scheduler": sched.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)  # plain types only, or this raises
    assert ckpt["scheduler"]["total_steps"] == TOTAL
    assert {"cycle_start", "best_loss", "bad_validations"} <= ckpt["scheduler"].keys()
    optim2, sched2 = resume(ckpt["optimizer"], ckpt["scheduler"])
    after = {s: lrs[0] for s, lrs in advance(optim2, sched2, TOTAL + 50).items()}
    assert after == {s: v for s, v in expected.items() if s > 300}


def run_with_restart(caplog: pytest.LogCaptureFixture) -> tuple[torch.optim.Optimizer, WarmupCosineLR]:
    """Validations [5, 4, 4.5, 4.2] at steps 200..500, patience 2: the 4th restarts at step 500."""
    optim, sched = build(restart_patience=2)
    sched.set_total_steps(TOTAL)
    answers = []
    with caplog.at_level(logging.INFO, logger="funasr_recipe.train.lr_schedule"):
        for step, loss in zip((200, 300, 400, 500), (5, 4, 4.5, 4.2), strict=True):
            advance(optim, sched, step)
            answers.append(sched.observe_validation(loss))
    assert answers == [False, False, False, True]
    return optim, sched


def test_restart_goes_back_to_peak_and_decays_again(caplog: pytest.LogCaptureFixture) -> None:
    optim, sched = run_with_restart(caplog)
    # The next optimizer step already runs at the peak, before any further scheduler.step().
    assert optim.param_groups[0]["lr"] == pytest.approx(PEAK, rel=1e-12)
    assert sched.get_last_lr() == pytest.approx([PEAK], rel=1e-12)
    said = [r.getMessage() for r in caplog.records if "restart" in r.getMessage()]
    assert len(said) == 1 and "step 500" in said[0] and "2 epochs without improvement" in said[0], said
    lr = {s: lrs[0] for s, lrs in advance(optim, sched, TOTAL + 20).items()}
    assert lr[501] == pytest.approx(PEAK, rel=1e-12)  # the step after the restart: no second warmup
    assert PEAK > lr[502] > 0.99 * PEAK  # and from there it decays
    cosine = FLOOR + (PEAK - FLOOR) * 0.5 * (1 + math.cos(math.pi * (800 - 501) / (TOTAL - 501)))
    assert lr[800] == pytest.approx(cosine, rel=1e-12)
    assert lr[TOTAL] == pytest.approx(FLOOR, rel=1e-12)
    assert lr[TOTAL + 20] == pytest.approx(FLOOR, rel=1e-12)
    seq = [lr[s] for s in range(501, TOTAL + 21)]
    assert all(a >= b for a, b in zip(seq, seq[1:], strict=False))


def test_patience_resets_after_a_restart(caplog: pytest.LogCaptureFixture) -> None:
    optim, sched = run_with_restart(caplog)
    advance(optim, sched, 600)
    assert sched.observe_validation(4.3) is False  # one bad validation since the restart, not three
    advance(optim, sched, 700)
    assert sched.observe_validation(4.4) is True  # the second one restarts again
    assert optim.param_groups[0]["lr"] == pytest.approx(PEAK, rel=1e-12)


def test_resumed_copy_keeps_the_restart(caplog: pytest.LogCaptureFixture) -> None:
    optim, sched = run_with_restart(caplog)
    buf = io.BytesIO()
    torch.save({"optimizer": optim.state_dict(), "scheduler": sched.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    optim2, sched2 = resume(ckpt["optimizer"], ckpt["scheduler"], restart_patience=2)
    assert optim2.param_groups[0]["lr"] == pytest.approx(PEAK, rel=1e-12)
    assert (sched2.cycle_start, sched2.best_loss, sched2.bad_validations) == (501, 4.0, 0)
    expected = advance(optim, sched, 800)
    assert advance(optim2, sched2, 800) == expected
    # The tracked best survives too: one worse loss is not yet a restart, the second is.
    assert sched2.observe_validation(4.1) is False
    assert sched2.observe_validation(4.05) is True


def test_an_improvement_resets_the_count() -> None:
    optim, sched = build(restart_patience=2)
    sched.set_total_steps(TOTAL)
    answers = []
    for step, loss in zip((200, 300, 400, 500), (5, 6, 4, 4.5), strict=True):
        advance(optim, sched, step)
        answers.append(sched.observe_validation(loss))
    assert answers == [False] * 4  # 6 was bad, 4 a new best, so 4.5 is only one bad in a row
    assert (sched.best_loss, sched.bad_validations, sched.cycle_start) == (4.0, 1, WARMUP)


def test_restart_off_by_default() -> None:
    optim, sched = build()
    sched.set_total_steps(TOTAL)
    advance(optim, sched, 300)
    assert [sched.observe_validation(x) for x in (5, 6, 7, 8, 9)] == [False] * 5
    assert sched.cycle_start == WARMUP


def test_unknown_total_holds_the_peak() -> None:
    optim, sched = build()
    lr = {s: lrs[0] for s, lrs in advance(optim, sched, 400).items()}
    assert lr[50] == pytest.approx(5e-4, rel=1e-12)
    assert all(lr[s] == pytest.approx(PEAK, rel=1e-12) for s in range(WARMUP, 401))
    sched.set_total_steps(TOTAL)  # known from here: the cosine applies at once, at the current step
    expected = FLOOR + (PEAK - FLOOR) * 0.5 * (1 + math.cos(math.pi * 301 / 1000))  # step 401's
    assert optim.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("total", [WARMUP, WARMUP - 1])
def test_warmup_not_below_total_is_refused_in_the_config_and_shortened_for_a_short_run(
        total: int, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match=rf"warmup_steps \({WARMUP}\).*total_steps \({total}\)"):
        build(total_steps=total)
    optim, sched = build()
    with caplog.at_level(logging.WARNING, logger="funasr_recipe.train.lr_schedule"):
        sched.set_total_steps(total)  # as the hook does for a one-epoch fine-tune
    assert sched.total_steps == total and sched.warmup_steps == total // 10
    assert "warming up for" in caplog.text
    lr = {s: lrs[0] for s, lrs in advance(optim, sched, total).items()}
    assert lr[total // 10] == pytest.approx(PEAK, rel=1e-12) and lr[total] == pytest.approx(FLOOR, rel=1e-12)


def test_registered_in_funasr_and_built_from_conf() -> None:
    register()
    register()  # twice is fine
    from funasr.schedulers import scheduler_classes

    assert scheduler_classes["warmup_cosine"] is WarmupCosineLR
    optim = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=PEAK)
    # As Trainer.warp_optim_scheduler does: scheduler_class(optim, **scheduler_conf), conf from the yaml.
    conf = OmegaConf.create({"warmup_steps": WARMUP, "final_lr_ratio": 0.01, "restart_patience": 0})
    sched = scheduler_classes["warmup_cosine"](optim, **conf)
    assert isinstance(sched, WarmupCosineLR)
    sched.set_total_steps(TOTAL)
    assert advance(optim, sched, 600)[600] == pytest.approx([FLOOR + (PEAK - FLOOR) / 2], rel=1e-12)


@pytest.mark.parametrize("total", [40, 1100, pytest.param(50000, marks=pytest.mark.slow)])  # 50000: 8 s
def test_warmup_ratio_scales_the_warmup_to_the_run(total: int) -> None:
    optim, sched = build(warmup_steps=1000, warmup_ratio=0.1)  # the config's fixed warmup is replaced
    sched.set_total_steps(total)
    assert sched.warmup_steps == round(0.1 * total)
    lr = {s: lrs[0] for s, lrs in advance(optim, sched, total).items()}
    assert lr[round(0.1 * total)] == pytest.approx(PEAK, rel=1e-12)
    assert lr[total] == pytest.approx(FLOOR, rel=1e-12)
    # Resumed: the state carries the scaled warmup, and the same total changes nothing.
    optim2, resumed = build(warmup_steps=1000, warmup_ratio=0.1)
    resumed.load_state_dict(sched.state_dict())
    resumed.set_total_steps(total)
    assert resumed.warmup_steps == sched.warmup_steps


def test_warmup_ratio_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="warmup_ratio must be in"):
        build(warmup_ratio=1.0)

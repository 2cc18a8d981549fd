"""local/average.py on state-dict checkpoints (the ddp engine's format), built here with known weights,
and its loaders' (and local/make_model_dir.py's) refusal of a pickle that would run code.

DeepSpeed checkpoints (fp32 masters vs bf16 module copies) are tested on a real training run in
tests/e2e/test_stages_e2e.py, and read weights-only in tests/faults/test_checkpoint_io.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from funasr_recipe.model.averaging import average, select_best, validation_losses
from funasr_recipe.model.checkpoint import CorruptCheckpointError, UnsafeCheckpointError, fp32_state_dict
from local.average import main
from local.make_model_dir import main as make_model_dir_main

Weights = dict[str, dict[str, torch.Tensor]]


def write_run(exp: Path, losses: dict[str, float], kept_by: str = "loss") -> Weights:
    """An exp dir as funasr's trainer leaves it with the ddp engine; returns each checkpoint's weights."""
    exp.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    weights = {}
    for name in losses:
        state = {"w": torch.randn(3, 4, generator=gen), "b": torch.randn(4, generator=gen),
                 "bn.num_batches_tracked": torch.tensor(len(weights) + 7)}
        torch.save({"state_dict": state, "epoch": len(weights) + 1}, exp / name)
        weights[name] = state
    torch.save({"state_dict": weights[name], "saved_ckpts": losses, "avg_keep_nbest_models_type": kept_by},
               exp / "model.pt")
    config = {"model": "Toy", "train_conf": {"avg_nbest_model": 2}}
    OmegaConf.save(OmegaConf.create(config), exp / "config.yaml")
    return weights


def test_the_lowest_losses_are_averaged_element_wise(tmp_path: Path) -> None:
    losses = {"model.pt.ep1": 9.0, "model.pt.ep2": 3.0, "model.pt.ep3": 5.0, "model.pt.ep4": 4.0}
    weights = write_run(tmp_path, losses)
    out, names, _ = average(tmp_path, 3)
    assert out.name == "model.pt.avg3" and names == ["model.pt.ep2", "model.pt.ep4", "model.pt.ep3"]
    assert main(["--exp-dir", str(tmp_path), "--num", "3"]) == 0  # the program: the same average, final/
    got = torch.load(out)
    picked = ["model.pt.ep2", "model.pt.ep4", "model.pt.ep3"]
    for key in ("w", "b"):
        expected = sum(weights[n][key].double() for n in picked) / 3
        assert torch.allclose(got[key].double(), expected, atol=1e-7), key
        assert got[key].dtype == torch.float32
        # Not the mean of all four: the worst epoch is left out.
        assert not torch.allclose(got[key].double(), sum(w[key].double() for w in weights.values()) / 4)
    assert got["bn.num_batches_tracked"] == weights["model.pt.ep2"]["bn.num_batches_tracked"]  # the best's
    card = json.loads((tmp_path / "final" / "configuration.json").read_text())
    assert card["recipe"]["averaged"] == {n: losses[n] for n in picked}
    assert torch.equal(torch.load(tmp_path / "final" / "model.pt")["w"], got["w"])


def test_selection_skips_deleted_checkpoints_and_asks_for_loss(tmp_path: Path) -> None:
    losses = {"model.pt.ep1": 1.0, "model.pt.ep2": 2.0, "model.pt.ep3": 3.0}
    write_run(tmp_path, losses)
    (tmp_path / "model.pt.ep1").unlink()  # funasr's keep_nbest_models removed it
    assert select_best(validation_losses(tmp_path), 2, tmp_path) == ["model.pt.ep2", "model.pt.ep3"]
    write_run(tmp_path / "acc", {"model.pt.ep1": 0.9}, kept_by="acc")
    with pytest.raises(ValueError, match="avg_keep_nbest_models_type=loss"):
        validation_losses(tmp_path / "acc")


def test_cli_reads_the_count_from_the_config_and_fails_clearly_without_a_run(tmp_path: Path) -> None:
    write_run(tmp_path / "run", {"model.pt.ep1": 2.0, "model.pt.ep2": 1.0, "model.pt.ep3": 3.0})
    assert main(["--exp-dir", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "model.pt.avg2").is_file()
    assert (tmp_path / "run" / "final" / "model.pt").is_file()
    (tmp_path / "empty").mkdir()
    OmegaConf.save(OmegaConf.create({"train_conf": {}}), tmp_path / "empty" / "config.yaml")
    assert main(["--exp-dir", str(tmp_path / "empty")]) == 2


class Payload:
    """A pickle that runs a command when it is loaded, as a planted checkpoint could."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("where", ["file", "deepspeed"])
def test_a_checkpoint_that_would_run_code_is_refused(tmp_path: Path, where: str) -> None:
    """Stage 3's loaders (and make_model_dir's) are weights-only, DeepSpeed's zero_to_fp32 included:
    the payload is refused, never run."""
    marker = tmp_path / "ran"
    exp = tmp_path / "exp"
    write_run(exp, {"model.pt.ep1": 1.0, "model.pt.ep2": 2.0})
    bad = {"state_dict": {"w": torch.zeros(2)}, "extra": Payload(marker)}
    if where == "file":
        torch.save(bad, exp / "model.pt.ep1")
    else:
        (exp / "model.pt.ep1").unlink()
        (exp / "model.pt.ep1").mkdir()
        for name in ("mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"):
            torch.save(bad, exp / "model.pt.ep1" / name)
    with pytest.raises(UnsafeCheckpointError, match=r"model.pt.ep1.* refused to load .*posix.system"):
        fp32_state_dict(exp, "model.pt.ep1")
    assert main(["--exp-dir", str(exp), "--num", "2"]) == 2
    assert make_model_dir_main(["--exp-dir", str(exp), "--checkpoint", "model.pt.ep1"]) == 2
    torch.save({"saved_ckpts": {"model.pt.ep2": 2.0}, "extra": Payload(marker)}, exp / "model.pt")
    with pytest.raises(UnsafeCheckpointError, match="model.pt: refused"):
        validation_losses(exp)
    assert not marker.exists(), "the payload ran"


@pytest.mark.parametrize("keep", [0, 100])
@pytest.mark.parametrize("where", ["file", "deepspeed"])
def test_a_truncated_checkpoint_is_named(tmp_path: Path, where: str, keep: int) -> None:
    """A checkpoint cut short (a full disk, a copy killed half way) is bad input naming the file: torch's
    own message ("PytorchStreamReader failed reading zip archive") names none."""
    exp = tmp_path / "exp"
    write_run(exp, {"model.pt.ep1": 1.0, "model.pt.ep2": 2.0})
    if where == "file":
        path = exp / "model.pt.ep1"
    else:
        (exp / "model.pt.ep1").unlink()
        (exp / "model.pt.ep1").mkdir()
        path = exp / "model.pt.ep1" / "mp_rank_00_model_states.pt"
        torch.save({"module": {"w": torch.zeros(2)}}, path)
    path.write_bytes(path.read_bytes()[:keep])  # empty, or cut short
    with pytest.raises(CorruptCheckpointError, match=rf"{path}: not a readable torch checkpoint"):
        fp32_state_dict(exp, "model.pt.ep1")
    assert main(["--exp-dir", str(exp), "--num", "2"]) == 2


def test_a_zero3_run_is_read_from_rank_0s_model_states(tmp_path: Path) -> None:
    """ZeRO-3 partitions the model states too: a tag dir holds no mp_rank_00_model_states.pt but one
    zero_pp_rank_<r>_mp_rank_00_model_states.pt per rank, each with funasr's record (stage 3 stopped at
    "no latest checkpoint" on such a run); checkpoint_io's check after a resume reads the same file."""
    from funasr_recipe.compat.checkpoint_io import recorded_best

    losses = {"model.pt.ep1": 2.0, "model.pt.ep2": 1.0}
    write_run(tmp_path, losses)
    (tmp_path / "model.pt").unlink()
    (tmp_path / "model.pt").mkdir()
    for rank in (0, 1):
        torch.save({"module": None, "saved_ckpts": losses, "best_step_or_epoch": "model.pt.ep2"},
                   tmp_path / "model.pt" / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
    assert validation_losses(tmp_path) == losses
    assert recorded_best(tmp_path / "model.pt") == "model.pt.ep2"
    for rank in (0, 1):
        (tmp_path / "model.pt" / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"model.pt: no mp_rank_00_model_states.pt or "
                                                r"zero_pp_rank_0_mp_rank_00_model_states.pt"):
        validation_losses(tmp_path)

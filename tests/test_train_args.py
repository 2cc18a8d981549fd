"""local/train.py: the Hydra command line it gives funasr for each recipe option (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from local.train import main

ROOT = Path(__file__).resolve().parents[1]


def hydra(capsys: pytest.CaptureFixture, *args: str) -> list[str]:
    main(["--config", str(ROOT / "conf" / "tiny_sensevoice.yaml"), "--exp-dir", "/x/exp",
          "--data-dir", "/x/data", "--dump-dir", "/x/dump", "--train-set", "train", "--valid-set", "dev",
          "--dry-run", "true", *args])
    return capsys.readouterr().out.split("\n")


def test_from_scratch_on_stage1_features(capsys: pytest.CaptureFixture) -> None:
    argv = hydra(capsys, "--", "++train_conf.max_epoch=3")
    assert "++dataset=FbankSenseVoiceCTCDataset" in argv
    assert "++train_data_set_list=/x/dump/train/data.jsonl" in argv
    assert "++frontend_conf.cmvn_file=/x/dump/train/am.lfr7x6.mvn" in argv
    bpe = "/x/dump/tokenizer/tiny_sensevoice/chn_jpn_yue_eng_ko_spectok.bpe.model"
    assert f"++tokenizer_conf.bpemodel={bpe}" in argv
    assert "++backend=gloo" in argv and "++device=cpu" in argv and "++dataset_conf.data_split_num=1" in argv
    assert "++train_conf.use_deepspeed=true" in argv
    assert argv.index("++train_conf.max_epoch=3") > argv.index("++dataset_conf.data_split_num=1")  # user last


def test_raw_audio_ddp_cuda(capsys: pytest.CaptureFixture) -> None:
    argv = hydra(capsys, "--feats-type", "raw", "--train-engine", "ddp", "--device", "cuda")
    assert not any(a.startswith("++dataset=") for a in argv)  # funasr's own dataset on the audio
    assert "++train_data_set_list=/x/data/train/data.jsonl" in argv
    assert "++train_conf.use_deepspeed=false" in argv and "++backend=nccl" in argv


def test_pretrained_model_needs_its_local_dir(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--pretrained-dir"):
        hydra(capsys, "--", "++pretrained_model=iic/SenseVoiceSmall")
    argv = hydra(capsys, "--pretrained-dir", str(tmp_path), "--", "++pretrained_model=iic/SenseVoiceSmall")
    assert f"++model={tmp_path}" in argv
    assert not any("cmvn_file" in a or "bpemodel" in a for a in argv)  # the model's own are kept

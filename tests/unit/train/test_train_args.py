"""local/train.py: the Hydra command line it gives funasr for each recipe option (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from local.train import main

ROOT = Path(__file__).resolve().parents[3]


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
    # stage 1's raw.jsonl: the audio entries with the targets normalised as for the features
    assert "++train_data_set_list=/x/dump/train/raw.jsonl" in argv
    assert "++valid_data_set_list=/x/dump/dev/raw.jsonl" in argv
    assert "++train_conf.use_deepspeed=false" in argv and "++backend=nccl" in argv


def test_pretrained_model_needs_its_local_dir(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--pretrained-dir"):
        hydra(capsys, "--", "++pretrained_model=iic/SenseVoiceSmall")
    argv = hydra(capsys, "--pretrained-dir", str(tmp_path), "--", "++pretrained_model=iic/SenseVoiceSmall")
    assert f"++model={tmp_path}" in argv
    assert not any("cmvn_file" in a or "bpemodel" in a for a in argv)  # the model's own are kept


def test_replay_trains_on_the_mixed_list_through_the_recipe_sampler(capsys: pytest.CaptureFixture) -> None:
    argv = hydra(capsys, "--replay-sets", "replay_a replay_b", "--replay-ratio", "0.5")
    assert "++train_data_set_list=/x/exp/train_replay.jsonl" in argv
    assert "++dataset_conf.replay_list=['/x/dump/replay_a/data.jsonl','/x/dump/replay_b/data.jsonl']" in argv
    assert "++dataset_conf.replay_ratio=0.5" in argv
    with pytest.raises(ValueError, match="LengthBucketBatchSampler"):  # funasr's sampler would ignore it
        hydra(capsys, "--replay-sets", "replay_a", "--", "++dataset_conf.batch_sampler=BatchSampler")
    with pytest.raises(ValueError, match="stage-1 features"):
        hydra(capsys, "--replay-sets", "replay_a", "--feats-type", "raw")


def test_freeze_goes_to_funasr_freeze_param(capsys: pytest.CaptureFixture) -> None:
    argv = hydra(capsys, "--freeze", "encoder,ctc")
    assert "++freeze_param='encoder,ctc'" in argv  # quoted: Hydra would read a,b as a sweep


def test_raw_training_refuses_ranges_of_recordings(tmp_path: Path) -> None:
    from funasr_recipe.core.rejections import BadInputError
    from funasr_recipe.model.trainer import refuse_ranges

    listing = tmp_path / "raw.jsonl"
    listing.write_text('{"key": "a", "source": "/w/a.wav"}\n{"key": "b", "source": "/w/long.wav#t=1.5,3"}\n')
    with pytest.raises(BadInputError, match=r"raw.jsonl:2: b: .*range of a recording"):
        refuse_ranges(listing)
    listing.write_text('{"key": "a", "source": "/w/a.wav"}\n')
    refuse_ranges(listing)  # whole files train as they are

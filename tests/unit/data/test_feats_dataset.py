"""Training input from stage-1 features: the same tensors as funasr's audio path, without the audio.

Both loaders are funasr's own ``DataloaderMapStyle`` (its index, batch sampler and collator); only
the dataset class differs, selected through funasr's registry as a config would select it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from funasr.datasets.dataloader_entry import DataloaderMapStyle
from funasr.models.sense_voice.model import SenseVoiceSmall

import funasr_recipe.data.feats_dataset  # noqa: F401  (registers the Fbank* datasets with funasr)
from funasr_recipe.model.sensevoice_tokenizer import SenseVoiceTagTokenizer
from tests.helpers.stage1_data import frontend, jsonl


def loaders(train: Path, valid: Path, dataset: str, dumped: Path) -> DataloaderMapStyle:
    # The class conf/tiny_sensevoice.yaml names: each tag one id, the text with its "▁".
    tok = SenseVoiceTagTokenizer(bpemodel=str(dumped / "tok" / "chn_jpn_yue_eng_ko_spectok.bpe.model"))
    conf = {"index_ds": "IndexDSJsonl", "batch_sampler": "BatchSampler", "batch_type": "token",
            "batch_size": 2000, "shuffle": False, "num_workers": 0, "data_split_num": 1}
    return DataloaderMapStyle(frontend=frontend(dumped / "train" / "am.mvn"), tokenizer=tok, dataset=dataset,
                              train_data_set_list=str(train), valid_data_set_list=str(valid),
                              dataset_conf=conf)


def originals(dumped: Path, tmp_path: Path) -> Path:
    """The unperturbed copies of dump/train, in the order of data/train/data.jsonl."""
    path = tmp_path / "sp1.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in jsonl(dumped / "train" / "data.jsonl")
                            if i["speed"] == 1.0))
    return path


def test_fbank_dataset_gives_what_funasr_computes_from_audio(corpus: Path, dumped: Path,
                                                             tmp_path: Path) -> None:
    raw = loaders(corpus / "data" / "train" / "data.jsonl", corpus / "data" / "dev" / "data.jsonl",
                  "SenseVoiceCTCDataset", dumped).dataset_tr
    ours = loaders(originals(dumped, tmp_path), dumped / "dev" / "data.jsonl", "FbankSenseVoiceCTCDataset",
                   dumped).dataset_tr
    assert type(ours).__name__ == "FbankSenseVoiceCTCDataset" and len(ours) == len(raw)
    for i in range(len(raw)):
        a, b = raw[i], ours[i]
        assert a["text"].tolist() == b["text"].tolist()
        assert int(a["speech_lengths"]) == int(b["speech_lengths"]) == b["speech"].shape[0]
        assert (a["speech"] - b["speech"]).abs().max() < 1e-3


def test_training_steps_run_with_the_audio_moved_away(corpus: Path, dumped: Path, tmp_path: Path) -> None:
    audio, away = corpus / "audio", tmp_path / "audio-away"
    shutil.move(audio, away)
    try:
        loader = loaders(dumped / "train" / "data.jsonl", dumped / "dev" / "data.jsonl",
                         "FbankSenseVoiceCTCDataset", dumped)
        train, _ = loader.build_iter(epoch=0)
        torch.manual_seed(0)
        model = SenseVoiceSmall(encoder="SenseVoiceEncoderSmall", input_size=560, vocab_size=25055,
                                encoder_conf={"output_size": 64, "attention_heads": 2, "linear_units": 128,
                                              "num_blocks": 2, "tp_blocks": 1, "kernel_size": 11,
                                              "sanm_shfit": 0})
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        seen = 0
        for batch in train:
            loss, _, _ = model(**batch)
            assert torch.isfinite(loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += batch["speech"].shape[0]
        assert seen == len(jsonl(dumped / "train" / "data.jsonl"))  # every utterance, none substituted
    finally:
        shutil.move(away, audio)


def test_unreadable_features_fail_naming_the_source(dumped: Path, tmp_path: Path) -> None:
    item = jsonl(dumped / "dev" / "data.jsonl")[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**item, "source": str(tmp_path / "gone.ark") + ":10"}) + "\n")
    ds = loaders(bad, bad, "FbankSenseVoiceCTCDataset", dumped).dataset_tr
    with pytest.raises(RuntimeError, match="gone.ark:10"):
        ds[0]


def test_the_divergence_guard_gets_each_batchs_sources(dumped: Path) -> None:
    """A bad step names its utterances: the recipe's batches carry their sources once the guard asks."""
    from funasr_recipe.compat.divergence import SOURCE, carry_sources, keys_of

    train_jsonl = dumped / "train" / "data.jsonl"
    loader = loaders(train_jsonl, dumped / "dev" / "data.jsonl", "FbankSenseVoiceCTCDataset", dumped)
    train, _ = loader.build_iter(epoch=0)
    assert carry_sources(train.dataset)
    items = jsonl(train_jsonl)
    seen = []
    for batch in train:
        assert len(batch[SOURCE]) == batch["speech"].shape[0]
        seen += keys_of(str(train_jsonl), batch[SOURCE])
    assert sorted(seen) == sorted(i["key"] for i in items)

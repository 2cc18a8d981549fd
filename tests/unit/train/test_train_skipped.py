"""train_skipped.tsv (funasr_recipe/train/skipped.py): its prediction against what funasr's own index,
batch samplers and SenseVoice dataset keep of real data.jsonl files with long and short lines, under the
configs' and other dataset_conf settings; the table, the warning and --strict."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from funasr.register import tables

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.model.trainer import TrainSetup, hydra_argv, register_recipe_classes, resolved_config
from funasr_recipe.train.skipped import HEADER, check, find_skips
from tests.helpers.run_sh import ROOT

# key: (source_len, target_len); None: the field is missing
LINES = {"short": (300, 5), "long_20s": (2400, 40), "at_limit": (1990, 10), "over_limit": (1991, 10),
         "zero_frames": (0, 3), "long_text": (100, 300), "over_2048": (2100, 10), "mid": (1200, 5),
         "no_lengths": (None, None), "no_target": (50, 0)}


def write_jsonl(path: Path, lines: dict, prefix: str) -> None:
    """Lines in stage 1's format (funasr reads only the numbers; the features are never loaded)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (key, (s, t)) in enumerate(lines.items()):
        row = {"key": f"{prefix}{key}", "source": f"{path.parent}/shards/00000.ark:{i * 100 + 9}",
               "source_len": s, "target": "ONE " * (t or 0), "target_len": t, "text_language": "<|en|>",
               "emo_target": "<|NEUTRAL|>", "event_target": "<|Speech|>", "with_or_wo_itn": "<|woitn|>"}
        rows.append({k: v for k, v in row.items() if v is not None})
    rows.append({"key": f"{prefix}no_source", "target": "ONE", "source_len": 10, "target_len": 1})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def setup(tmp_path: Path, feats_type: str = "fbank") -> TrainSetup:
    dump = tmp_path / "dump"
    write_jsonl(dump / "train" / "data.jsonl", LINES, "tr-")
    write_jsonl(dump / "dev" / "data.jsonl", LINES, "dv-")
    return TrainSetup(config=ROOT / "conf" / "tiny_sensevoice.yaml", exp_dir=tmp_path / "exp",
                      train_set="train",
                      valid_set="dev", data_dir=tmp_path / "data", dump_dir=dump, feats_type=feats_type,
                      train_engine="deepspeed", ds_config=ROOT / "ds_configs" / "ds_stage1_bf16.json",
                      device="cpu", pretrained_dir=None)


def funasr_keeps(cfg: dict) -> set[str]:
    """Keys funasr's own dataset (its index) and batch sampler put in epoch 0's batches, both sets, as
    train_ds's DataloaderMapStyle builds them."""
    register_recipe_classes()
    conf = cfg["dataset_conf"]
    kept = set()
    for key, training in (("train_data_set_list", True), ("valid_data_set_list", False)):
        rows = [json.loads(line) for line in Path(cfg[key]).read_text().splitlines()]
        by_source = {r["source"]: r["key"] for r in rows if "source" in r}
        dataset = tables.dataset_classes.get(cfg["dataset"])(cfg[key], frontend=None, tokenizer=None,
                                                            is_training=training, **conf)
        sampler_class = tables.batch_sampler_classes.get(conf.get("batch_sampler", "BatchSampler"))
        extra = {"start_step": 0} if training else {"is_training": False}
        sampler = sampler_class(dataset, **extra, **conf)["batch_sampler"]
        sampler.set_epoch(0)
        kept |= {by_source[dataset.index_ds[i]["source"]] for batch in sampler for i in batch}
    return kept


@pytest.mark.parametrize("overrides, dropped", [
    # the config: LengthBucketBatchSampler, max_token_length 2000, funasr's other defaults
    ([], {"long_20s", "over_limit", "over_2048"}),
    # max_token_length unset: the index allows 2200, funasr's token sampler 2048 (sort_size > 0: buffered)
    (["++dataset_conf.max_source_length=3000", "~dataset_conf.max_token_length",
      "++dataset_conf.batch_sampler=BatchSampler"], {"long_20s", "over_2048"}),
    (["++dataset_conf.max_source_length=3000", "~dataset_conf.max_token_length",
      "++dataset_conf.batch_sampler=BatchSampler", "++dataset_conf.sort_size=0"], {"long_20s", "over_2048"}),
    # example batches: the sampler divides source_len by length_scale_source
    (["++dataset_conf.batch_sampler=BatchSampler", "++dataset_conf.batch_type=example",
      "++dataset_conf.batch_size=4", "++dataset_conf.length_scale_source=0.5"],
     {"long_20s", "over_limit", "over_2048", "at_limit", "mid"}),
    # the released SenseVoice config's kind of limits
    (["++dataset_conf.min_source_length=10", "++dataset_conf.max_target_length=50",
      "++dataset_conf.min_target_length=1"],
     {"long_20s", "over_limit", "over_2048", "zero_frames", "long_text", "no_lengths", "no_target"}),
])
def test_the_prediction_is_what_funasr_keeps(tmp_path: Path, overrides: list[str], dropped: set[str]) -> None:
    cfg = resolved_config(hydra_argv(setup(tmp_path), overrides))
    skips, totals = find_skips(cfg)
    every = {f"{p}{k}" for p in ("tr-", "dv-") for k in [*LINES, "no_source"]}
    assert totals == {"train": len(LINES) + 1, "valid": len(LINES) + 1}
    predicted = {s.key for s in skips}
    assert predicted == every - funasr_keeps(cfg)
    assert predicted == {f"{p}{k}" for p in ("tr-", "dv-") for k in [*dropped, "no_source"]}


def test_the_table_the_warning_and_strict(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    args = hydra_argv(setup(tmp_path), [])
    monkeypatch.setenv("RANK", "1")
    check(args)
    assert not (tmp_path / "exp" / "train_skipped.tsv").exists()  # global rank 0 writes it
    monkeypatch.setenv("RANK", "0")
    with caplog.at_level(logging.INFO):
        check(args)
    table = (tmp_path / "exp" / "train_skipped.tsv").read_text(encoding="utf-8").splitlines()
    assert table[0] + "\n" == HEADER
    rows = {(s, k, r): d for s, k, r, d in (line.split("\t") for line in table[1:])}
    assert rows[("train", "tr-long_20s", "max_token_length")] == \
        "source_len 2400 + target_len 40 > max_token_length 2000"
    assert rows[("train", "tr-long_20s", "max_source_length")] == "source_len 2400 > max_source_length 2048"
    assert rows[("valid", "dv-over_limit", "max_token_length")] == \
        "source_len 1991 + target_len 10 > max_token_length 2000"
    assert ("valid", "dv-no_source", "no_source") in rows
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1
    assert "stage 2 leaves out 8 of 22 utterances (train 4 of 11, valid 4 of 11)" in warning[0]
    assert "6 by max_token_length (++dataset_conf.max_token_length=2440 admits them)" in warning[0]
    assert "4 by max_source_length (++dataset_conf.max_source_length=2400 admits them)" in warning[0]
    with pytest.raises(BadInputError, match=r"strict mode: 8 utterances .*see .*exp/train_skipped.tsv"):
        check(args, strict=True)
    # The options the warning names: then only the lines without a source are left out.
    check(hydra_argv(setup(tmp_path), ["++dataset_conf.max_source_length=2400",
                                       "++dataset_conf.max_token_length=2440"]))
    table = (tmp_path / "exp" / "train_skipped.tsv").read_text(encoding="utf-8").splitlines()
    assert [row.split("\t")[1] for row in table[1:]] == ["tr-no_source", "dv-no_source"]


class WordTokenizer:
    """One id per word: transcripts of a known token count for funasr's dataset and the prediction."""

    def encode(self, text: str, **kwargs: object) -> list[int]:
        return [len(w) for w in text.split()]


def test_raw_audio_frames_over_batch_size_as_funasr_sensevoice_skips_them(dumped: Path) -> None:
    """--feats-type raw: funasr's SenseVoiceCTCDataset returns no sample (retry=1: no random stand-in)
    for an utterance whose frontend output has more frames than batch_size, or whose transcript has over
    200 tokens; stage 0's data.jsonl of real recordings (8 kHz, 44.1 kHz stereo, silence)."""
    from funasr.frontends.wav_frontend import WavFrontend

    corpus = dumped.parent
    rows = [json.loads(line) for line in (corpus / "data" / "train" / "data.jsonl").read_text().splitlines()]
    rows += [json.loads(line) for line in (corpus / "data" / "dev" / "data.jsonl").read_text().splitlines()]
    shortest = min(range(len(rows)), key=lambda i: rows[i]["source_len"])
    rows[shortest] = {**rows[shortest], "key": "wordy", "target": " ".join(["ONE"] * 201), "target_len": 201}
    raw = corpus / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    frontend_conf = {"fs": 16000, "window": "hamming", "n_mels": 80, "frame_length": 25, "frame_shift": 10,
                     "lfr_m": 7, "lfr_n": 6, "dither": 0.0}
    lengths = sorted(r["source_len"] for r in rows)
    conf = {"index_ds": "IndexDSJsonl", "batch_sampler": "LengthBucketBatchSampler", "batch_type": "example",
            "batch_size": lengths[len(lengths) // 2] // 6, "retry": 1}
    cfg = {"dataset": "SenseVoiceCTCDataset", "dataset_conf": conf, "frontend_conf": frontend_conf,
           "train_data_set_list": str(raw), "valid_data_set_list": str(raw)}
    skips, _ = find_skips(cfg, tokenizer=WordTokenizer())
    predicted = {s.key for s in skips if s.set == "train"}
    dataset = tables.dataset_classes.get("SenseVoiceCTCDataset")(
        str(raw), frontend=WavFrontend(**frontend_conf), tokenizer=WordTokenizer(), is_training=True, **conf)
    actual = {r["key"] for i, r in enumerate(rows) if dataset[i] is None}
    assert predicted == actual
    assert "wordy" in actual and 0.25 < len(actual) / len(rows) < 0.75
    assert [s.reason for s in skips if s.key == "wordy"] == ["target_tokens"] * 2


def test_a_fine_tunes_limits_are_the_model_dirs_under_the_configs(tmp_path: Path) -> None:
    """As funasr's download_model merges them: the model dir's config.yaml under the run's config."""
    model = tmp_path / "hub_model"
    model.mkdir()
    (model / "config.yaml").write_text("model: SenseVoiceSmall\ndataset_conf:\n  min_source_length: 60\n"
                                       "  length_scale_source: 0.5\n")
    (model / "configuration.json").write_text(json.dumps({"file_path_metas": {"config": "config.yaml"}}))
    fine_tune = TrainSetup(**{**setup(tmp_path).__dict__, "config": ROOT / "conf" / "sensevoice_small.yaml",
                              "pretrained_dir": model})
    conf = resolved_config(hydra_argv(fine_tune, []))["dataset_conf"]
    assert conf["min_source_length"] == 1 and conf["length_scale_source"] == 0.5


def test_trainer_never_asks_pypi_for_a_version(tmp_path: Path) -> None:
    # funasr's train_ds passes its whole config to AutoModel, whose check_for_update calls PyPI unless
    # disable_update is set: offline nodes would wait on the connect at every training start.
    assert resolved_config(hydra_argv(setup(tmp_path), []))["disable_update"] is True

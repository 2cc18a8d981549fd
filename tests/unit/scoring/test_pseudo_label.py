"""Pseudo-labels (local/pseudo_label.py over model/inference.py and data/replay.py): scored decoding split
over two ranks, the merge into a Kaldi dir stage 0 accepts, what is left out and why.

The model tests use the session's trained tiny SenseVoice (tests/helpers/train_fixtures.py: its final model
dir, copied to tmp) on 20 of its dev clips plus a clip of white noise and a file that is no audio. The
merge's rules and the score arithmetic are also tested on hand-made records.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from funasr_recipe.data.replay import merge_pseudo_labels, wav_scp_items
from funasr_recipe.data.validate import validate_set
from funasr_recipe.model.inference import ctc_scores
from local.pseudo_label import main
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.model_dirs import build_model_dir

N_CLEAN = 20


def dev_wavs(manifest: Path) -> list[tuple[str, Path, str]]:
    """(key, wav, transcript) of 20 dev clips of a stage-0 manifest spread over the digits; the bundled
    corpus's copy of a clip whose recorded path is gone."""
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    out = []
    for row in rows[:: max(1, len(rows) // N_CLEAN)][:N_CLEAN]:
        wav = Path(row["source"])
        wav = wav if wav.is_file() else DEFAULT_WAV_DIR / wav.name
        if not wav.is_file():
            pytest.skip(f"{row['source']}: the dev audio is missing here and in {DEFAULT_WAV_DIR}")
        out.append((row["key"], wav, row["target"]))
    return out


@pytest.fixture(scope="module")
def labelled(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The trained tiny model (a copy), 20 clean clips + noise + a broken file, decoded by 2 ranks."""
    root = tmp_path_factory.mktemp("pseudo")
    model = root / "model"
    shutil.copytree(trained / "final", model)
    clean = dev_wavs(trained.parent / "data" / "dev" / "data.jsonl")
    src = root / "untranscribed"
    src.mkdir()
    noise = src / "noise.wav"
    sf.write(noise, np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32), 16000)
    broken = src / "broken.wav"
    broken.write_bytes(b"RIFF this is not audio")
    entries = [(k, w) for k, w, _ in clean] + [("zz-noise", noise), ("zz-broken", broken)]
    (src / "wav.scp").write_text("".join(f"{k} {w}\n" for k, w in entries))
    (src / "utt2spk").write_text("".join(f"{k} spk{k.split('-')[0]}\n" for k, _ in entries))
    out = root / "decode"
    for rank in (0, 1):
        assert main(["work", "--model-dir", str(model), "--wav-scp", str(src / "wav.scp"), "--out", str(out),
                     "--rank", str(rank), "--world-size", "2", "--device", "cpu"]) == 0
    shards = {r: [json.loads(x) for x in (out / "shards" / f"{r}.jsonl").read_text().splitlines()]
              for r in (0, 1)}
    return {"model": model, "src": src, "out": out, "clean": clean, "entries": entries, "shards": shards,
            "records": {rec["key"]: rec for recs in shards.values() for rec in recs}}


def merge_args(d: dict, dest: Path, min_logprob: float) -> list[str]:
    return ["merge", "--wav-scp", str(d["src"] / "wav.scp"), "--out", str(d["out"]), "--world-size", "2",
            "--min-logprob", str(min_logprob), "--dest", str(dest), "--wait-timeout", "5"]


def read_table(path: Path) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in path.read_text().splitlines())


def test_two_ranks_split_the_set_and_merge_writes_a_kaldi_dir_stage_0_accepts(labelled: dict,
                                                                             tmp_path: Path) -> None:
    d = labelled
    keys = [k for k, _ in d["entries"]]
    assert all(d["shards"].values()) and sorted(d["records"]) == sorted(keys)  # each key on one rank
    assert sum(map(len, d["shards"].values())) == len(keys)
    dest = tmp_path / "pseudo_dir"
    assert main(merge_args(d, dest, -1.0)) == 0
    summary = json.loads((d["out"] / "pseudo_label.json").read_text())
    assert summary["utterances"] == len(keys) == summary["kept"] + sum(summary["left_out"].values())
    assert summary["left_out"]["unreadable"] == 1
    left = [line.split("\t") for line in (d["out"] / "left_out.tsv").read_text().splitlines()[1:]]
    broken = [row for row in left if row[2] == "zz-broken"]
    assert broken and broken[0][:2] == [str(d["src"] / "wav.scp"), str(len(keys))]  # file, line
    assert broken[0][3] == "unreadable"
    text = read_table(dest / "text")
    assert len(text) == summary["kept"] and "zz-broken" not in text
    for key, hyp in text.items():
        assert "<|" not in hyp and hyp == d["records"][key]["text"]
    assert set(read_table(dest / "utt2lang").values()) == {"en"}
    assert read_table(dest / "utt2spk") == {k: f"spk{k.split('-')[0]}" for k in text}
    report = validate_set(dest, language="zh")  # stage 0: the model's language tag wins over the default
    assert report["accepted"] == len(text) and report["rejected"] == 0
    langs = {json.loads(x)["text_language"] for x in (dest / "data.jsonl").read_text().splitlines()}
    assert langs == {"<|en|>"}


def test_hypotheses_are_those_of_plain_transcription(labelled: dict) -> None:
    from funasr_recipe.model.inference import TorchASR

    asr = TorchASR(labelled["model"], "cpu")
    readable = [(k, w) for k, w in labelled["entries"] if k != "zz-broken"]
    waves = [asr.wave(str(w)) for _, w in readable]
    keys = [k for k, _ in readable]
    texts = asr.transcribe(waves, keys)
    assert [labelled["records"][k]["raw"] for k in keys] == texts
    # Scoring wraps the model only while it decodes, and gives the same texts.
    scored = asr.transcribe_scored(waves, keys)
    assert [t for t, _, _ in scored] == texts
    model = asr.automodel.model
    assert "log_softmax" not in vars(model.ctc) and not model.encoder._forward_hooks
    assert [lp for _, lp, _ in scored] == pytest.approx([labelled["records"][k]["logprob"] for k in keys],
                                                        abs=1e-4)


def test_noise_scores_lower_than_clean_speech(labelled: dict) -> None:
    records = labelled["records"]
    # The tiny model deletes some digits (24% WER): those emit no token in the audio and have no score.
    scored = [k for k, _, _ in labelled["clean"] if records[k]["logprob"] is not None]
    assert len(scored) >= 0.75 * len(labelled["clean"])
    assert all(records[k]["logprob"] <= 0 and records[k]["n_tokens"] >= 1 for k in scored)
    assert all(records[k]["n_tokens"] == 0 for k, _, _ in labelled["clean"] if k not in scored)
    noise = records["zz-noise"]["logprob"]
    assert noise is None or noise < float(np.median([records[k]["logprob"] for k in scored]))


def test_a_threshold_above_every_score_keeps_nothing_and_fails(labelled: dict, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    dest = tmp_path / "none_kept"
    assert main(merge_args(labelled, dest, 0.5)) == 2
    assert "none of 22 utterances is kept (--min-logprob 0.5; the best mean" in capsys.readouterr().err
    summary = json.loads((labelled["out"] / "pseudo_label.json").read_text())
    left = summary["left_out"]
    assert summary["kept"] == 0 and left["low_confidence"] + left["empty_hypothesis"] == 21  # + 1 unreadable
    assert left["low_confidence"] >= 15
    assert not dest.exists()


def test_a_finished_shard_is_not_decoded_again(labelled: dict) -> None:
    shard = labelled["out"] / "shards" / "0.jsonl"
    before = shard.stat().st_mtime_ns
    assert main(["work", "--model-dir", str(labelled["model"]), "--wav-scp", str(labelled["src"] / "wav.scp"),
                 "--out", str(labelled["out"]), "--rank", "0", "--world-size", "2"]) == 0
    assert shard.stat().st_mtime_ns == before


def test_ctc_scores_average_the_best_non_blank_frames_after_the_prompt() -> None:
    probs = torch.tensor([[[0.1, 0.8, 0.1], [0.1, 0.6, 0.3], [0.7, 0.2, 0.1], [0.2, 0.2, 0.6],
                           [0.9, 0.05, 0.05]],
                          [[0.1, 0.1, 0.8], [0.9, 0.05, 0.05], [0.8, 0.1, 0.1], [0.1, 0.1, 0.8],
                           [0.1, 0.8, 0.1]]])
    lengths = torch.tensor([5, 3])
    # Utterance 0: best tokens 1 1 0 2 0 -> emits "1 2"; non-blank frames 0, 1, 3.
    # Utterance 1 (3 frames): 2 0 0 -> emits "2" from frame 0 only.
    assert ctc_scores(probs.log(), lengths, blank_id=0) == [
        (pytest.approx(float(np.log([0.8, 0.6, 0.6]).mean())), 2),
        (pytest.approx(float(np.log(0.8))), 1)]
    # One prompt frame skipped: utterance 0 keeps frames 1, 3; utterance 1 has nothing left but blanks.
    assert ctc_scores(probs.log(), lengths, blank_id=0, skip=1) == [
        (pytest.approx(float(np.log([0.6, 0.6]).mean())), 2), (None, 0)]


def records_dir(tmp_path: Path, lines: list[str]) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "wav.scp").write_text("".join(f"{line}\n" for line in lines))
    return src / "wav.scp"


def test_merge_without_scores_keeps_every_non_empty_hypothesis(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Paraformer's records carry no score: the threshold cannot judge them, emptiness still does."""
    wav_scp = records_dir(tmp_path, ["a /x/a.wav", "b /x/b.wav", "c /x/c.wav", "d sox /x/d.flac -t wav - |"])
    shards = [{"key": "a", "raw": "hello there", "text": "hello there", "logprob": None, "n_tokens": None},
              {"key": "b", "raw": "", "text": "", "logprob": None, "n_tokens": None},
              {"key": "c", "line": 3, "error": "missing_file", "detail": "no such file: /x/c.wav"},
              {"key": "d", "raw": "world", "text": "world", "logprob": None, "n_tokens": None}]
    dest, out = tmp_path / "dest", tmp_path / "out"
    out.mkdir()
    with caplog.at_level(logging.WARNING):
        summary = merge_pseudo_labels(shards, wav_scp, 0.0, dest, out)
    assert summary["kept"] == 2 and summary["unscored"] == 2
    assert summary["left_out"] == {"unreadable": 1, "empty_hypothesis": 1, "low_confidence": 0}
    assert "no confidence" in caplog.text
    assert read_table(dest / "wav.scp") == {"a": "/x/a.wav", "d": "sox /x/d.flac -t wav - |"}
    assert read_table(dest / "utt2spk") == {"a": "a", "d": "d"}  # no utt2spk: each its own speaker
    assert not (dest / "utt2lang").exists()  # no tags emitted: stage 0's declared language applies
    rows = [row.split("\t") for row in (out / "left_out.tsv").read_text().splitlines()[1:]]
    reasons = {row[2]: row[3] for row in rows}
    assert reasons == {"b": "empty_hypothesis", "c": "unreadable"}


def test_a_key_twice_in_wav_scp_is_bad_input(tmp_path: Path) -> None:
    wav_scp = records_dir(tmp_path, ["a /x/a.wav", "b /x/b.wav", "a /x/other.wav"])
    with pytest.raises(ValueError, match=r"wav.scp:3: key a is on line 1 too"):
        wav_scp_items(wav_scp)


@pytest.mark.parametrize("family", ["ConformerCTC", "Paraformer"])
def test_other_families_score_by_ctc_or_say_they_cannot(family: str, request: pytest.FixtureRequest,
                                                        tmp_path: Path) -> None:
    """Random-init models of the other families (tests/helpers/model_dirs.py builds them): the recipe's
    Conformer-CTC is scored from its CTC without prompt frames; Paraformer has no CTC and no score."""
    from funasr_recipe.model.inference import TorchASR

    digits = request.getfixturevalue("data_jsonl")  # 20 bundled digit clips
    asr = TorchASR(build_model_dir(tmp_path, family, digits), "cpu")
    sources = [json.loads(line)["source"] for line in digits.read_text().splitlines()[:6]]
    waves, keys = [asr.wave(s) for s in sources], [Path(s).stem for s in sources]
    scored = asr.transcribe_scored(waves, keys)
    assert [t for t, _, _ in scored] == asr.transcribe(waves, keys)
    if family == "Paraformer":
        assert not asr.scored and all(lp is None and n is None for _, lp, n in scored)
    else:
        assert asr.scored and all(n >= 0 for _, _, n in scored)
        assert all((lp is None) == (n == 0) and (lp is None or lp <= 0) for _, lp, n in scored)

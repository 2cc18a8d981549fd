"""The fine-tuning safeguards through run.sh, stages 0-4, on the tiny model the session trains.

One run from ``trained``'s final model dir with all of them at once: a replay dir, a pseudo-label dir
(audio only), LoRA adapters and a regression dir, trained with ZeRO-3 with the optimizer and the weights
offloaded to CPU memory (ds_stage3_offload_bf16.json: stage 3 merges LoRA into weights gathered from
partitions, and exports them; the session's ``trained`` run covers ZeRO-1); then stage 3 again with a
regression dir in a language the model does not know. Reads the bundled digits; writes under the
session's ``prepared`` dir.

  .venv/bin/python -m pytest tests/e2e/test_finetune_e2e.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.run_sh import run_sh
from tests.helpers.train_data import WORDS
from tests.helpers.train_fixtures import FAST, dirs


def kaldi(out: Path, speakers: tuple[str, ...], takes: range, text: bool = True) -> Path:
    rows = [(f"{s}-{d}_{s}_{i}", DEFAULT_WAV_DIR / f"{d}_{s}_{i}.wav", WORDS[d], s)
            for s in speakers for d in range(10) for i in takes]
    out.mkdir(parents=True)
    (out / "wav.scp").write_text("".join(f"{k} {w}\n" for k, w, _, _ in rows))
    (out / "utt2spk").write_text("".join(f"{k} {s}\n" for k, _, _, s in rows))
    if text:
        (out / "text").write_text("".join(f"{k} {t}\n" for k, _, t, _ in rows))
    return out


@pytest.fixture(scope="module")
def safeguarded(prepared: Path, trained: Path) -> tuple[Path, Path, str]:
    root = prepared / "safeguards"
    rep = kaldi(root / "rep", ("george", "jackson"), range(20, 25))          # 100 utterances
    pl = kaldi(root / "pl", ("lucas",), range(30, 35), text=False)           # 50, no transcripts
    reg = kaldi(root / "reg", ("theo",), range(10, 15))                      # 50
    res = run_sh("--stage", "0", "--stop-stage", "4", "--config", "conf/sensevoice_small.yaml",
                 "--corpus", "kaldi", "--corpus-dir",
                 str(prepared / "kaldi"), "--pretrained-dir", str(trained / "final"),
                 "--replay-dir", str(rep), "--replay-ratio", "0.5",
                 "--pseudo-label-dir", str(pl), "--pseudo-min-logprob", "-5", "--adapter", "lora",
                 "--ds-config", "ds_configs/ds_stage3_offload_bf16.json",
                 "--lora-rank", "4", "--regression-dir", str(reg), "--max-regression", "100",
                 *dirs(root, "exp", "dump"), "--data-dir", str(root / "data"), "--",
                 "++train_conf.max_epoch=1", "++dataset_conf.num_workers=1", *FAST, timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    return root, trained, res.stderr


def test_replay_and_pseudo_labels_reach_training(safeguarded: tuple[Path, Path, str]) -> None:
    root, _, _ = safeguarded
    data = root / "data"
    assert len((data / "replay_rep" / "data.jsonl").read_text().splitlines()) == 100
    counts = json.loads((data / "pseudo_labels" / "pl.decode" / "pseudo_label.json").read_text())
    kept = (data / "pseudo_pl" / "data.jsonl").read_text().splitlines()
    assert counts["utterances"] == 50 and counts["kept"] == len(kept) >= 1  # each kept or listed
    assert all(json.loads(x)["target"] for x in kept)  # the hypotheses became the transcripts
    assert (root / "dump" / "replay_rep" / "data.jsonl").is_file()
    log = (root / "exp" / "train.log").read_text()
    assert "replay utterances" in log and "LoRA rank 4" in log


def test_lora_is_merged_into_the_base_graph(safeguarded: tuple[Path, Path, str]) -> None:
    root, trained, _ = safeguarded
    base = torch.load(trained / "final" / "model.pt", map_location="cpu", weights_only=True)
    tuned = torch.load(root / "exp" / "final" / "model.pt", map_location="cpu", weights_only=True)
    assert tuned.keys() == base.keys()
    changed = [k for k in base if not torch.equal(base[k], tuned[k])]
    assert changed and all(k.startswith("encoder.") for k in changed)  # only adapted layers moved
    # ... from ZeRO-3's partitions, each rank's optimizer (DeepSpeed's CPU Adam) in CPU memory
    assert "(ZeRO-3, optimizer and parameters offloaded: " in (root / "exp" / "train.log").read_text()
    assert (root / "exp" / "model.pt" / "zero_pp_rank_1_mp_rank_00_model_states.pt").is_file()
    assert (root / "exp" / "export" / ".done").is_file()  # ONNX export and parity of the merged model


def test_regression_gate_in_results(safeguarded: tuple[Path, Path, str]) -> None:
    root, _, _ = safeguarded
    report = json.loads((root / "exp" / "regression.json").read_text())
    assert report["verdict"] == "PASS"
    assert "Regression gate" in (root / "exp" / "RESULTS.md").read_text()


def test_regression_dir_in_a_language_the_model_does_not_know(safeguarded: tuple[Path, Path, str]) -> None:
    root, trained, _ = safeguarded
    zh = root / "zh"
    zh.mkdir()
    wav = DEFAULT_WAV_DIR / "0_theo_40.wav"
    (zh / "wav.scp").write_text(f"theo-zh1 {wav}\ntheo-zh2 {wav}\n")
    (zh / "text").write_text("theo-zh1 你好\ntheo-zh2 世界\n")
    (zh / "utt2spk").write_text("theo-zh1 theo\ntheo-zh2 theo\n")
    (zh / "utt2lang").write_text("theo-zh1 zh\ntheo-zh2 zh\n")
    res = run_sh("--stage", "3", "--stop-stage", "3", "--config", "conf/sensevoice_small.yaml",
                 "--corpus", "kaldi", "--pretrained-dir",
                 str(trained / "final"), "--regression-dir", str(zh), *dirs(root, "exp", "dump"),
                 "--data-dir", str(root / "data"), timeout=600)
    assert res.returncode != 0
    assert "regress_zh" in res.stderr and "zh" in res.stderr and "unknown" in res.stderr.lower()
    assert not (root / "exp" / "decode_regress_zh").exists()  # refused before any decoding

"""Every input format of stage 0 through run.sh stages 0-1, on the same real utterances; and a fine-tune
through stage 3 from FunASR's own JSONL.

The formats (tests/helpers/data_formats.py) are built from speechocean762 in its upstream layout
(../shared/data; skipped where this clone has none): Kaldi dirs, Kaldi dirs with segments of joined
recordings, FunASR JSONL (.gz for val), a Hugging Face audiofolder, lhotse recordings + supervisions
and cuts. Each must give the Kaldi path's accepted utterances, keys and feature lengths: a segment
read as a range of its recording is the very audio of the file it was joined from. Writes under
pytest's tmp dirs and the session's ``prepared`` dir.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.data_formats import WRITERS, speechocean_utts
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR
from tests.helpers.run_sh import run_sh
from tests.helpers.train_data import WORDS
from tests.helpers.train_fixtures import dirs

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
# 80 utterances on 2 ranks: small batches, so that the schedule has steps past its warmup.
TUNE = ["++train_conf.max_epoch=2", "++scheduler_conf.warmup_steps=2", "++train_conf.log_interval=2",
        "++dataset_conf.batch_size=1000"]
CORPUS = {fmt: fmt.split("_")[0] for fmt in WRITERS}  # the --corpus each format is given as


def stage01(corpus: str, corpus_dir: Path, root: Path) -> dict[str, dict]:
    """run.sh stages 0-1 on one format; {role: {accepted, rejected, frames by key}} for train and valid."""
    res = run_sh("--stage", "0", "--stop-stage", "1", "--corpus", corpus, "--corpus-dir", str(corpus_dir),
                 "--speed-perturb", "1.0", *dirs(root, "exp"), timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    info = json.loads((root / "data" / "corpus.json").read_text())
    out = {}
    for role in ("train_set", "valid_set"):
        name = info[role]
        report = json.loads((root / "data" / name / "report.json").read_text())
        dump = [json.loads(line) for line in (root / "dump" / name / "data.jsonl").read_text().splitlines()]
        out[role] = {"accepted": report["accepted"], "rejected": report["rejected"],
                     "frames": {o["key"]: o["source_len"] for o in dump}}
    return out


@pytest.mark.shared_data
def test_every_format_gives_the_kaldi_paths_utterances_and_features(tmp_path: Path) -> None:
    corpus = SHARED / "speechocean762"
    if not corpus.is_dir():
        pytest.skip(f"{corpus} is not there (real data shared beside the repo)")
    utts = speechocean_utts(corpus, per_set=40)
    results = {}
    for fmt, write in WRITERS.items():
        results[fmt] = stage01(CORPUS[fmt], write(utts, tmp_path / fmt / "corpus"), tmp_path / fmt)
    base = results["kaldi"]
    assert base["train_set"]["accepted"] == 40 and base["valid_set"]["accepted"] == 40, base
    for fmt, got in results.items():
        for role in ("train_set", "valid_set"):
            assert got[role]["accepted"] == base[role]["accepted"] and got[role]["rejected"] == 0, (fmt, role)
            assert got[role]["frames"].keys() == base[role]["frames"].keys(), (fmt, role)
            # The same samples give the same frame count (stage 1 reads a segment's range only).
            assert got[role]["frames"] == base[role]["frames"], (fmt, role)


def funasr_jsonl(path: Path, speakers: tuple[str, ...], takes: range, itn: str = "<|woitn|>") -> None:
    """A FunASR fine-tuning JSONL of bundled digits, as sensevoice2jsonl writes it (no speaker field)."""
    with open(path, "w", encoding="utf-8") as f:
        for s in speakers:
            for d in range(10):
                for i in takes:
                    wav = DEFAULT_WAV_DIR / f"{d}_{s}_{i}.wav"
                    f.write(json.dumps({"key": f"{s}-{d}_{s}_{i}", "source": str(wav),
                                        "source_len": 30, "target": WORDS[d], "target_len": 1,
                                        "text_language": "<|en|>", "emo_target": "<|NEUTRAL|>",
                                        "event_target": "<|Speech|>", "with_or_wo_itn": itn}) + "\n")


def test_a_finetune_from_funasr_jsonl_through_stage_3(prepared: Path, trained: Path) -> None:
    root = prepared / "from_jsonl"
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    funasr_jsonl(corpus / "train.jsonl", ("george", "jackson"), range(40, 44))
    funasr_jsonl(corpus / "val.jsonl", ("theo",), range(40, 43), itn="<|withitn|>")
    res = run_sh("--stage", "0", "--stop-stage", "3", "--config", "conf/sensevoice_small.yaml",
                 "--corpus", "jsonl", "--corpus-dir", str(corpus), "--pretrained-dir", str(trained / "final"),
                 "--speed-perturb", "1.0", *dirs(root, "exp"), "--data-dir", str(root / "data"), "--",
                 *TUNE, timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    info = json.loads((root / "data" / "corpus.json").read_text())
    valid = info["valid_set"]
    lines = [json.loads(x) for x in (root / "data" / valid / "data.jsonl").read_text().splitlines()]
    assert len(lines) == 30 and {o["with_or_wo_itn"] for o in lines} == {"<|withitn|>"}
    result = json.loads((root / "exp" / f"decode_{valid}" / "result.json").read_text())
    assert result["utterances"] == 30 and result["wer"]["n_ref"] == 30
    assert (root / "exp" / f"decode_{valid}_pretrained" / "result.json").is_file()  # before and after

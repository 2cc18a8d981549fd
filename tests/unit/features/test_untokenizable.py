"""features/targets.py ``normalise_targets`` (issue #30 item 7): stage 1 writes every merged target in
its normalised form and lists each transcript the tokenizer cannot represent, with its key and line, in
<dump-dir>/<set>/untokenizable.tsv, where it used to log one example without keys.

Writes a stage-0 data.jsonl and the merged dump data.jsonl of its speed copies (no audio: only the
targets are read) and small sentencepiece models under pytest's tmp paths.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import sentencepiece as spm
from funasr.tokenizer.sentencepiece_tokenizer import SentencepiecesTokenizer

from funasr_recipe.data.textnorm import FROM_SCRATCH, TextNorm
from funasr_recipe.features.dump import SetPlan, speed_key
from funasr_recipe.features.targets import (
    UNTOKENIZABLE_HEADER,
    UNTOKENIZABLE_TSV,
    normalise_targets,
    vocab_pieces,
    write_raw_list,
)
from funasr_recipe.model.tokenizer import build_tokenizer

DIGITS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()
FACTORS = (0.9, 1.0, 1.1)
# key -> stage-0 transcript; the tokenizer learns the digit words only.
UTTS = {"a-ok": "NINE ZERO", "b-case": "Nine ｚｅｒｏ", "c-unk": "NINE ELEVEN", "d-ok": "ONE TWO",
        "e-char": "SEVEN ñ"}


def _write(path: Path, objs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs), encoding="utf-8")
    return path


def _plan(root: Path, utts: dict[str, str], factors: tuple[float, ...] = FACTORS) -> SetPlan:
    """A merged set as dump.merge_set leaves it: stage 0's lines and every speed copy in the dump."""
    stage0 = [{"key": k, "source": f"/audio/{k}.wav", "source_len": 100, "target": t,
               "target_len": len(t.split()), "text_language": "<|en|>"} for k, t in utts.items()]
    jsonl = _write(root / "data" / "train" / "data.jsonl", stage0)
    dumped = [{**o, "key": speed_key(o["key"], f), "source": f"ark:{i}"} for i, o in enumerate(stage0)
              for f in factors]
    out = root / "dump" / "train"
    _write(out / "data.jsonl", dumped)
    return SetPlan("train", jsonl, out, len(stage0), factors, 1000, "fp")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> SentencepiecesTokenizer:
    root = tmp_path_factory.mktemp("tok")
    lines = [" ".join(DIGITS[i:] + DIGITS[:i]) for i in range(10)]
    train = _write(root / "train.jsonl", [{"key": f"t{i}", "target": t} for i, t in enumerate(lines)])
    return SentencepiecesTokenizer(bpemodel=str(build_tokenizer(train, root / "word", "word", 20)))


def _rows(out: Path) -> list[list[str]]:
    text = (out / UNTOKENIZABLE_TSV).read_text(encoding="utf-8")
    assert text.startswith(UNTOKENIZABLE_HEADER)
    return [line.split("\t") for line in text.splitlines()[1:]]


def test_each_untokenizable_transcript_is_listed_once_with_its_key_and_line(
        tokenizer: SentencepiecesTokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plan = _plan(tmp_path, UTTS)
    with caplog.at_level(logging.INFO, logger="funasr_recipe.features.targets"):
        assert normalise_targets(plan, tokenizer, FROM_SCRATCH) == 2
    rows = _rows(plan.out)
    assert [r[:4] for r in rows] == [[str(plan.jsonl), "3", "c-unk", "unknown_token"],
                                     [str(plan.jsonl), "5", "e-char", "unknown_token"]]
    assert rows[0][4:] == ["NINE ELEVEN", "NINE ELEVEN", "NINE ⁇ ", "▁NINE <unk>"]
    assert rows[1][4:7] == ["SEVEN ñ", "SEVEN Ñ", "SEVEN ⁇ "]
    assert "2 utterances have a target the tokenizer cannot represent (2 with <unk>" in caplog.text
    assert str(plan.out / UNTOKENIZABLE_TSV) in caplog.text
    # What training tokenises: every speed copy's target in the normalised form, target_len with it.
    targets = {o["key"]: (o["target"], o["target_len"])
               for o in map(json.loads, (plan.out / "data.jsonl").read_text(encoding="utf-8").splitlines())}
    assert len(targets) == len(UTTS) * len(FACTORS)
    assert {targets[speed_key("b-case", f)] for f in FACTORS} == {("NINE ZERO", 2)}
    assert targets["a-ok"] == ("NINE ZERO", 2)
    assert tokenizer.encode(targets["b-case"][0]) == tokenizer.encode(targets["a-ok"][0])


def test_a_set_whose_targets_all_survive_gets_the_header_alone(tokenizer: SentencepiecesTokenizer,
                                                                tmp_path: Path) -> None:
    plan = _plan(tmp_path, {"a": "NINE ZERO", "b": "nine zero"}, (1.0,))
    before = (plan.out / "data.jsonl").read_text(encoding="utf-8").splitlines()
    assert normalise_targets(plan, tokenizer, FROM_SCRATCH) == 0
    assert _rows(plan.out) == []
    after = (plan.out / "data.jsonl").read_text(encoding="utf-8").splitlines()
    assert after[0] == before[0] and json.loads(after[1])["target"] == "NINE ZERO"


def test_a_tokenizer_that_changes_the_text_is_a_round_trip_row(tmp_path: Path) -> None:
    # A tokenizer with sentencepiece's own case-folding normaliser (as a pretrained one may have)
    # decodes "NINE" as "nine": the target training sees is not the text the model learns to emit.
    text = [" ".join(DIGITS[i:] + DIGITS[:i]).lower() for i in range(10)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_prefix=str(tmp_path / "cf"),
                                   vocab_size=13, model_type="word", normalization_rule_name="nmt_nfkc_cf",
                                   minloglevel=2)
    tok = SentencepiecesTokenizer(bpemodel=str(tmp_path / "cf.model"))
    plan = _plan(tmp_path, {"x": "NINE ZERO"}, (1.0,))
    assert normalise_targets(plan, tok, TextNorm("NFKC", "upper")) == 1
    assert _rows(plan.out)[0][2:8] == ["x", "round_trip", "NINE ZERO", "NINE ZERO", "nine zero",
                                       "▁nine ▁zero"]
    assert vocab_pieces(tok) is not None and "▁nine" in vocab_pieces(tok)


def test_without_a_tokenizer_targets_are_still_normalised(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    plan = _plan(tmp_path, {"x": "Ｎｉｎｅ zero"}, (1.0,))
    with caplog.at_level(logging.WARNING, logger="funasr_recipe.features.targets"):
        assert normalise_targets(plan, None, FROM_SCRATCH) == 0
    assert "untokenizable-target check skipped" in caplog.text
    assert json.loads((plan.out / "data.jsonl").read_text(encoding="utf-8"))["target"] == "NINE ZERO"
    assert not (plan.out / UNTOKENIZABLE_TSV).exists()


def test_training_on_the_audio_gets_the_same_utterances_and_normalised_targets(
        tokenizer: SentencepiecesTokenizer, tmp_path: Path) -> None:
    """--feats-type raw trains on raw.jsonl: stage 0's audio entries, with the dump's targets."""
    plan = _plan(tmp_path, UTTS)
    normalise_targets(plan, tokenizer, FROM_SCRATCH)
    dumped = (plan.out / "data.jsonl").read_text(encoding="utf-8").splitlines()
    (plan.out / "data.jsonl").write_text("".join(line + "\n" for line in dumped
                                                 if json.loads(line)["key"] != "d-ok"), encoding="utf-8")
    raw = [json.loads(line) for line in write_raw_list(plan).read_text(encoding="utf-8").splitlines()]
    assert [o["key"] for o in raw] == ["a-ok", "b-case", "c-unk", "e-char"]  # d-ok: rejected by stage 1
    assert [o["source"] for o in raw] == [f"/audio/{k}.wav" for k in ("a-ok", "b-case", "c-unk", "e-char")]
    assert raw[1]["target"] == "NINE ZERO" and raw[1]["target_len"] == 2
    # Read side by side with stage 0's list: a dump out of its order is an error, never a shorter list.
    (plan.out / "data.jsonl").write_text("".join(line + "\n" for line in reversed(dumped)), encoding="utf-8")
    with pytest.raises(ValueError, match="at its place in stage 0's order"):
        write_raw_list(plan)

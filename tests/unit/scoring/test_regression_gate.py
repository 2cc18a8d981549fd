"""The regression gate (funasr_recipe/scoring/regression.py, local/regression.py).

The gate runs on decode dirs scored by scoring/score.py from hand-made ref/hyp texts, so that it reads
result.json as stage 3 writes it. The language check runs on the session's trained tiny SenseVoice
(tests/helpers/train_fixtures.py) and on a random-init model dir built from the bundled corpus
(tests/helpers/model_dirs.py's build_model_dir): the check reads only the config and the tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from funasr_recipe.scoring.regression import check_language, gate, load_pairs
from funasr_recipe.scoring.results_md import write_results_md
from funasr_recipe.scoring.score import score_dir
from local.regression import main
from tests.helpers.model_dirs import WORDS, build_model_dir

TEN = " ".join(WORDS)  # ten English words
ZH = "零一二三四五六七八九"  # ten Chinese characters


def _hyp(ref: str, errors: int, unit: str) -> str:
    """``ref`` with its first ``errors`` tokens substituted."""
    toks = ref.split() if unit == "word" else list(ref)
    out = ["X" if i < errors else t for i, t in enumerate(toks)]
    return " ".join(out) if unit == "word" else "".join(out)


def _scored(exp: Path, name: str, errors: dict[str, int], n: int = 10) -> dict:
    """Score decode dir ``exp/decode_<name>``: ``n`` utterances (ten tokens each) per language of
    ``errors``, with that many substituted tokens in all."""
    d = exp / f"decode_{name}"
    d.mkdir(parents=True)
    refs, hyps, tags = [], [], ["key\tlanguage\temotion\tevent"]
    for lang, left in errors.items():
        text, unit = (TEN, "word") if lang == "en" else (ZH, "char")
        for i in range(n):
            key = f"{lang}_{i:02d}"
            k = min(left, 10)
            left -= k
            refs.append(f"{key} {text}")
            hyps.append(f"{key} {_hyp(text, k, unit)}")
            tags.append(f"{key}\t{lang}\tNEUTRAL\tSpeech")
    for file, lines in (("ref.txt", refs), ("hyp.txt", hyps), ("ref_tags.tsv", tags)):
        (d / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return score_dir(d)


def _exp(tmp_path: Path, name: str, before: dict[str, int], after: dict[str, int]) -> Path:
    exp = tmp_path / "exp"
    _scored(exp, f"{name}_pretrained", before)
    _scored(exp, name, after)
    return exp


def test_a_rise_of_exactly_the_limit_passes_and_more_fails(tmp_path: Path) -> None:
    # 100 words: 3 -> 4 errors is exactly 1 point, which floating point puts above 1.0.
    exp = _exp(tmp_path, "regress_en", {"en": 3}, {"en": 4})
    _scored(exp, "regress_worse_pretrained", {"en": 3})
    _scored(exp, "regress_worse", {"en": 5})
    report = gate(load_pairs(exp, ["regress_en", "regress_worse"]), max_regression=1.0)
    by_set = {r.set: r for r in report.rows}
    assert [r.language for r in report.rows] == ["en", "en"]  # one language: no "all" row
    at_limit, worse = by_set["regress_en"], by_set["regress_worse"]
    assert (float(at_limit.before), float(at_limit.after), at_limit.delta) == (0.03, 0.04, 1)
    assert at_limit.passed and at_limit.unit == "word" and at_limit.utterances == 10
    assert worse.delta == 2 and not worse.passed
    assert not report.passed and [r.set for r in report.failures] == ["regress_worse"]
    assert gate(load_pairs(exp, ["regress_worse"]), max_regression=2.0).passed


def test_each_language_is_judged_and_an_all_row_sums_them(tmp_path: Path) -> None:
    # en unchanged (10/100 words), zh 5 -> 15 of 100 characters: zh fails, the whole set by 5 points.
    exp = _exp(tmp_path, "regress_mix", {"en": 10, "zh": 5}, {"en": 10, "zh": 15})
    report = gate(load_pairs(exp, ["regress_mix"]), max_regression=1.0)
    rows = {r.language: r for r in report.rows}
    assert list(rows) == ["all", "en", "zh"]
    assert (rows["en"].delta, rows["en"].passed, rows["en"].unit) == (0, True, "word")
    assert (rows["zh"].delta, rows["zh"].passed, rows["zh"].unit) == (10, False, "char")
    assert (rows["all"].delta, rows["all"].utterances, rows["all"].unit) == (5, 20, "char+word")
    assert report.as_dict()["failed_sets"] == ["regress_mix"]


def test_decode_dirs_of_different_data_are_refused(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    _scored(exp, "regress_en_pretrained", {"en": 0}, n=10)
    _scored(exp, "regress_en", {"en": 0}, n=9)
    with pytest.raises(ValueError, match="not of the same data"):
        gate(load_pairs(exp, ["regress_en"]), max_regression=1.0)


def _gate(exp: Path, sets: str, fatal: str) -> int:
    return main(["gate", "--exp-dir", str(exp), "--sets", sets, "--max-regression", "1.0", "--fatal", fatal])


def test_program_fails_naming_the_set_or_only_warns(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp = _exp(tmp_path, "regress_zh", {"zh": 5}, {"zh": 15})
    _scored(exp, "regress_en_pretrained", {"en": 5})
    _scored(exp, "regress_en", {"en": 0})
    assert _gate(exp, "regress_en,regress_zh", "true") == 1
    out, err = capsys.readouterr()
    assert "| regress_zh | zh | char | 10 | 5.00 | 15.00 | +10.00 | +1.00 | FAIL |" in out
    assert "| regress_en | en | word | 10 | 5.00 | 0.00 | -5.00 | +1.00 | PASS |" in out
    failure = [line for line in err.splitlines() if "ERROR" in line]
    assert len(failure) == 1 and "regress_zh (zh, char): 5.00% -> 15.00%, +10.00 points" in failure[0]
    assert "regress_en" not in failure[0]
    doc = json.loads((exp / "regression.json").read_text())
    assert (doc["verdict"], doc["failed_sets"]) == ("FAIL", ["regress_zh"])
    assert (exp / "regression.md").read_text().splitlines() == out.splitlines()

    assert _gate(exp, "regress_en,regress_zh", "false") == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "regress_zh" in err and "ERROR" not in err
    assert _gate(exp, "regress_en", "true") == 0
    assert _gate(exp, "regress_zh regress_en ", "true") == 1  # as run.sh lists them


def test_results_md_gains_the_gate_section(tmp_path: Path) -> None:
    exp = _exp(tmp_path, "regress_zh", {"zh": 5}, {"zh": 15})
    write_results_md(exp, exp / "RESULTS.md")
    assert "Regression gate" not in (exp / "RESULTS.md").read_text()
    assert _gate(exp, "regress_zh", "false") == 0
    text = write_results_md(exp, exp / "RESULTS.md").read_text()
    section = text[text.index("## Regression gate"):]
    assert "verdict: **FAIL**" in section and "rose by more than 1 percentage points" in section
    assert "| regress_zh | zh | char | 10 | 5.00 | 15.00 | +10.00 | +1.00 | FAIL |" in section


def test_a_from_scratch_run_has_no_pretrained_decode(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp = tmp_path / "exp"
    _scored(exp, "regress_en", {"en": 0})
    assert _gate(exp, "regress_en", "true") == 2
    err = capsys.readouterr().err
    assert "decode_regress_en_pretrained/result.json: no such file" in err and "needs a fine-tune" in err
    assert not (exp / "regression.json").exists()


# --- the language check --------------------------------------------------------------------------------

def _jsonl(path: Path, lines: list[tuple[str, str]]) -> Path:
    """A stage-0 style data.jsonl of (language tag, transcript) lines."""
    with open(path, "w", encoding="utf-8") as f:
        for i, (lang, text) in enumerate(lines):
            f.write(json.dumps({"key": f"u{i}", "source": "x.wav", "target": text, "text_language": lang},
                               ensure_ascii=False) + "\n")
    return path


@pytest.fixture(scope="module")
def digits_jsonl(data_jsonl: Path) -> Path:  # noqa: F811  (the fixture, by name)
    """Twenty real bundled digit clips with English tags (tests/helpers/model_dirs.py's; build_model_dir
    computes the CMVN from them)."""
    return data_jsonl


# The trained model dir costs a training run (the session's ``trained``): slow tier.
@pytest.fixture(scope="module", params=["built", pytest.param("trained", marks=pytest.mark.slow)])
def sensevoice_dir(request: pytest.FixtureRequest, digits_jsonl: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SenseVoice model dir whose tokenizer knows the English digit words only: one built here, and
    a copy of the session's trained tiny model (tests/helpers/train_fixtures.py) without its weights."""
    root = tmp_path_factory.mktemp(f"sensevoice_{request.param}")
    if request.param == "built":
        return build_model_dir(root, "SenseVoiceSmall", digits_jsonl)
    final = request.getfixturevalue("trained") / "final"
    return Path(shutil.copytree(final, root / "final", ignore=shutil.ignore_patterns("model.pt")))


def test_english_digits_pass(sensevoice_dir: Path, digits_jsonl: Path) -> None:
    assert check_language(sensevoice_dir, digits_jsonl) == {"en": {"utterances": 20, "unk_share": 0.0}}
    assert main(["check", "--model-dir", str(sensevoice_dir), "--data-jsonl", str(digits_jsonl)]) == 0


def test_chinese_text_is_unknown_to_a_digit_model(sensevoice_dir: Path, tmp_path: Path) -> None:
    # The tokenizer has the <|zh|> tag, so only the transcripts give it away.
    data = _jsonl(tmp_path / "data.jsonl", [("<|zh|>", "你好 世界"), ("<|zh|>", ZH), ("<|en|>", "ONE")])
    with pytest.raises(ValueError) as e:
        check_language(sensevoice_dir, data)
    msg = str(e.value)
    assert str(data) in msg and "language zh (2 utterances)" in msg and "100%" in msg and "'零一二" in msg
    assert check_language(sensevoice_dir, data, max_unk_share=1.0)["zh"]["unk_share"] == 1.0


def test_a_language_sensevoice_lacks_is_refused(sensevoice_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    data = _jsonl(tmp_path / "data.jsonl", [("<|en|>", "ONE"), ("<|fr|>", "TWO")])
    assert main(["check", "--model-dir", str(sensevoice_dir), "--data-jsonl", str(data)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert str(data) in errors[0] and "<|fr|>" in errors[0] and "does not know" in errors[0]


def test_a_tag_the_tokenizer_splits_is_refused(digits_jsonl: Path, tmp_path: Path) -> None:
    # funasr's own SentencepiecesTokenizer on the recipe's dummy-prefix model reads a tag as "▁<|en|>",
    # which is not the tag's id (an unknown word of the word model).
    model = build_model_dir(tmp_path, "SenseVoiceSmall", digits_jsonl)
    cfg = model / "config.yaml"
    cfg.write_text(cfg.read_text().replace("SenseVoiceTagTokenizer", "SentencepiecesTokenizer"))
    with pytest.raises(ValueError, match=r"tag <\|en\|> \(20 utterances\) encodes to \[[\d, ]+\] with "
                       r"the model's tokenizer \(SentencepiecesTokenizer\)"):
        check_language(model, digits_jsonl)


def test_every_family_is_checked_for_unknown_text(digits_jsonl: Path, tmp_path: Path) -> None:
    model = build_model_dir(tmp_path, "Paraformer", digits_jsonl)
    assert check_language(model, digits_jsonl)["en"]["unk_share"] == 0.0
    # No language table outside SenseVoice: a tag it would not know is no error by itself.
    assert check_language(model, _jsonl(tmp_path / "fr.jsonl", [("<|fr|>", "ONE TWO")]))
    with pytest.raises(ValueError, match=r"language zh \(1 utterances\): 100% of its transcript characters"):
        check_language(model, _jsonl(tmp_path / "zh.jsonl", [("<|zh|>", ZH)]))

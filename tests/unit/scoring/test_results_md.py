"""local.results_md: RESULTS.md from the result.json files of an experiment's decode dirs."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from funasr_recipe.scoring.results_md import write_results_md
from local.results_md import main


def counts(rate: float | None, n_ref: int, sub: int, dele: int, ins: int) -> dict:
    return {"rate": rate, "n_ref": n_ref, "sub": sub, "del": dele, "ins": ins, "cor": n_ref - sub - dele}


def result(model: str, set_name: str, primary: dict, per_language: dict, tags: bool, **extra) -> dict:
    acc = {k: {"accuracy": a, "correct": 0, "total": 1} for k, a in
           (("language", 0.95), ("emotion", 0.5), ("event", None))}
    return {"set": set_name, "model": model, "utterances": 40, "cer": counts(0.1234, 500, 30, 20, 12),
            "wer": counts(0.2, 100, 10, 6, 4), "primary": primary, "per_language": per_language,
            "tag_accuracy": acc if tags else {}, "missing_hyp": [], "empty_hyp": [], "extra_hyp": [],
            "rtf": 0.0456, "audio_seconds": 100.0, "decode_seconds": 4.56, "processes": 2,
            "device": "cpu", **extra}


def write(exp: Path, dirname: str, res: dict) -> None:
    (exp / dirname).mkdir(parents=True)
    (exp / dirname / "result.json").write_text(json.dumps(res), encoding="utf-8")


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    exp = tmp_path / "exp" / "sv_ft"
    two_langs = {"en": {"utterances": 20, "unit": "word", **counts(0.25, 100, 15, 5, 5)},
                 "zh": {"utterances": 20, "unit": "char+mixed", **counts(0.05, 400, 10, 6, 4)}}
    # "a_finetuned" sorts before "pretrained" by name: only the pretrained-first rule puts it second.
    write(exp, "decode_dev", result("a_finetuned", "dev", counts(0.08, 500, 20, 10, 10), two_langs, True))
    write(exp, "decode_dev_pretrained", result("iic/SenseVoiceSmall", "dev", counts(0.3, 500, 90, 30, 30),
                                               two_langs, True, missing_hyp=["k1", "k2"]))
    one_lang = {"en": {"utterances": 40, "unit": "word", **counts(1 / 3, 300, 50, 30, 20)}}
    write(exp, "decode_test", result("a_finetuned", "test", counts(1 / 3, 300, 50, 30, 20), one_lang, False,
                                     rtf=None))
    (exp / "decode_broken").mkdir()  # a decode dir without result.json (not scored yet): skipped
    return exp


def table_rows(text: str) -> list[list[str]]:
    section = text.split("## Error rates")[1].split("\n\n")[1]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()[2:]]


def test_rows_sorted_by_set_with_pretrained_first(exp: Path) -> None:
    out = write_results_md(exp, exp / "RESULTS.md")
    text = out.read_text(encoding="utf-8")
    assert text.startswith(f"# RESULTS: {exp}\n")
    assert f"- exp dir: {exp}\n" in text and "torch " in text and "funasr " in text
    assert "- config: not recorded" in text and "config tag" not in text  # no train_identity.json here
    assert table_rows(text) == [
        ["iic/SenseVoiceSmall", "dev", "40", "12.34", "20.00", "30.00", "90/30/30", "95.00", "50.00", "-",
         "0.0456"],
        ["a_finetuned", "dev", "40", "12.34", "20.00", "8.00", "20/10/10", "95.00", "50.00", "-", "0.0456"],
        ["a_finetuned", "test", "40", "12.34", "20.00", "33.33", "50/30/20", "-", "-", "-", "-"],
    ]
    assert "- decode_dev_pretrained: 2 missing and 0 empty hypotheses" in text


def test_per_language_table_only_for_sets_with_several_languages(exp: Path) -> None:
    text = write_results_md(exp, exp / "RESULTS.md").read_text(encoding="utf-8")
    assert "### dev: per language" in text and "### test: per language" not in text
    section = text.split("### dev: per language")[1].strip().splitlines()[2:]
    assert section == ["| en | iic/SenseVoiceSmall | 20 | word | 25.00 | 15/5/5 |",
                       "| en | a_finetuned | 20 | word | 25.00 | 15/5/5 |",
                       "| zh | iic/SenseVoiceSmall | 20 | char+mixed | 5.00 | 10/6/4 |",
                       "| zh | a_finetuned | 20 | char+mixed | 5.00 | 10/6/4 |"]


def test_main_default_output_and_errors(exp: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--exp-dir", str(exp)]) == 0
    assert (exp / "RESULTS.md").is_file()
    empty = tmp_path / "exp" / "nothing"
    empty.mkdir()
    assert main(["--exp-dir", str(empty)]) == 2
    assert "run local/score.py first" in capsys.readouterr().err
    (exp / "decode_dev" / "result.json").write_text('{"set": "dev",\n "model": ')
    assert main(["--exp-dir", str(exp), "--out", str(tmp_path / "R.md")]) == 2
    assert f"{exp / 'decode_dev' / 'result.json'}:2: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "R.md").exists()


def test_dated_by_the_newest_score_so_a_rerun_writes_the_same_bytes(exp: Path) -> None:
    """Stage 5 fingerprints RESULTS.md: a stage-3 rerun that rescored nothing must not change it."""
    os.utime(exp / "decode_test" / "result.json", (1_700_000_000, 1_700_000_000))
    for name in ("decode_dev", "decode_dev_pretrained"):
        os.utime(exp / name / "result.json", (1_600_000_000, 1_600_000_000))
    first = write_results_md(exp, exp / "RESULTS.md").read_bytes()
    assert write_results_md(exp, exp / "RESULTS.md").read_bytes() == first
    stamp = datetime.datetime.fromtimestamp(1_700_000_000)
    assert f"- date: {stamp:%Y-%m-%d %H:%M:%S}" in first.decode()
    os.utime(exp / "decode_dev" / "result.json", (1_800_000_000, 1_800_000_000))  # a set was rescored
    assert write_results_md(exp, exp / "RESULTS.md").read_bytes() != first


def test_header_names_the_config_exp_dir_and_models_the_run_used(tmp_path: Path) -> None:
    """A tiny recipe model fine-tuned with conf/sensevoice_small.yaml into --exp-dir exp: the header says
    so, instead of 'config tag: exp', and the model is named by what it is, not by the config's name."""
    base = tmp_path / "fold" / "final"  # a from-scratch tiny model of this recipe
    base.mkdir(parents=True)
    record = {"checkpoint": "model.pt.avg5", "config": "conf/tiny_sensevoice.yaml",
              "model": "tiny_sensevoice.yaml"}
    (base / "configuration.json").write_text(json.dumps({"model_name_in_hub": {"ms": "", "hf": ""},
                                                         "recipe": record}))
    exp = tmp_path / "exp"
    write(exp, "decode_dev", result("x", "dev", counts(0.08, 500, 20, 10, 10), {}, False))
    options = {"config": "conf/sensevoice_small.yaml", "pretrained-dir": str(base), "exp-dir": str(exp)}
    identity = {f"given.{k}": json.dumps(v) for k, v in options.items()}  # local.marker resume's record
    identity["config.model"] = json.dumps("SenseVoiceSmall")
    (exp / "train_identity.json").write_text(json.dumps(identity))
    from funasr_recipe.model.provenance import provenance

    (exp / "final").mkdir()
    (exp / "final" / "configuration.json").write_text(json.dumps(
        {"recipe": {"checkpoint": "model.pt.avg3", **provenance(exp)}}))
    text = write_results_md(exp, exp / "RESULTS.md").read_text(encoding="utf-8")
    header = text.split("## Error rates")[0]
    assert f"- exp dir: {exp}\n" in header
    assert "- config: conf/sensevoice_small.yaml\n" in header
    assert f"- pretrained model: {base} (tiny_sensevoice.yaml from scratch, average of 5 checkpoints)\n" \
        in header
    assert f"- model: tiny_sensevoice.yaml fine-tuned from {base}, average of 3 checkpoints\n" in header
    assert "sensevoice_small avg" not in text and "config tag" not in text

"""local.score end to end on a small decode dir: figures computed by hand, listings, malformed input."""

from __future__ import annotations

import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from funasr_recipe.scoring.score import ScoreInputError, alignment_lines, score_dir
from local.score import main

ROOT = Path(__file__).resolve().parents[3]

REF = """\
b3 我爱 Python 编程
a1 The cat sat on the mat.
a2 Hello world
b1 我爱北京天安门
b2 今天天气很好
"""
# a2 is missing (failed decode), b2 empty, x9 has no reference; a1: one word substituted (the -> a);
# b1: one character deleted; b3: one character substituted (程 -> 成), python stays one token.
HYP = """\
a1 the cat sat on a mat
b1 我爱北京天安
b2
b3 我爱 python 编成
x9 extra words
"""
REF_TAGS = """\
key\tlanguage\temotion\tevent
a1\ten\tNEUTRAL\tSpeech
a2\ten\tHAPPY\tSpeech
b1\tzh\tNEUTRAL\tSpeech
b2\tzh\tEMO_UNKNOWN\tBGM
b3\tzh\t\tSpeech
"""
HYP_TAGS = """\
key\tlanguage\temotion\tevent\titn
a1\t<|en|>\tneutral\tSpeech\twoitn
b1\ten\tSAD\tSpeech\twithitn
b2\tzh\tNEUTRAL\tSpeech\twoitn
b3\tzh\tHAPPY\tSpeech\twoitn
x9\ten\tNEUTRAL\tSpeech\twoitn
"""
DECODE = {"model": "sensevoice_ft", "set": "dev", "utterances": 5, "audio_seconds": 20.0,
          "decode_seconds": 2.5, "rtf": 0.125, "processes": 2, "device": "cpu"}


def make_dir(root: Path, name: str = "decode_dev", **files: str | None) -> Path:
    """A decode dir with the files above; a keyword (hyp_txt=...) replaces one, None leaves it out."""
    d = root / "exp" / "tag" / name
    d.mkdir(parents=True)
    contents = {"ref.txt": REF, "hyp.txt": HYP, "ref_tags.tsv": REF_TAGS, "hyp_tags.tsv": HYP_TAGS,
                "decode.json": json.dumps(DECODE)}
    contents.update({k.replace("_txt", ".txt").replace("_tsv", ".tsv").replace("_json", ".json"): v
                     for k, v in files.items()})
    for fname, text in contents.items():
        if text is not None:
            (d / fname).write_text(text, encoding="utf-8")
    return d


def figures(c: dict) -> tuple:
    return c["n_ref"], c["sub"], c["del"], c["ins"]


def test_result_json_by_hand(tmp_path: Path) -> None:
    d = make_dir(tmp_path)
    res = score_dir(d)
    assert json.loads((d / "result.json").read_text(encoding="utf-8")) == res
    assert (res["set"], res["model"], res["utterances"]) == ("dev", "sensevoice_ft", 5)
    # primary: a1 1S/6 words, a2 2D/2 words, b1 1D/7 chars, b2 6D/6 chars, b3 1S/5 mixed tokens
    assert figures(res["primary"]) == (26, 2, 9, 0) and res["primary"]["rate"] == pytest.approx(11 / 26)
    # words: a1 1S/6, a2 2D/2, b1 1S/1 (one unspaced word), b2 1D/1, b3 1S/3 (我爱 python 编程)
    assert figures(res["wer"]) == (13, 3, 3, 0) and res["wer"]["rate"] == pytest.approx(6 / 13)
    # chars: a1 the->a 1S 2D of 17, a2 10D/10, b1 1D/7, b2 6D/6, b3 1S/10
    assert figures(res["cer"]) == (50, 2, 19, 0) and res["cer"]["rate"] == pytest.approx(21 / 50)
    en, zh = res["per_language"]["en"], res["per_language"]["zh"]
    assert (en["utterances"], en["unit"], figures(en)) == (2, "word", (8, 1, 2, 0))
    assert (zh["utterances"], zh["unit"], figures(zh)) == (3, "char+mixed", (18, 1, 7, 0))
    assert list(res["per_language"]) == ["en", "zh"]
    # language: a1 ok, b1 wrong, b2 ok, b3 ok (a2: no hypothesis tags);
    # emotion: a1 ok, b1 wrong (b2 EMO_UNKNOWN and b3 empty in the reference: left out);
    # event: a1, b1, b3 ok, b2 BGM -> Speech wrong.
    acc = res["tag_accuracy"]
    assert {k: (v["correct"], v["total"]) for k, v in acc.items()} == {
        "language": (3, 4), "emotion": (1, 2), "event": (3, 4)}
    assert acc["emotion"]["accuracy"] == pytest.approx(0.5)
    assert (res["missing_hyp"], res["empty_hyp"], res["extra_hyp"]) == (["a2"], ["b2"], ["x9"])
    assert (res["rtf"], res["audio_seconds"], res["decode_seconds"], res["processes"], res["device"]) == (
        0.125, 20.0, 2.5, 2, "cpu")
    top = res["top_errors"]
    assert sorted(map(tuple, top["substitutions"])) == [("the", "a", 1), ("程", "成", 1)]
    assert top["deletions"][0] == ["天", 2]  # 今天天气很好: 天 twice
    assert top["insertions"] == []


def test_per_utt_lists_every_reference_key_in_order(tmp_path: Path) -> None:
    d = make_dir(tmp_path)
    score_dir(d)
    text = (d / "per_utt.txt").read_text(encoding="utf-8")
    heads = [line.split()[0] for line in text.splitlines()
             if line and not line.startswith(("REF:", "HYP:", "EVAL:"))]
    assert heads == ["a1", "a2", "b1", "b2", "b3"]
    assert "hyp=missing" in next(line for line in text.splitlines() if line.startswith("a2 "))
    assert "hyp=empty" in next(line for line in text.splitlines() if line.startswith("b2 "))
    assert "x9" not in text
    a1 = text.split("\n\n")[0].splitlines()
    assert "#ref=6  #C=5 #S=1 #D=0 #I=0  err=16.67%" in a1[0]
    assert a1[3].split() == ["EVAL:", "S"]


def display_col(line: str, index: int) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line[:index])


def test_alignment_columns_line_up_with_wide_characters() -> None:
    ref, hyp, ev = alignment_lines([("C", "我", "我"), ("S", "爱", "ai"), ("D", "北京", None),
                                    ("I", None, "x"), ("C", "python", "python")])
    assert ref.startswith("REF:  我") and hyp.startswith("HYP:  我")
    for r_tok, h_tok, e_tok in (("爱", "ai", "S"), ("北京", "***", "D"), ("***", "x", "I")):
        cols = {display_col(ref, ref.index(r_tok)), display_col(hyp, hyp.index(h_tok)),
                display_col(ev, ev.index(e_tok))}
        assert len(cols) == 1, (r_tok, cols)
    assert display_col(ref, ref.index("python")) == display_col(hyp, hyp.index("python"))


def test_result_txt_names_the_figures(tmp_path: Path) -> None:
    d = make_dir(tmp_path)
    score_dir(d)
    text = (d / "result.txt").read_text(encoding="utf-8")
    assert "42.00%" in text and "46.15%" in text and "42.31%" in text  # CER 21/50, WER 6/13, 11/26
    assert "missing hypotheses (scored as deletions): 1: a2" in text
    assert "empty hypotheses (scored as deletions): 1: b2" in text
    assert "extra hypothesis keys (no reference, not scored): 1: x9" in text
    assert "RTF: 0.1250" in text and "the -> a" in text


def test_many_missing_keys_are_cut_at_50(tmp_path: Path) -> None:
    ref = "".join(f"u{i:03d} word\n" for i in range(60))
    d = make_dir(tmp_path, ref_txt=ref, hyp_txt="", ref_tags_tsv=None, hyp_tags_tsv=None,
                 decode_json=None)
    res = score_dir(d)
    assert len(res["missing_hyp"]) == 60 and res["wer"]["rate"] == 1.0
    assert res["tag_accuracy"] == {} and res["rtf"] is None
    assert (res["set"], res["model"]) == ("dev", "tag")  # from the dir names without decode.json
    line = next(x for x in (d / "result.txt").read_text().splitlines() if x.startswith("missing"))
    assert line.endswith("u049 ...") and "u050" not in line


def test_without_language_tags_every_utterance_is_mixed(tmp_path: Path) -> None:
    d = make_dir(tmp_path, name="decode_dev_pretrained")
    (d / "ref_tags.tsv").unlink()
    (d / "decode.json").unlink()
    res = score_dir(d)
    assert list(res["per_language"]) == ["unknown"] and res["per_language"]["unknown"]["unit"] == "mixed"
    assert figures(res["primary"]) == (26, 2, 9, 0)  # mixed == the language units on this set
    assert (res["set"], res["model"], res["tag_accuracy"]) == ("dev", "pretrained", {})


def test_empty_reference_counts_insertions(tmp_path: Path) -> None:
    d = make_dir(tmp_path, ref_txt="k1 a b\nk2\n", hyp_txt="k1 a b\nk2 oops\n")
    res = score_dir(d)
    assert figures(res["primary"]) == (2, 0, 0, 1) and res["primary"]["rate"] == 0.5
    assert "k2  lang=unknown  unit=mixed  #ref=0  #C=0 #S=0 #D=0 #I=1  err=inf" in (
        d / "per_utt.txt").read_text()


@pytest.mark.parametrize(("files", "where"), [
    ({"hyp_txt": "a1 x\nb1 y\na1 z\n"}, r"hyp\.txt:3: duplicate key 'a1' \(first on line 1\)"),
    ({"ref_txt": "a1 x\n\na1 y\n"}, r"ref\.txt:3: duplicate key 'a1'"),
    ({"ref_tags_tsv": "key\tlanguage\na1\ten\nb1\n"}, r"ref_tags\.tsv:3: 1 fields, the header has 2"),
    ({"hyp_tags_tsv": "a1\ten\n"}, r"hyp_tags\.tsv:1: expected a header"),
    ({"hyp_tags_tsv": "key\tlanguage\na1\ten\na1\tzh\n"}, r"hyp_tags\.tsv:3: duplicate key 'a1'"),
    ({"decode_json": '{"model": "m",\n "set": }'}, r"decode\.json:2: not valid JSON"),
])
def test_malformed_input_names_file_and_line(tmp_path: Path, files: dict, where: str) -> None:
    d = make_dir(tmp_path, **files)
    with pytest.raises(ScoreInputError, match=where):
        score_dir(d)


def test_non_utf8_line_is_named(tmp_path: Path) -> None:
    d = make_dir(tmp_path)
    (d / "hyp.txt").write_bytes(b"a1 fine\nb1 caf\xe9\n")
    with pytest.raises(ScoreInputError, match=r"hyp\.txt:2: byte 3 is not UTF-8"):
        score_dir(d)


def test_main_exits_nonzero_with_the_message(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    d = make_dir(tmp_path, hyp_txt="a1 x\na1 y\n")
    assert main(["--dir", str(d)]) == 2  # malformed input
    assert f"{d / 'hyp.txt'}:2: duplicate key 'a1'" in capsys.readouterr().err
    assert not (d / "result.json").exists()
    (d / "ref.txt").unlink()
    assert main(["--dir", str(d)]) == 2  # malformed input
    assert "ref.txt: no such file" in capsys.readouterr().err


def test_cli(tmp_path: Path) -> None:
    d = make_dir(tmp_path)
    res = subprocess.run([sys.executable, "-m", "local.score", "--dir", str(d)], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "[node0 rank0]" in res.stderr and "primary 42.31%" in res.stderr
    assert json.loads((d / "result.json").read_text())["utterances"] == 5

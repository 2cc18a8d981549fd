"""local.error_rate: normalisation, units, alignment; totals checked against jiwer 4.0.0.

jiwer is the reference for error totals and rates. Three quirks of jiwer 4 decide how it is fed:
  * jiwer.cer counts the spaces between words as characters; our "char" unit has no spaces, so
    jiwer.cer gets the normalised text with its spaces removed;
  * jiwer does not normalise; it gets our normalised text, so only the counting is compared;
  * with no reference token in the whole corpus jiwer divides by 1 (wer("", "x y") == 2); ours is
    inf. Corpora compared below always have reference tokens (single empty references are fine).
S/D/I splits: ours is, of the alignments with the fewest edits, one with the fewest substitutions
(checked by brute force); jiwer (rapidfuzz's editops) promises only the fewest edits. The splits are
compared where every optimal alignment has the same number of substitutions (which then fixes D and
I too: D - I = n_ref - n_hyp and S + D + I = the distance); elsewhere both must be optimal splits.
"""

from __future__ import annotations

import math
import random
import time

import jiwer
import pytest

from funasr_recipe.scoring.error_rate import (
    Counts,
    align,
    chars,
    corpus_counts,
    corpus_error_rate,
    count,
    distance,
    mixed,
    normalize,
    tokens,
    unit_for,
    unit_for_language,
    utterance_counts,
    words,
)

EN = [
    ("The quick brown fox jumps over the lazy dog.", "the quick brown fox jumped over a lazy dog"),
    ("I don't think it's going to rain today.", "i dont think its going to rain to day"),
    ("She sells sea shells by the sea shore", "she sells seashells by the seashore"),
    ("Please call Stella and ask her to bring these things", "please call stella ask her to bring these "
     "things with her"),
    ("Hello, world!", ""),
    ("turn left at the next light", "turn left at the next light"),
    ("WHAT a lovely DAY", "what a lovely day it is"),
]
ZH = [
    ("今天天气很好，我们去公园散步吧。", "今天天气很好我们去公园散步"),
    ("我爱北京天安门", "我爱北京天安门广场"),
    ("人工智能正在改变世界", "人工只能在改变世界"),
    ("请把窗户关上", ""),
    ("中华人民共和国成立于一九四九年", "中华人民共和国成立于1949年"),
    ("明天见", "明天 见"),
]


@pytest.mark.parametrize(("text", "expected"), [
    ("Ｈｅｌｌｏ　ＷＯＲＬＤ１２３！", "hello world123"),  # full-width letters, digits, space, punctuation
    ("Hello, World!", "hello world"),
    ("I don't know, it's O'Brien's.", "i don't know it's o'brien's"),
    ("I don’t know", "i don't know"),  # typographic apostrophe
    ("'cause the students' books", "cause the students books"),  # quote marks, not word-internal
    ("<|zh|><|NEUTRAL|><|Speech|><|woitn|>你好，世界。", "你好 世界"),
    ("well-known  U.S.A.\t~ok~", "well known u s a ok"),
    ("好的~ 😊 #tag *bold* 1+1=2", "好的 tag bold 1 1 2"),
    ("Straße\u200bweg", "strasseweg"),  # casefold; zero-width space is no separator
    ("「你好」『世界』、《书》", "你好 世界 书"),
    ("   ", ""),
])
def test_normalize(text: str, expected: str) -> None:
    assert normalize(text) == expected


def test_normalize_is_idempotent() -> None:
    for ref, hyp in EN + ZH:
        assert normalize(normalize(ref)) == normalize(ref) and normalize(normalize(hyp)) == normalize(hyp)


def test_tokenisation_units() -> None:
    assert mixed(normalize("我爱 Python 编程")) == ["我", "爱", "python", "编", "程"]
    assert mixed("我爱python编程") == ["我", "爱", "python", "编", "程"]  # script boundary splits too
    assert mixed("2024年 ok") == ["2024", "年", "ok"]
    assert mixed("ひらがなカタカナー") == list("ひらがなカタカナー")
    assert mixed("𠀀𪚥 a") == ["𠀀", "𪚥", "a"]  # Han extension B, outside the BMP
    assert mixed("안녕하세요 세계") == ["안녕하세요", "세계"]  # Korean eojeol stay words
    assert chars("ab c 你") == ["a", "b", "c", "你"]
    assert words(" a  bc ") == ["a", "bc"]
    assert tokens("a b", "char") == ["a", "b"] and tokens("a b", "word") == ["a", "b"]
    with pytest.raises(ValueError, match="unknown unit"):
        tokens("a", "phone")


def test_unit_choice() -> None:
    assert [unit_for_language(x) for x in ("zh", "yue", "ja", "en", "ko")] == ["char"] * 3 + ["word"] * 2
    assert unit_for_language("<|ZH|>") == "char"
    assert [unit_for_language(x) for x in (None, "", "nospeech", "de")] == ["mixed"] * 4
    assert unit_for("zh", "我爱北京") == "char"
    assert unit_for("zh", "2024年") == "char"  # digits do not make a text mixed
    assert unit_for("zh", "我爱 python") == "mixed"
    assert unit_for("en", "i love 北京") == "mixed"
    assert unit_for("en", "i love beijing") == "word"


def test_align_ops_and_tie_breaking() -> None:
    ali = align("the cat sat on the mat".split(), "the cat sit on mat now".split())
    assert ali == [("C", "the", "the"), ("C", "cat", "cat"), ("S", "sat", "sit"), ("C", "on", "on"),
                   ("D", "the", None), ("C", "mat", "mat"), ("I", None, "now")]
    # Equal edits; the tie goes to fewer substitutions (more correct tokens), as in sclite and jiwer.
    assert [op for op, _, _ in align("a b c".split(), "x a c".split())] == ["I", "C", "D", "C"]
    assert [op for op, _, _ in align("a b".split(), "b a".split())] == ["I", "C", "D"]
    assert [op for op, _, _ in align("a b".split(), "c d".split())] == ["S", "S"]
    assert align([], ["x"]) == [("I", None, "x")] and align(["x"], []) == [("D", "x", None)]
    assert align([], []) == []


def full_table(ref: list[str], hyp: list[str]) -> list[list[int]]:
    n, m = len(ref), len(hyp)
    d = [[i + j if i == 0 or j == 0 else 0 for j in range(m + 1)] for i in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i][j] = min(d[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]), d[i - 1][j] + 1, d[i][j - 1] + 1)
    return d


def optimal_subs(ref: list[str], hyp: list[str]) -> set[int]:
    """Substitution counts of all minimum-cost alignments (brute force over the full table)."""
    d = full_table(ref, hyp)
    n, m = len(ref), len(hyp)
    subs: list[list[set[int]]] = [[set() for _ in range(m + 1)] for _ in range(n + 1)]
    subs[0] = [{0} for _ in range(m + 1)]
    for i in range(1, n + 1):
        subs[i][0] = {0}
        for j in range(1, m + 1):
            diff = ref[i - 1] != hyp[j - 1]
            if d[i - 1][j - 1] + diff == d[i][j]:
                subs[i][j] |= {s + diff for s in subs[i - 1][j - 1]}
            if d[i - 1][j] + 1 == d[i][j]:
                subs[i][j] |= subs[i - 1][j]
            if d[i][j - 1] + 1 == d[i][j]:
                subs[i][j] |= subs[i][j - 1]
    return subs[n][m]


def check_alignment(ref: list[str], hyp: list[str], ali: list) -> None:
    assert [r for _, r, _ in ali if r is not None] == ref
    assert [h for _, _, h in ali if h is not None] == hyp
    for op, r, h in ali:
        assert (op == "C") == (r == h) and (op == "S") == (r is not None and h is not None and r != h)


def test_alignment_is_optimal_on_random_sequences() -> None:
    rng = random.Random(7)
    for _ in range(1500):
        vocab = "abcde"[:rng.randint(1, 5)]
        ref = [rng.choice(vocab) for _ in range(rng.randint(0, 30))]
        hyp = [rng.choice(vocab) for _ in range(rng.randint(0, 30))]
        ali = align(ref, hyp)
        check_alignment(ref, hyp, ali)
        dist = full_table(ref, hyp)[-1][-1]
        c = count(ali)
        assert distance(ref, hyp) == dist == c.errors, (ref, hyp)
        assert c.sub == min(optimal_subs(ref, hyp)) and c.n_ref == len(ref) and c.n_hyp == len(hyp)


def random_pair(rng: random.Random, vocab: list[str], length: int, err: float) -> tuple[str, str]:
    ref = [rng.choice(vocab) for _ in range(length)]
    hyp = []
    for tok in ref:
        x = rng.random()
        if x < err / 3:
            continue  # deletion
        hyp.append(rng.choice(vocab) if x < 2 * err / 3 else tok)
        if x > 1 - err / 3:
            hyp.append(rng.choice(vocab))  # insertion
    return " ".join(ref), " ".join(hyp)


def test_wer_equals_jiwer_on_random_sequences() -> None:
    rng = random.Random(2024)
    vocab = ["ka", "lo", "mi", "nu", "pe", "ri", "so", "tu"]
    pairs = [random_pair(rng, vocab, rng.randint(1, 40), rng.choice([0.0, 0.1, 0.3, 0.8]))
             for _ in range(400)]
    pairs += [(" ".join(rng.choice(vocab) for _ in range(5)), "") for _ in range(5)]
    refs, hyps = [p[0] for p in pairs], [p[1] for p in pairs]
    ours = corpus_counts(refs, hyps, unit="word")
    theirs = jiwer.process_words(refs, hyps)
    assert ours.errors == theirs.substitutions + theirs.deletions + theirs.insertions
    assert ours.n_ref == theirs.hits + theirs.substitutions + theirs.deletions
    assert ours.rate == pytest.approx(jiwer.wer(refs, hyps), abs=1e-12)
    compared = 0
    for ref, hyp in pairs:
        r, h = ref.split(), hyp.split()
        c = count(align(r, h))
        out = jiwer.process_words(ref, hyp)
        assert c.errors == out.substitutions + out.deletions + out.insertions
        subs = optimal_subs(r, h)
        assert c.sub in subs and out.substitutions in subs
        if len(subs) == 1:
            compared += 1
            assert (c.sub, c.dele, c.ins) == (out.substitutions, out.deletions, out.insertions)
    assert compared > 100  # the unique-split comparison must have covered a good share


def test_wer_equals_jiwer_on_english() -> None:
    refs, hyps = [normalize(r) for r, _ in EN], [normalize(h) for _, h in EN]
    ours = corpus_counts([r for r, _ in EN], [h for _, h in EN], unit="word")
    out = jiwer.process_words(refs, hyps)
    assert ours.errors == out.substitutions + out.deletions + out.insertions
    assert ours.rate == pytest.approx(jiwer.wer(refs, hyps), abs=1e-12)
    assert ours.rate == pytest.approx(corpus_error_rate([r for r, _ in EN], [h for _, h in EN],
                                                        ["en"] * len(EN)), abs=1e-12)


def test_cer_equals_jiwer_on_chinese_and_english() -> None:
    for data in (ZH, EN):
        refs = ["".join(normalize(r).split()) for r, _ in data]
        hyps = ["".join(normalize(h).split()) for _, h in data]
        ours = corpus_counts([r for r, _ in data], [h for _, h in data], unit="char")
        out = jiwer.process_characters(refs, hyps)
        assert ours.errors == out.substitutions + out.deletions + out.insertions
        assert ours.n_ref == out.hits + out.substitutions + out.deletions
        assert ours.rate == pytest.approx(jiwer.cer(refs, hyps), abs=1e-12)
        if data is ZH:  # Chinese is scored in characters: the same figure through the language
            rate = corpus_error_rate([r for r, _ in ZH], [h for _, h in ZH], ["zh"] * len(ZH))
            assert rate == pytest.approx(jiwer.cer(refs, hyps), abs=1e-12)


def test_empty_and_missing_hypotheses_match_jiwer_fed_empty_strings() -> None:
    refs = ["one two three", "four five", "six"]
    assert jiwer.wer(refs, ["one two three", "", ""]) == pytest.approx(3 / 6)
    assert corpus_error_rate(refs, ["one two three", "", ""]) == pytest.approx(3 / 6)
    missing = corpus_counts(refs, ["one two three", None, None])  # type: ignore[list-item]
    assert (missing.dele, missing.errors, missing.n_ref) == (3, 3, 6)
    assert utterance_counts("你好", None, "char") == Counts(n_ref=2, dele=2)


def test_empty_reference_counts_its_insertions() -> None:
    c = utterance_counts("", "x y", "word")
    assert (c.ins, c.errors, c.n_ref, c.rate) == (2, 2, 0, math.inf)
    assert utterance_counts("", "", "word").rate == 0.0
    refs, hyps = ["a b", ""], ["a b", "x"]
    assert corpus_error_rate(refs, hyps) == pytest.approx(jiwer.wer(refs, hyps)) == pytest.approx(0.5)
    # jiwer quirks (module docstring): an all-empty corpus divides by 1; spaces are characters.
    assert jiwer.wer("", "x y") == 2 and corpus_error_rate([""], ["x y"]) == math.inf
    assert jiwer.cer("ab cd", "abcd") == pytest.approx(0.2) and corpus_error_rate(["ab cd"], ["abcd"],
                                                                                   ["zh"]) == 0.0


def test_corpus_error_rate_uses_each_language_unit() -> None:
    refs = ["The cat sat.", "我爱北京", "我爱 Python 编程"]
    hyps = ["the cat sit", "我爱南京", "我爱 python 编成"]
    # en: words; zh: characters; zh with Latin letters: mixed (python stays one token).
    refs_tok = ["the cat sat", "我 爱 北 京", "我 爱 python 编 程"]
    hyps_tok = ["the cat sit", "我 爱 南 京", "我 爱 python 编 成"]
    expected = jiwer.wer(refs_tok, hyps_tok)
    assert expected == pytest.approx(3 / 12)
    assert corpus_error_rate(refs, hyps, ["en", "zh", "zh"]) == pytest.approx(expected)
    assert corpus_error_rate(refs, hyps) == pytest.approx(expected)  # unknown languages: mixed
    assert corpus_error_rate(refs, hyps, ["zh", "zh", "zh"]) != pytest.approx(expected)  # en as chars
    with pytest.raises(ValueError, match="2 references, 1 hypotheses"):
        corpus_error_rate(["a", "b"], ["a"])


def test_counts_arithmetic_and_json() -> None:
    total = Counts(5, 1, 1, 0, 3) + Counts(4, 0, 0, 2, 4)
    assert total == Counts(9, 1, 1, 2, 7) and total.errors == 4 and total.rate == pytest.approx(4 / 9)
    assert Counts(0, 0, 0, 1, 0).as_dict()["rate"] is None  # inf is not JSON


def test_alignment_is_fast_enough_for_a_test_set() -> None:
    rng = random.Random(1)
    vocab = [f"w{i}" for i in range(500)]
    pairs = [random_pair(rng, vocab, 50, 0.1) for _ in range(2000)]
    start = time.perf_counter()
    total = corpus_counts([r for r, _ in pairs], [h for _, h in pairs], unit="word")
    elapsed = time.perf_counter() - start
    assert total.n_ref == 100_000
    assert elapsed < 10, f"{elapsed:.1f}s for 2000 utterances of 50 words"  # ~0.5s on 2 cores

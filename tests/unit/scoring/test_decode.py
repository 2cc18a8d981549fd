"""Stage 3's decoding without a model: tag parsing, the split over ranks, batching, and the merge
(local/decode.py over data/tags.py, dist/slicing.py, data/batching.py, scoring/decode_dir.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from funasr_recipe.data.batching import consecutive_batches
from funasr_recipe.data.tags import split_tags
from funasr_recipe.dist.slicing import deal
from local.decode import main


def test_sensevoice_tags_are_parsed_into_columns_and_stripped() -> None:
    tags, text = split_tags("<|en|><|NEUTRAL|><|Speech|><|woitn|>seven eight")
    assert tags == {"language": "en", "emotion": "NEUTRAL", "event": "Speech", "itn": "woitn"}
    assert text == "seven eight"
    tags, text = split_tags("<|zh|><|HAPPY|><|BGM|><|withitn|>你好<|Laughter|>")
    assert tags["language"] == "zh" and tags["event"] == "BGM" and text == "你好"
    assert split_tags("no tags here") == ({}, "no tags here")
    assert split_tags("<|weird|>x")[0] == {"other": "weird"}


def items(lengths: list[int]) -> list[tuple[int, dict]]:
    return [(i + 1, {"key": f"u{i:03d}", "source_len": n}) for i, n in enumerate(lengths)]


def by_length(its: list[tuple[int, dict]], rank: int, world: int) -> list[tuple[int, dict]]:
    """local/decode.py's deal: longest first, ties by key."""
    return deal(its, rank, world, size=lambda it: it[1]["source_len"], key=lambda it: it[1]["key"])


def test_every_utterance_goes_to_exactly_one_rank_with_balanced_work() -> None:
    its = items([(37 * i) % 500 + 10 for i in range(101)])
    shares = [by_length(its, r, 3) for r in range(3)]
    keys = [obj["key"] for share in shares for _, obj in share]
    assert sorted(keys) == sorted(obj["key"] for _, obj in its)
    work = [sum(obj["source_len"] for _, obj in share) for share in shares]
    assert max(work) - min(work) <= 500  # round robin over the sorted list: at most one longest apart


def test_batches_respect_both_limits_and_keep_every_utterance() -> None:
    its = by_length(items([(53 * i) % 900 + 20 for i in range(200)]), 0, 1)
    out = consecutive_batches([obj["source_len"] for _, obj in its], max_utts=16, max_frames=4000)
    assert [i for b in out for i in b] == list(range(len(its)))
    for b in out:
        longest = max(its[i][1]["source_len"] for i in b)
        assert len(b) <= 16 and (len(b) == 1 or longest * len(b) <= 4000)


def write_shard(out: Path, rank: int, lines: list[dict], seconds: float) -> None:
    shards = out / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    (shards / f"{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (shards / f"{rank}.stats.json").write_text(json.dumps({"audio_seconds": seconds, "decode_seconds": 1.0,
                                                            "device": "cpu"}))
    (shards / f"{rank}.done").write_text("x\n")


def test_merge_writes_the_score_inputs_and_keeps_a_failed_utterance_out_of_hyp(tmp_path: Path) -> None:
    data = tmp_path / "dev" / "data.jsonl"
    data.parent.mkdir()
    refs = [{"key": k, "source": f"/x/{k}.wav", "target": t, "text_language": "<|en|>",
             "emo_target": "<|NEUTRAL|>", "event_target": "<|Speech|>"}
            for k, t in (("a", "ONE"), ("b", "TWO"), ("c", "THREE"))]
    data.write_text("".join(json.dumps(r) + "\n" for r in refs))
    out = tmp_path / "decode_dev"
    one = {"key": "a", "raw": "<|en|>one", "text": "one", "language": "en", "seconds": 1.0}
    write_shard(out, 0, [one], 1.0)
    write_shard(out, 1, [{"key": "c", "line": 3, "error": "unreadable_audio", "detail": "/x/c.wav: bad"},
                         {"key": "b", "raw": "<|en|>", "text": "", "language": "en", "seconds": 2.0}], 2.0)
    assert main(["merge", "--data-jsonl", str(data), "--out", str(out), "--world-size", "2",
                 "--model-name", "m"]) == 0
    assert (out / "ref.txt").read_text() == "a ONE\nb TWO\nc THREE\n"
    assert (out / "hyp.txt").read_text() == "a one\nb\n"  # c failed: missing, so scored as deletions
    assert (out / "ref_tags.tsv").read_text().splitlines()[1] == "a\ten\tNEUTRAL\tSpeech"
    failed = (out / "failed.tsv").read_text().splitlines()
    assert failed[1].split("\t")[:4] == [str(data), "3", "c", "unreadable_audio"]
    summary = json.loads((out / "decode.json").read_text())
    assert summary["utterances"] == 3 and summary["failed"] == 1 and summary["rtf"] == round(2 / 3, 5)


def test_merge_refuses_when_a_shard_lost_utterances(tmp_path: Path) -> None:
    data = tmp_path / "dev" / "data.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"key": k, "target": "X"}) + "\n" for k in "ab"))
    write_shard(tmp_path / "d", 0, [{"key": "a", "text": "one", "seconds": 1.0}], 1.0)
    assert main(["merge", "--data-jsonl", str(data), "--out", str(tmp_path / "d"), "--model-name", "m"]) == 1


def test_merge_names_the_model_from_its_dir(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Without --model-name: what the averaged dir's configuration.json records (model/provenance.py; a
    dir from before the record: '<tag> <checkpoint>'), 'pretrained <dir>' for the model fine-tuned from;
    a dir that is not one of stage 3's is refused (exit 2)."""
    data = tmp_path / "dev" / "data.jsonl"
    data.parent.mkdir()
    data.write_text(json.dumps({"key": "a", "target": "ONE"}) + "\n")
    out = tmp_path / "decode_dev"
    write_shard(out, 0, [{"key": "a", "text": "one", "seconds": 1.0}], 1.0)
    final = tmp_path / "final"
    final.mkdir()
    merge = ["merge", "--data-jsonl", str(data), "--out", str(out), "--model-dir", str(final),
             "--tag", "tiny"]
    assert main(merge) == 2  # no configuration.json
    (final / "configuration.json").write_text(json.dumps({"recipe": {"checkpoint": "model.pt.avg5"}}))
    assert main(merge) == 0 and json.loads((out / "decode.json").read_text())["model"] == "tiny avg5"
    assert main([*merge, "--pretrained", "true"]) == 0
    assert json.loads((out / "decode.json").read_text())["model"] == f"pretrained {final}"
    record = {"checkpoint": "model.pt.avg3", "config": "conf/sensevoice_small.yaml", "pretrained": "/m/base",
              "model": "tiny_sensevoice.yaml"}
    (final / "configuration.json").write_text(json.dumps({"recipe": record}))
    assert main(merge) == 0
    assert json.loads((out / "decode.json").read_text())["model"] == \
        "tiny_sensevoice.yaml fine-tuned from /m/base, average of 3 checkpoints"
    (final / "configuration.json").write_text("{broken")
    assert main(merge) == 2 and f"{final / 'configuration.json'}:1: not valid JSON" in capsys.readouterr().err


def test_work_after_waits_for_the_models_marker_then_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    """--after: the imports first, then the wait; a marker that never holds the fingerprint (the averaging
    died, or an earlier run's marker) is a failure after --wait-timeout, with nothing decoded or marked."""
    import threading

    import funasr_recipe.model.model_dir as model_dir
    from funasr_recipe.dist.markers import mark_done

    calls: list[str] = []
    monkeypatch.setattr(model_dir, "import_automodel", lambda: calls.append("import"))
    data = tmp_path / "dev" / "data.jsonl"
    data.parent.mkdir()
    data.write_text(json.dumps({"key": "a", "source": "a.wav", "source_len": 100, "target": "ONE"}) + "\n")
    final, out = tmp_path / "final", tmp_path / "decode_dev"
    final.mkdir()
    mark_done(final / ".done", "an earlier run")
    work = ["work", "--data-jsonl", str(data), "--out", str(out), "--model-dir", str(final), "--rank", "0",
            "--after", str(final / ".done"), "this run", "--wait-timeout", "0.5"]
    assert main(work) == 1
    assert calls == ["import"]
    assert "writing the model" in capsys.readouterr().err and not (out / "shards" / "0.done").exists()
    # Written while it waits: it goes on to read the model dir (here an empty one: refused as bad input).
    threading.Timer(0.3, mark_done, (final / ".done", "this run")).start()
    work[-1] = "30"
    assert main(work) == 2
    assert str(final / "model.pt") in capsys.readouterr().err and not (out / "shards" / "0.done").exists()

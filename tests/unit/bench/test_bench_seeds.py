"""bench/bench_seeds.py: the runs it makes and the figures it reports (the runs themselves are the
end-to-end tests' business: stages 0-1 once, then stages 2-3 per seed)."""

from __future__ import annotations

from pathlib import Path

from bench.bench_seeds import main, seed_commands, table


def test_stages_0_1_are_shared_and_each_seed_trains_into_its_own_dir() -> None:
    prep, train = seed_commands(Path("/w"), "conf/tiny_sensevoice.yaml", 2, ["++scheduler=warmup_cosine"])
    assert prep[prep.index("--stop-stage") + 1] == "1" and "--exp-dir" not in prep
    assert prep[prep.index("--dump-dir") + 1] == train[train.index("--dump-dir") + 1] == "/w/dump"
    assert train[train.index("--stage") + 1] == "2" and train[train.index("--stop-stage") + 1] == "3"
    assert train[train.index("--exp-dir") + 1] == "/w/seed2"
    assert train[train.index("--") + 1:] == ["++seed=2", "++scheduler=warmup_cosine"]
    # Stage 1 reads the config too (++feats_storage=uint16 decides its shards); the seed is stage 2's.
    assert prep[prep.index("--") + 1:] == ["++scheduler=warmup_cosine"]


def test_without_overrides_stages_0_1_get_no_separator() -> None:
    prep, train = seed_commands(Path("/w"), "conf/tiny_sensevoice.yaml", 0, [])
    assert "--" not in prep and train[train.index("--") + 1:] == ["++seed=0"]


def _row(seed: int, errors: int, n_ref: int, losses: list[float]) -> dict:
    counts = {"rate": errors / n_ref, "n_ref": n_ref, "sub": errors, "del": 0, "ins": 0,
              "cor": n_ref - errors}
    return {"seed": seed, "utterances": n_ref, "cer": counts, "wer": counts, "missing_or_empty": 0,
            "valid_loss": losses, "seconds": 300.0}


def test_table_gives_each_seed_its_mean_and_range() -> None:
    text = table([_row(0, 48, 500, [0.9, 0.33, 0.39]), _row(1, 41, 500, [0.8, 0.3])],
                 "conf/x.yaml", ["++a=1"])
    assert "conf/x.yaml ++a=1" in text
    assert "| 0 | 500 | 9.60 | 9.60 | 0 | 0.330 / 0.390 | 5.0 min |" in text
    assert "| mean of 2 | | 8.90 | 8.90 |" in text and "| range | | | 8.20-9.60 |" in text


def test_a_seed_whose_run_left_no_result_is_bad_input(tmp_path: Path, monkeypatch) -> None:
    """A run that exits 0 but left no decode result (a broken tree) stops the bench with exit 2 naming
    the file, not a traceback; the runs themselves are stubbed (run.sh is the end-to-end tests')."""
    monkeypatch.setattr("bench.bench_seeds.subprocess.run",
                        lambda *a, **k: type("Done", (), {"returncode": 0})())
    assert main(["--work-dir", str(tmp_path), "--seeds", "0"]) == 2

"""--local-cache: stage 2's node-local copy of the feature shards (funasr_recipe/data/local_cache.py).

Units on a small dump of real kaldiio arks: the copy and its lists, current copies skipped, a changed or
damaged copy copied again, a killed copy never current, too little space falling back with the sizes
(free space from an injected function). End to end: two node processes of run.sh over 127.0.0.1, each
with its own cache, train stage 2 while the shared shards are made unreadable once the caches are full.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from funasr_recipe.data import local_cache
from funasr_recipe.data.line_index import build_index, load_index
from funasr_recipe.data.local_cache import fill, human, split_source, view_dir
from tests.faults.procs import start_run_sh, wait_for
from tests.helpers.train_fixtures import FAST, free_port


def make_dump(dump: Path, sets: dict[str, int], per_shard: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    """dump/<set>/{data.jsonl,shards/NNNNN.{ark,scp},am.mvn} as stage 1 lays them out; the matrices by key."""
    rng = np.random.default_rng(seed)
    mats = {}
    for name, n in sets.items():
        lines = []
        for shard in range(-(-n // per_shard)):
            ark = dump / name / "shards" / f"{shard:05d}.ark"
            ark.parent.mkdir(parents=True, exist_ok=True)
            keys = [f"{name}-{i}" for i in range(shard * per_shard, min(n, (shard + 1) * per_shard))]
            with kaldiio.WriteHelper(f"ark,scp:{ark},{ark.with_suffix('.scp')}") as w:
                for key in keys:
                    mats[key] = rng.standard_normal((int(rng.integers(5, 40)), 80)).astype(np.float32)
                    w(key, mats[key])
            for line in ark.with_suffix(".scp").read_text().splitlines():
                key, source = line.split(" ", 1)
                lines.append(json.dumps({"key": key, "source": source, "source_len": len(mats[key]),
                                         "target": "ONE"}) + "\n")
        (dump / name / "data.jsonl").write_text("".join(lines))
        (dump / name / "am.mvn").write_text(f"cmvn of {name}\n")
    (dump / "tokenizer").mkdir(exist_ok=True)
    return mats


def copies(view: Path) -> list[Path]:
    """The ark files really in the view (not reached through its links into dump/)."""
    return sorted(Path(d) / f for d, _, files in os.walk(view) for f in files
                  if f.endswith(".ark") and not (Path(d) / f).is_symlink())


def copied(caplog: pytest.LogCaptureFixture) -> int:
    """How many files the last fill copied, from its last log line."""
    line = [r.getMessage() for r in caplog.records if "copied" in r.getMessage()][-1]
    return int(line.split("copied ", 1)[1].split(" ", 1)[0])


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    make_dump(tmp_path / "dump", {"train": 7, "dev": 2, "replay_x": 3})
    return tmp_path / "dump"


def test_split_source() -> None:
    assert split_source("/d/shards/00000.ark:24") == ("/d/shards/00000.ark", ":24")
    assert split_source("/d/a:b/x.ark:9[3:7]") == ("/d/a:b/x.ark", ":9[3:7]")
    assert split_source("/audio/x.wav") == ("/audio/x.wav", "")


def test_copies_the_shards_and_points_the_lists_at_them(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    mats = make_dump(dump, {"train": 7, "dev": 2, "replay_x": 3, "test": 2})
    for name in ("train", "dev"):  # as stage 1 leaves them: the view must index its own lists
        build_index(dump / name / "data.jsonl")
    res = fill(dump, tmp_path / "cache", ["train", "dev", "replay_x"], threads=3)
    view = view_dir(tmp_path / "cache", dump)
    assert res.dump_dir == view and res.fallback is None and res.copied == res.files == 3 + 1 + 1
    assert res.bytes == sum(p.stat().st_size for n in ("train", "dev", "replay_x")
                            for p in (dump / n / "shards").glob("*.ark"))
    for name in ("train", "dev", "replay_x"):
        lines = [json.loads(line) for line in (view / name / "data.jsonl").read_text().splitlines()]
        originals = [json.loads(line) for line in (dump / name / "data.jsonl").read_text().splitlines()]
        assert [{**o, "source": ""} for o in originals] == [{**o, "source": ""} for o in lines]
        for line in lines:  # every source in the view, and it reads the same matrix
            assert line["source"].startswith(f"{view}/{name}/shards/"), line
            np.testing.assert_array_equal(kaldiio.load_mat(line["source"]), mats[line["key"]])
        # Its own line index, which stage 2 maps without rebuilding it (the dump's describes other bytes).
        index = view / name / "data.jsonl.idx"
        assert not index.is_symlink() and load_index(view / name / "data.jsonl").path == index
        assert index.stat().st_mtime_ns >= (view / name / "data.jsonl").stat().st_mtime_ns
        # The rest of the set is linked: stage 2 resolves am.mvn to the shared file.
        assert (view / name / "am.mvn").resolve() == (dump / name / "am.mvn").resolve()
        assert (view / name / "shards" / "00000.scp").is_symlink()
    assert (view / "tokenizer").resolve() == (dump / "tokenizer").resolve()
    assert (view / "test").is_symlink() and not list(view.glob(".cache/test/**/*.json"))  # not asked for
    assert json.loads((view / "cache.json").read_text())["copied"] == 5


def test_current_copies_are_skipped_and_only_what_changed_is_copied(dump: Path, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    cache = tmp_path / "cache"
    fill(dump, cache, ["train", "dev"])
    view = view_dir(cache, dump)
    mtimes = {p: p.stat().st_mtime_ns for p in copies(view)}
    assert len(mtimes) == 4

    res = fill(dump, cache, ["train", "dev"])
    assert res.copied == 0 and res.dump_dir == view and copied(caplog) == 0
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes  # not rewritten

    # Stage 1 rewrote one shard (other features, same layout): that file alone is copied again.
    changed = dump / "train" / "shards" / "00001.ark"
    data = bytearray(changed.read_bytes())
    data[-1] ^= 0xFF
    changed.write_bytes(bytes(data))
    res = fill(dump, cache, ["train", "dev"])
    assert res.copied == 1 and (view / "train/shards/00001.ark").read_bytes() == bytes(data)
    assert all(p.stat().st_mtime_ns == t for p, t in mtimes.items() if p.name != "00001.ark")


def test_a_damaged_copy_fails_its_checksum_and_is_copied_again(dump: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fill(dump, cache, ["train"])
    copy = view_dir(cache, dump) / "train" / "shards" / "00002.ark"
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size, same mtime: only the checksum sees it
    stat = copy.stat()
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    res = fill(dump, cache, ["train"])
    assert res.copied == 1
    assert copy.read_bytes() == (dump / "train" / "shards" / "00002.ark").read_bytes()


def test_a_killed_copy_is_never_current(dump: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy that dies half-way (here: an error after the first block is written) leaves no file that
    a rerun takes as current, and the rerun copies it whole."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(local_cache, "CHUNK", 64)
    real_crc32 = local_cache.zlib.crc32
    calls = {"n": 0}

    def dies_on_the_third_block(block: bytes, crc: int = 0) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # what a kill looks like to the thread: it stops where it is
        return real_crc32(block, crc)

    monkeypatch.setattr(local_cache.zlib, "crc32", dies_on_the_third_block)
    with pytest.raises(KeyboardInterrupt):
        fill(dump, cache, ["dev"], threads=1)
    monkeypatch.setattr(local_cache.zlib, "crc32", real_crc32)
    view = view_dir(cache, dump)
    assert not (view / "dev" / "shards" / "00000.ark").exists() and not (view / SIDE_DEV).exists()
    # A copy renamed into place whose sidecar was never written (killed between the two) is not current.
    fill(dump, cache, ["dev"])
    (view / SIDE_DEV).unlink()
    res = fill(dump, cache, ["dev"])
    assert res.copied == 1 and not list(view.rglob(".*.tmp*"))


SIDE_DEV = Path(".cache/dev/shards/00000.ark.json")


def test_too_little_space_falls_back_to_the_shared_dump_naming_the_sizes(
        dump: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    need = sum(p.stat().st_size for p in (dump / "train" / "shards").glob("*.ark"))
    reserve = 1000
    res = fill(dump, tmp_path / "cache", ["train"], reserve_bytes=reserve,
               free_bytes=lambda path: need + reserve - 1)
    assert res.dump_dir == dump and res.fallback and res.copied == 0
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING][-1]
    assert f"needs {human(need)} ({need} bytes)" in warning, warning
    assert f"({need + reserve - 1} bytes) free" in warning and f"training reads the shared {dump}" in warning
    assert not copies(view_dir(tmp_path / "cache", dump))
    # One byte more and it fits.
    res = fill(dump, tmp_path / "cache", ["train"], reserve_bytes=reserve,
               free_bytes=lambda path: need + reserve)
    assert res.fallback is None and res.copied == 3


def test_a_set_linked_by_an_earlier_run_is_never_written_through(dump: Path, tmp_path: Path) -> None:
    """dev was linked when only train was cached; caching dev later must not write into dump/dev."""
    cache = tmp_path / "cache"
    fill(dump, cache, ["train"])
    view = view_dir(cache, dump)
    assert (view / "dev").is_symlink()
    before = {p.name: p.read_bytes() for p in (dump / "dev").rglob("*") if p.is_file()}
    res = fill(dump, cache, ["train", "dev"])
    assert res.copied == 1 and not (view / "dev").is_symlink()
    assert {p.name: p.read_bytes() for p in (dump / "dev").rglob("*") if p.is_file()} == before
    # Shards no longer named by a list leave the cache (their space), the others stay.
    lines = (dump / "train" / "data.jsonl").read_text().splitlines()
    (dump / "train" / "data.jsonl").write_text("\n".join(lines[:3]) + "\n")
    fill(dump, cache, ["train", "dev"])
    assert [p.relative_to(view) for p in copies(view)] == [Path("dev/shards/00000.ark"),
                                                           Path("train/shards/00000.ark")]


def test_a_missing_shard_names_the_list_line(dump: Path, tmp_path: Path) -> None:
    (dump / "dev" / "shards" / "00000.ark").unlink()
    with pytest.raises(FileNotFoundError, match=r"dev/data.jsonl:1: cannot stat .*00000.ark.*rerun stage 1"):
        fill(dump, tmp_path / "cache", ["dev"])
    with pytest.raises(ValueError, match="inside the dump dir"):
        fill(dump, dump / "cache", ["train"])


def relocated_dump(prepared: Path, dest: Path, every: int = 8) -> Path:
    """A copy of the session's stage-1 dump (``prepared``) whose lists name the copy, as a user who moves
    a dump rewrites them (this test hides its shards, which the other tests go on reading), with every
    ``every``-th training line only: one short epoch, still from every shard."""
    shutil.copytree(prepared / "dump", dest, symlinks=True)
    for jsonl in dest.glob("*/data.jsonl"):
        lines = jsonl.read_text().replace(f'"{prepared / "dump"}/', f'"{dest}/').splitlines(keepends=True)
        jsonl.write_text("".join(lines[::every] if jsonl.parent.name == "train" else lines))
    return dest


@pytest.mark.slow
def test_two_nodes_train_from_their_own_caches_while_the_shared_shards_are_unreadable(
        prepared: Path, tmp_path: Path) -> None:
    """Two run.sh node processes over 127.0.0.1, each with its own --local-cache: once both caches are
    full, every shard dir of the shared dump is moved away and made unreadable (both: as root, chmod
    alone does not stop a read), and stage 2 still trains, from lists that name only the caches."""
    dump, exp = relocated_dump(prepared, tmp_path / "dump"), tmp_path / "exp"
    shard_dirs = sorted(dump.glob("*/shards"))
    arks = {n: {split_source(json.loads(line)["source"])[0] for line in (dump / n / "data.jsonl").open()}
            for n in ("train", "dev")}
    assert len(arks["train"]) > 1 and all(Path(a).is_file() for a in arks["train"] | arks["dev"])

    caches = [tmp_path / f"cache{n}" for n in (0, 1)]
    views = [view_dir(c, dump) for c in caches]
    # No preflight (its bandwidth test is 20 s here) and no OOM probe: what is tested is where stage 2 reads.
    stage2 = ["--stage", "2", "--stop-stage", "2", "--data-dir", str(prepared / "data"),
              "--dump-dir", str(dump), "--exp-dir", str(exp), "--nnodes", "2", "--nproc-per-node", "1",
              "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--train-engine", "ddp",
              "--preflight", "false", "--oom-probe", "false"]
    runs = [start_run_sh(*stage2, "--node-rank", str(n), "--local-cache", str(caches[n]), "--",
                         "++train_conf.max_epoch=1", *FAST, stderr=tmp_path / f"node{n}.err") for n in (0, 1)]
    hidden = []
    try:
        # cache.json is the fill's last write; run.sh then starts torchrun, which waits for both nodes.
        wait_for(lambda: all((v / "cache.json").is_file() for v in views), "both caches to be filled",
                 runs[0], timeout=300, poll=0.05)
        for shards in shard_dirs:
            away = shards.with_name("shards.away")
            shards.rename(away)
            hidden.append((away, shards))
            away.chmod(0)
        codes = [r.wait(timeout=600) for r in runs]
    finally:
        for r in runs:
            if r.poll() is None:
                r.kill()
        for away, shards in hidden:
            away.chmod(0o755)
            away.rename(shards)
    errs = [(tmp_path / f"node{n}.err").read_text() for n in (0, 1)]
    assert codes == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    assert (exp / ".train.done").is_file() and (exp / "model.pt").is_file()

    # What the trainer read: node 0's resolved config and every source in its lists, node 1's log.
    config = (exp / "config.yaml").read_text()
    for name in ("train", "dev"):
        assert f"{views[0]}/{name}/data.jsonl" in config, config
        sources = [json.loads(line)["source"] for line in (views[0] / name / "data.jsonl").open()]
        assert sources and all(s.startswith(f"{views[0]}/{name}/shards/") for s in sources)
    assert f"{views[1]}/train/data.jsonl" in (exp / "train.node1.log").read_text()
    assert str(views[0]) not in (exp / "train.node1.log").read_text()
    for n, err in enumerate(errs):
        copy_lines = [line for line in err.splitlines() if "copying to the local cache" in line]
        assert copy_lines and f"[node{n} rank0]" in copy_lines[-1] and "ETA" in copy_lines[-1], err[-3000:]
        assert f"copied {len(arks['train'] | arks['dev'])} file(s)" in err  # on each node: all the shards

"""Stage 3 end to end through run.sh on CPU: averaging, decoding split over processes and nodes, scoring.

Uses the session's trained tiny SenseVoice (tests/train_fixtures.py: DeepSpeed ZeRO-1 bf16, 2 ranks)
and the fine-tune from its model dir.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.test_run_sh import CLEAN_ENV, ROOT, run_sh
from tests.train_data import DEV_SPEAKER, WORDS
from tests.train_fixtures import dirs

pytestmark = pytest.mark.slow


def stage3(prepared: Path, exp: str, *options: str, timeout: float = 900) -> subprocess.CompletedProcess:
    res = run_sh("--stage", "3", "--stop-stage", "3", *options, *dirs(prepared, exp), timeout=timeout)
    assert res.returncode == 0, res.stderr[-4000:]
    return res


def test_average_is_the_mean_of_the_fp32_master_weights(trained: Path, tmp_path: Path) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    exp = tmp_path / "exp"
    shutil.copytree(trained, exp, ignore=shutil.ignore_patterns("final", "decode_*"))
    res = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "local.average", "--exp-dir", str(exp),
                          "--num", "2"], cwd=ROOT, capture_output=True, text=True, env=CLEAN_ENV)
    assert res.returncode == 0, res.stderr[-3000:]
    saved = torch.load(exp / "model.pt" / "mp_rank_00_model_states.pt", weights_only=False)["saved_ckpts"]
    best = sorted(saved, key=saved.get)[:2]
    masters = [get_fp32_state_dict_from_zero_checkpoint(str(exp), tag=name) for name in best]
    copies = [torch.load(exp / name / "mp_rank_00_model_states.pt", weights_only=False)["module"]
              for name in best]
    got = torch.load(exp / "model.pt.avg2")
    off_grid = 0.0
    for key, value in got.items():
        if not value.is_floating_point():
            continue
        expected = (masters[0][key].double() + masters[1][key].double()) / 2
        assert torch.allclose(value.double(), expected, atol=1e-7), key
        bf16_mean = (copies[0][key].double() + copies[1][key].double()) / 2
        off_grid = max(off_grid, (value.double() - bf16_mean).abs().max().item())
    # The bf16 module copies round the masters: averaging them would give other weights.
    assert off_grid > 1e-4, off_grid


def test_stage3_scores_the_dev_set_and_writes_results(prepared: Path, trained: Path) -> None:
    res = stage3(prepared, "exp_ds")
    exp = trained
    for name in ("final/model.pt", "final/configuration.json", "final/.done", "RESULTS.md",
                 *(f"decode_dev/{f}" for f in ("hyp.txt", "ref.txt", "per_utt.txt", "result.txt",
                                              "result.json", "decode.json", "hyp_tags.tsv", ".done"))):
        assert (exp / name).exists(), name
    assert list(exp.glob("model.pt.avg*"))
    result = json.loads((exp / "decode_dev" / "result.json").read_text())
    n_dev = len(WORDS) * 5
    assert result["utterances"] == n_dev and not result["missing_hyp"]
    # 4 epochs on 400 utterances: far from good, but it has learnt the digits' words (random is ~100%).
    assert result["wer"]["rate"] < 0.8, result["wer"]
    assert result["tag_accuracy"]["language"] > 0.9, result["tag_accuracy"]
    refs = (exp / "decode_dev" / "ref.txt").read_text().splitlines()
    assert len(refs) == n_dev and all(line.split()[0].startswith(DEV_SPEAKER) for line in refs)
    results_md = (exp / "RESULTS.md").read_text()
    assert "| dev |" in results_md.replace("|dev|", "| dev |") and "RESULTS.md" in res.stderr
    decode = json.loads((exp / "decode_dev" / "decode.json").read_text())
    assert decode["processes"] == 2 and decode["rtf"] > 0
    # Rerun: everything is done.
    res = stage3(prepared, "exp_ds")
    assert "is averaged; skipping" in res.stderr and "decode_dev is scored; skipping" in res.stderr


def test_decode_dir_scores_a_users_kaldi_dir(prepared: Path, trained: Path, tmp_path: Path) -> None:
    mine = tmp_path / "my_test"
    mine.mkdir()
    src = prepared / "kaldi" / "dev"
    keys = sorted(line.split()[0] for line in (src / "text").read_text().splitlines())[:8]
    for name in ("wav.scp", "text", "utt2spk"):
        lines = [line for line in (src / name).read_text().splitlines() if line.split()[0] in keys]
        (mine / name).write_text("\n".join(lines) + "\n")
    stage3(prepared, "exp_ds", "--decode-dir", str(mine))
    out = trained / "decode_extra_my_test"
    result = json.loads((out / "result.json").read_text())
    assert result["utterances"] == 8 and result["set"] == "extra_my_test"
    assert sorted(line.split()[0] for line in (out / "ref.txt").read_text().splitlines()) == keys
    assert "extra_my_test" in (trained / "RESULTS.md").read_text()


def test_two_nodes_split_the_decoding_and_match_one_node(prepared: Path, trained: Path) -> None:
    one = (trained / "decode_dev" / "hyp.txt")
    if not one.exists():
        stage3(prepared, "exp_ds")
    single = one.read_text()
    shutil.rmtree(trained / "decode_dev")
    common = ["--stage", "3", "--stop-stage", "3", "--nnodes", "2", "--nproc-per-node", "1",
              "--master-addr", "127.0.0.1", *dirs(prepared, "exp_ds")]
    node1 = subprocess.Popen(["./run.sh", *common, "--node-rank", "1"], cwd=ROOT, env=CLEAN_ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    res0 = run_sh(*common, "--node-rank", "0", timeout=900)
    out1, err1 = node1.communicate(timeout=900)
    assert res0.returncode == 0, res0.stderr[-3000:]
    assert node1.returncode == 0, err1[-3000:]
    decode = json.loads((trained / "decode_dev" / "decode.json").read_text())
    assert decode["processes"] == 2
    assert sorted((trained / "decode_dev" / "shards").glob("*.done")) == [
        trained / "decode_dev" / "shards" / f"{r}.done" for r in (0, 1)]
    assert "[node1]" in err1 and "decoding" in err1
    assert (trained / "decode_dev" / "hyp.txt").read_text() == single


def test_finetune_results_show_the_pretrained_model_too(prepared: Path, finetuned: Path,
                                                         trained: Path) -> None:
    stage3(prepared, "exp_ft", "--config", "conf/sensevoice_small.yaml", "--pretrained-dir",
           str(trained / "model_dir"))
    before = json.loads((finetuned / "decode_dev_pretrained" / "result.json").read_text())
    after = json.loads((finetuned / "decode_dev" / "result.json").read_text())
    assert before["model"].startswith("pretrained") and after["model"].startswith("sensevoice_small")
    results_md = (finetuned / "RESULTS.md").read_text()
    assert before["model"] in results_md and after["model"] in results_md

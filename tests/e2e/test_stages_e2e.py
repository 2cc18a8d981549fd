"""Stages 0-5 end to end through run.sh on CPU, on a 400-utterance digit subset
(tests/helpers/train_fixtures.py).

``prepared`` runs stages 0-1 and ``trained`` stages 2-5 (16 epochs, DeepSpeed ZeRO-1 bf16, 2 ranks);
these tests check what they wrote, a loose error-rate bound, averaging against DeepSpeed's own fp32
masters, reruns, a user's Kaldi dir, two nodes on one machine for stages 0-3, and a fine-tune's
before/after results.

A CI-sized run (400 training utterances) reaches 24% WER on its 50 dev utterances, measured; the bound
is 50%, loose enough for another CPU's arithmetic and tight enough that a model which learned only the
SenseVoice tags (every digit deleted: 100%) fails. The demo's figure (7.8% on 500 utterances of the
unseen speaker) is measured by ``./run.sh`` (README).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.helpers.run_sh import CLEAN_ENV, ROOT, run_sh
from tests.helpers.train_data import DEV_SPEAKER, WORDS
from tests.helpers.train_fixtures import FAST, LEARN, dirs

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


def test_stages_2_to_5_write_every_artifact(prepared: Path, trained: Path) -> None:
    exp = trained
    stderr = (exp / "run.stderr").read_text()
    for n in range(2, 6):
        assert f"Stage {n}: " in stderr, n
    for name in ("final/model.pt", "final/configuration.json", "final/.done", "RESULTS.md",
                 *(f"decode_dev/{f}" for f in ("hyp.txt", "ref.txt", "per_utt.txt", "result.txt",
                                              "result.json", "decode.json", "hyp_tags.tsv", ".done")),
                 "export/model.onnx", "export/model_quant.onnx", "export/parity.json", "export/.done",
                 "package/README.md", "package.tar.gz", "benchmark.md", "benchmark.json"):
        assert (exp / name).exists(), name
    assert list(exp.glob("model.pt.avg*"))
    result = json.loads((exp / "decode_dev" / "result.json").read_text())
    n_dev = len(WORDS) * 5
    assert result["utterances"] == n_dev and not result["missing_hyp"]
    wer = result["wer"]
    assert wer["n_ref"] == n_dev and wer["sub"] + wer["del"] + wer["cor"] == n_dev  # every word scored
    assert wer["rate"] <= 0.5, wer  # the words were learned, not only the tags (measured: 24%)
    assert set(result["tag_accuracy"]) == {"language", "emotion", "event"}
    refs = (exp / "decode_dev" / "ref.txt").read_text().splitlines()
    assert len(refs) == n_dev and all(line.split()[0].startswith(DEV_SPEAKER) for line in refs)
    assert "| dev |" in (exp / "RESULTS.md").read_text()
    decode = json.loads((exp / "decode_dev" / "decode.json").read_text())
    assert decode["processes"] == 2 and decode["rtf"] > 0
    assert json.loads((exp / "export" / "parity.json").read_text())["pass"] is True
    assert f"on dev ({n_dev} utterances): WER" in stderr  # run.sh's closing summary
    # The recipe's performance targets are bench/bench_runtime.py's, not the user's run's.
    assert "MISSED" not in stderr and "Targets" not in (exp / "benchmark.md").read_text()
    # Rerun: everything is done, stages 4 and 5 included (they redid export, parity, benchmark and the
    # package on every rerun: 37 of 39 s).
    made = {name: (exp / name).stat().st_mtime_ns for name in ("export/model.onnx", "package.tar.gz",
                                                              "benchmark.json")}
    res = run_sh("--stage", "3", "--stop-stage", "5", *dirs(prepared, "exp_ds"), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "is averaged; skipping" in res.stderr and "decode_dev is scored; skipping" in res.stderr
    assert f"{exp}/export/.done is done for these inputs; skipping" in res.stderr
    assert f"{exp}/package.tar.gz is done for these inputs; skipping" in res.stderr
    assert {name: (exp / name).stat().st_mtime_ns for name in made} == made


def test_a_failed_average_stops_the_waiting_decoders_and_stage_3(prepared: Path, trained: Path) -> None:
    """Stage 3 starts the decode workers while it averages: when the averaging fails (here every epoch
    checkpoint is truncated) run.sh names it, stops the workers, which wait for final/.done, and exits 1
    at once instead of after their --wait-timeout."""
    exp = prepared / "exp_bad_average"
    shutil.copytree(trained, exp, ignore=shutil.ignore_patterns("final", "decode_*", "export", "package*"))
    for path in exp.glob("model.pt.ep*/*.pt"):
        path.write_bytes(path.read_bytes()[:100])
    res = run_sh("--stage", "3", "--stop-stage", "3", *dirs(prepared, exp.name), timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "not a readable torch checkpoint" in res.stderr  # names the file
    assert "averaging the checkpoints failed" in res.stderr
    assert not (exp / "final" / ".done").exists() and not list(exp.glob("decode_dev/shards/*.done"))
    left = subprocess.run(["pgrep", "-f", f"local.decode work .*{exp}"], capture_output=True, text=True)
    assert left.stdout == "", left.stdout  # no worker outlives run.sh


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


def test_two_nodes_run_stages_0_to_3_and_match_one_node(prepared: Path, trained: Path,
                                                         tmp_path: Path) -> None:
    """Two run.sh processes as nodes 0 and 1 (one process each, world size 2 as in ``trained``): node 1
    waits for node 0's stage 0, both compute features and train, decoding is split between them."""
    common = ["--stop-stage", "3", "--corpus", "kaldi", "--corpus-dir", str(prepared / "kaldi"),
              "--nnodes", "2", "--nproc-per-node", "1", "--nj", "1", "--master-addr", "127.0.0.1",
              *dirs(tmp_path, "exp_ds"), "--", *LEARN]
    # Node 1's output goes to a file, not a pipe: nobody reads a pipe until node 0 is done, and once
    # node 1 has written 64 KiB into it, it blocks, and so does the training of both nodes.
    with open(tmp_path / "node1.out", "w") as out:
        node1 = subprocess.Popen(["./run.sh", "--node-rank", "1", *common], cwd=ROOT, env=CLEAN_ENV,
                                 stdout=out, stderr=subprocess.STDOUT, text=True)
        res0 = run_sh("--node-rank", "0", *common, timeout=1500)
        node1.wait(timeout=1500)
    err1 = (tmp_path / "node1.out").read_text()
    assert res0.returncode == 0, res0.stderr[-3000:]
    assert node1.returncode == 0, err1[-3000:]
    assert "waiting for node 0 to finish stage 0" in err1 or "is done; skipping" in err1
    exp = tmp_path / "exp_ds"
    assert "[node1 rank1]" in (exp / "train.node1.log").read_text()
    assert sorted(p.name for p in (exp / "decode_dev" / "shards").glob("*.done")) == ["0.done", "1.done"]
    assert "decoding" in err1 and "[node1]" in err1
    # The same data, features and training as the one-node run: the same transcripts.
    for name in ("dev/data.jsonl", "train/data.jsonl"):
        assert (tmp_path / "data" / name).read_text() == (prepared / "data" / name).read_text(), name
    assert (exp / "decode_dev" / "hyp.txt").read_text() == (trained / "decode_dev" / "hyp.txt").read_text()


def test_finetune_results_show_the_pretrained_model_too(prepared: Path, finetuned: Path,
                                                         trained: Path) -> None:
    res = run_sh("--stage", "3", "--stop-stage", "3", "--config", "conf/sensevoice_small.yaml",
                 "--pretrained-dir", str(trained / "best_model"), *dirs(prepared, "exp_ft", "dump_ft"),
                 timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    before = json.loads((finetuned / "decode_dev_pretrained" / "result.json").read_text())
    after = json.loads((finetuned / "decode_dev" / "result.json").read_text())
    # Named by what they are (model/provenance.py): the tiny model, not the config it was fine-tuned with.
    base = (trained / "best_model").resolve()
    assert before["model"] == f"pretrained tiny_sensevoice.yaml ({base})"
    assert after["model"].startswith(f"tiny_sensevoice.yaml fine-tuned from {base}, ")
    results_md = (finetuned / "RESULTS.md").read_text()
    assert before["model"] in results_md and after["model"] in results_md
    assert "- config: conf/sensevoice_small.yaml\n" in results_md and "config tag" not in results_md


def test_conformer_ctc_family_runs_stages_1_to_5(prepared: Path) -> None:
    """The recipe's own family through run.sh: its stage-1 features (80-dim fbank, no LFR) and BPE
    tokenizer, training, averaging by validation loss, CTC decoding, its own ONNX export with parity
    (undertrained: the bound is the parity, not the error rate), package and benchmark."""
    res = run_sh("--stage", "1", "--stop-stage", "5", "--config", "conf/tiny_conformer_ctc.yaml",
                 *dirs(prepared, "exp_ctc", "dump_ctc"), "--", "++train_conf.max_epoch=3", *FAST,
                 timeout=1500)
    assert res.returncode == 0, res.stderr[-4000:]
    exp = prepared / "exp_ctc"
    # final is the average or, where the average scores worse on dev (or one checkpoint is left after
    # the far ones), the best checkpoint: either way the choice is recorded beside the weights.
    recipe = json.loads((exp / "final" / "configuration.json").read_text())["recipe"]
    assert recipe["checkpoint"] in recipe["averaged"] or recipe["checkpoint"].startswith("model.pt.avg")
    assert "why" in recipe["validation"] and len(list(exp.glob("model.pt.avg*"))) <= 1
    # The training set it came from, which a fine-tune with --regression-dir replays by default.
    assert recipe["train_data"] == str((prepared / "data" / "train").resolve())
    for name in ("final/model.pt", "decode_dev/result.json", "RESULTS.md", "curves.png",
                 "export/model.onnx", "export/model_quant.onnx", "export/parity.json", "package.tar.gz",
                 "benchmark.json"):
        assert (exp / name).exists(), name
    assert (prepared / "dump_ctc" / "tokenizer").is_dir()
    result = json.loads((exp / "decode_dev" / "result.json").read_text())
    assert result["utterances"] == len(WORDS) * 5 and not result["missing_hyp"]
    assert "tag_accuracy" not in result or not result["tag_accuracy"]  # CTC emits no SenseVoice tags
    parity = json.loads((exp / "export" / "parity.json").read_text())
    assert parity["pass"] is True
    assert json.loads((exp / "benchmark.json").read_text())["family"] == "ConformerCTC"
    results_md = (exp / "RESULTS.md").read_text()
    assert "| tiny_conformer_ctc.yaml from scratch, " in results_md  # the model, by model/provenance.py
    assert "- config: conf/tiny_conformer_ctc.yaml\n" in results_md

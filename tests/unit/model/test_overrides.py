"""The check run.sh makes before any stage (local/check_config.py over funasr_recipe/model/overrides.py): a
misspelled or mistyped trainer override, a run.sh option after ``--`` or a broken DeepSpeed JSON gives its
own line naming it, all of them at once; every override the repository itself writes passes; the check
takes under 2 s and imports neither torch nor funasr.

Reads conf/*.yaml, ds_configs/*.json, the repository's docs, configs, tests and benches (for the overrides
they write), funasr's installed sources; writes a model dir, JSON files and the scan's cache under tmp.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from funasr_recipe.model.overrides import Scan
from local.check_config import check_ds_config, check_overrides, configs, main

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "conf" / "tiny_sensevoice.yaml"
FINETUNE = ROOT / "conf" / "sensevoice_small.yaml"
OPTION_AFTER = "comes after --: run.sh options go before --, trainer overrides after"


@pytest.fixture(scope="module")
def scan(tmp_path_factory: pytest.TempPathFactory) -> Scan:
    return Scan(cache=tmp_path_factory.mktemp("cache") / "config_keys.json")


def problems(scan: Scan, overrides: list[str], config: Path = TINY,
             model_dir: Path | None = None) -> list[str]:
    ours, merged = configs(config, model_dir)
    return check_overrides(overrides, ours, merged, str(config.relative_to(ROOT)), scan)


def test_the_issues_examples_give_their_messages(scan: Scan) -> None:
    assert problems(scan, ["++dataset_conf.batchsize=8000"]) == [
        "unknown key dataset_conf.batchsize (did you mean dataset_conf.batch_size?)"]
    assert problems(scan, ["++train_conf.max_epochs=3"]) == [
        "unknown key train_conf.max_epochs (did you mean train_conf.max_epoch?)"]
    assert problems(scan, ["++optim_conf.lr=abc"]) == [
        "optim_conf.lr=abc: expected a number (the config has 0.002)"]


def test_every_problem_is_listed_in_the_overrides_order(scan: Scan) -> None:
    assert problems(scan, ["++dataset_conf.batchsize=8000", "++dataset_conf.batch_size=8000", "--stage",
                           "3", "++train_conf.max_epochs=3", "++optim_conf.lr=abc",
                           "++train_conf.max_epoch=15"]) == [
        "unknown key dataset_conf.batchsize (did you mean dataset_conf.batch_size?)",
        f"--stage 3 {OPTION_AFTER}",
        "unknown key train_conf.max_epochs (did you mean train_conf.max_epoch?)",
        "optim_conf.lr=abc: expected a number (the config has 0.002)"]


PARAFORMER = ROOT / "conf" / "tiny_paraformer.yaml"


@pytest.mark.parametrize("override, hint, config", [
    ("++seeed=1", "seed", TINY),
    ("++dataset_cof.batch_size=1", "dataset_conf.batch_size", TINY),
    ("++encoder_conf.output_sise=64", "encoder_conf.output_size", TINY),
    ("++frontend_conf.nmels=40", "frontend_conf.n_mels", TINY),
    ("++optim_conf.beta=0.9", "optim_conf.betas", TINY),  # AdamW's parameters, from torch's source
    # warmuplr's parameters: warmup_ratio is the recipe's warmup_cosine's
    ("++scheduler_conf.warmup_ratio=0.1", "scheduler_conf.warmup_steps", TINY),
    ("++build_tokenizer.vocab=16", "build_tokenizer.vocab_size", TINY),
    ("~dataset_conf.batchsize", "dataset_conf.batch_size", TINY),
    ("++train_conf.nonsense_key=1", None, TINY),
    # the model class's parameters: SenseVoice's has no ctc_weight, Paraformer's has
    ("++model_conf.ctc_weight=0.5", "model_conf.lsm_weight", TINY),
    ("++ctc_conf.dropout=0.1", "ctc_conf.dropout_rate", PARAFORMER),  # no ctc: the model's CTC(**ctc_conf)
    ("++predictor_conf.threshhold=1.0", "predictor_conf.threshold", PARAFORMER),
])
def test_an_unknown_key_is_named_with_the_closest_known_one(scan: Scan, override: str, hint: str | None,
                                                           config: Path) -> None:
    key = override.lstrip("+~").split("=")[0]
    assert problems(scan, [override], config) == [f"unknown key {key}" + (f" (did you mean {hint}?)" if hint
                                                                          else "")]


def test_keys_funasr_reads_that_the_config_lacks_are_accepted(scan: Scan) -> None:
    assert problems(scan, [
        "++seed=3", "++train_conf.use_bf16=true", "++train_conf.early_stopping_patience=3",
        "++dataset_conf.batch_size_sample_max=1000", "++dataset_conf.replay_ratio=0.5",
        "++dataset_conf.reuse_batch_memory=false", "++optim_conf.betas=[0.9,0.98]", "++optim_conf.lr=1",
        "++scheduler=warmup_cosine", "++scheduler_conf.warmup_ratio=0.1",  # the overrides' scheduler's
        "++specaug_conf.freq_mask_width_range=30",  # Union[int, Sequence[int]]: an int is right too
        "++train_conf.grad_clip=2.5",  # funasr's default is a float: the config's 5 is a number
        "++freeze_param=encoder", "++init_param=/x/model.pt", "++hydra.run.dir=/tmp/x",
        "++frontend_conf.cmvn_file=/x/am.mvn", "++model_conf.lsm_weight=0",
        "++dataset_conf={batch_size: 2000, num_workers: 2}"]) == []


@pytest.mark.parametrize("override, message", [
    ("++train_conf.max_epoch=3.5", "train_conf.max_epoch=3.5: expected an integer (the config has 12)"),
    ("++dataset_conf.shuffle=1", "dataset_conf.shuffle=1: expected true or false (the config has true)"),
    ("++optim_conf.betas=0.9", "optim_conf.betas=0.9: expected a list (the default is [0.9, 0.999])"),
    ("++seed=abc", "seed=abc: expected an integer (the default is 0)"),
    ("++optim_conf.lr=", "optim_conf.lr=: expected a number (the config has 0.002)"),
    ("++dataset_conf=5", "dataset_conf=5: expected a mapping"),
    ("++dataset_conf={batch_size: lots}",
     'dataset_conf.batch_size="lots": expected an integer (the config has 3000)'),
])
def test_a_value_of_the_wrong_type_is_named(scan: Scan, override: str, message: str) -> None:
    assert problems(scan, [override]) == [message]


def test_what_hydra_itself_refuses_is_named(scan: Scan) -> None:
    where = "conf/tiny_sensevoice.yaml"
    assert problems(scan, ["+train_conf.max_epoch=3", "train_conf.early_stopping_patience=3",
                           "~train_conf.use_bf16", "++seed=1,2"]) == [
        f"+train_conf.max_epoch=3: {where} already has train_conf.max_epoch: write ++train_conf.max_epoch=3 "
        "to change it",
        f"train_conf.early_stopping_patience=3: {where} has no train_conf.early_stopping_patience: write "
        "++train_conf.early_stopping_patience=3 to add it",
        f"~train_conf.use_bf16: {where} has no train_conf.use_bf16 to delete",
        "++seed=1,2: several values need Hydra's --multirun, which stage 2 does not use (a list: [a,b])"]
    assert problems(scan, ["+seed=1", "train_conf.max_epoch=3", "~dataset_conf.max_token_length"]) == []


def test_a_syntax_error_names_its_override(scan: Scan) -> None:
    assert problems(scan, ["++dataset_conf.replay_list=[a,b", "seed", "++seed=2"]) == [
        "++dataset_conf.replay_list=[a,b: no viable alternative at input '[a,b' (Hydra's override grammar)",
        "seed: missing EQUAL at '<EOF>' (Hydra's override grammar)"]


def test_a_run_sh_option_after_the_separator_is_named_with_its_value(scan: Scan) -> None:
    assert problems(scan, ["++train_conf.max_epoch=3", "--stage", "3", "--stop-stage=4", "++seed=1",
                           "--nj"]) == [
        f"--stage 3 {OPTION_AFTER}", f"--stop-stage=4 {OPTION_AFTER}", f"--nj {OPTION_AFTER}"]


def test_a_fine_tune_is_checked_against_the_model_dirs_config(scan: Scan, tmp_path: Path) -> None:
    """funasr merges the model dir's config.yaml under ours: its keys are the config's, and a plain
    ``key=`` on one of them is what Hydra refuses (Hydra composes our file alone)."""
    from funasr_recipe.families.registry import SENSEVOICE
    from funasr_recipe.model.released import released_path

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.yaml").write_text(released_path(SENSEVOICE.released).read_text().replace(
        "num_blocks: 50", "num_blocks: 30"))
    for model_dir in (model, None):  # None: the released architecture the recipe records
        blocks = 30 if model_dir else 50
        assert problems(scan, ["++encoder_conf.output_sise=64", "encoder_conf.output_size=256",
                               f"++model={model}", "++encoder_conf.num_blocks=x",
                               "++encoder_conf.tp_blocks=10", "++dataset_conf.batch_size=8000"],
                        FINETUNE, model_dir) == [
            "unknown key encoder_conf.output_sise (did you mean encoder_conf.output_size?)",
            "encoder_conf.output_size=256: conf/sensevoice_small.yaml has no encoder_conf.output_size: write "
            "++encoder_conf.output_size=256 to add it",
            f"encoder_conf.num_blocks=x: expected an integer (the config has {blocks})"]
    with pytest.raises(ValueError, match="--pretrained-dir .*nowhere: no such directory"):
        configs(FINETUNE, tmp_path / "nowhere")


# Overrides written with another config than conf/tiny_sensevoice.yaml (conf/*.yaml: their own), by file,
# and by key where one file uses several.
CONFIG_OF = {"tests/unit/compat/test_finetune_train.py": FINETUNE, "tests/e2e/test_finetune_e2e.py": FINETUNE,
             "bench/gpu/check.sh": FINETUNE, "bench/bench_forgetting.py": FINETUNE,
             "bench/bench_adapt.py": FINETUNE, "tests/unit/bench/test_bench_adapt.py": FINETUNE,
             ("tests/unit/features/test_stage1_robustness.py", "++model_conf.ctc_weight"):
                 ROOT / "conf" / "tiny_paraformer.yaml",
             ("tests/unit/features/test_stage1_robustness.py", "++encoder_conf.input_layer"):
                 ROOT / "conf" / "tiny_conformer_ctc.yaml"}
NOT_KEYS = {("tests/unit/bench/test_bench_seeds.py", "++a")}  # a stand-in in a table's caption, not a key
THIS = {"tests/unit/model/test_overrides.py", "tests/unit/features/test_cmvn_errors.py"}  # bad on purpose
OVERRIDE = re.compile(r"(?<![\w+\-])(\+\+?[A-Za-z_][\w.]*)=([^\s\"'`,)\]]*)")


def written_overrides() -> dict[Path, list[str]]:
    """config -> every ``++key=value`` / ``+key=value`` the docs, configs, Slurm script, tests and benches
    write (a placeholder value, ``{epochs}``, ``${batch}``, ``<dir>``, ``N``, or one cut off by quoting, as
    null: its key is checked, not its type)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "README.md",
                             "docs/*.md", "recipes/*.md", "conf", "slurm", "tests/*.py", "bench"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found: dict[Path, list[str]] = {}
    for rel in sorted(set(listed) - THIS):
        if not (ROOT / rel).is_file() or rel.endswith((".pyc", ".json", ".png", ".jsonl")):
            continue
        for line in (ROOT / rel).read_text(encoding="utf-8", errors="replace").splitlines():
            for key, value in OVERRIDE.findall(line):
                value = value.rstrip(".")  # a sentence's full stop
                if (rel, key) in NOT_KEYS:
                    continue
                if not value or re.search(r"[{}$<>\[]", value) or re.fullmatch(r"[A-Z]", value):
                    # ++model=<dir>: a model dir, as check_config tells it apart (a "/"); as null it
                    # would name no class and hide every key only the config's class reads.
                    value = "/placeholder/model_dir" if key.lstrip("+") == "model" else "null"
                config = CONFIG_OF.get((rel, key), CONFIG_OF.get(rel, ROOT / rel if rel.startswith("conf/")
                                                                   else TINY))
                found.setdefault(config, []).append(f"{key}={value}")  # type: ignore[arg-type]
    return found


def test_every_override_the_repository_writes_is_accepted(scan: Scan) -> None:
    """No false rejection: the check may not refuse what the README, the docs, the configs, the Slurm script,
    the tests and the benches tell to write."""
    found = written_overrides()
    assert sum(map(len, found.values())) > 100  # the collection itself works
    assert {c.name for c in found} >= {"tiny_sensevoice.yaml", "sensevoice_small.yaml", PARAFORMER.name}
    for config, overrides in found.items():
        assert problems(scan, overrides, config) == [], config


def test_a_ds_config_is_checked(tmp_path: Path) -> None:
    for shipped in sorted((ROOT / "ds_configs").glob("*.json")):
        check_ds_config(shipped)
    bad = tmp_path / "ds.json"
    bad.write_text('{\n  "train_batch_size": 8,\n  "zero_optimization": {"stage": 2,}\n}\n')
    with pytest.raises(ValueError) as e:
        check_ds_config(bad)
    assert str(e.value) == f"{bad}:3:36: not valid JSON: Expecting property name enclosed in double quotes"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 4}}))
    with pytest.raises(ValueError, match=r"ds.json: zero_optimization.stage is 4: DeepSpeed's ZeRO "
                                         r"stages are 0, 1, 2, 3$"):
        check_ds_config(bad)
    bad.write_text("[1]")
    with pytest.raises(ValueError, match="a DeepSpeed config is a JSON object, not list"):
        check_ds_config(bad)


def test_the_program_exits_2_with_one_line_per_problem(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bad = tmp_path / "ds.json"
    bad.write_text('{"zero_optimization": {"stage": 1}')
    assert main(["--config", str(TINY), "--ds-config", str(bad), "--", "++dataset_conf.batchsize=8000",
                 "++train_conf.max_epochs=3", "--stage", "3"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("] ", 2)[-1] for line in lines] == [
        "unknown key dataset_conf.batchsize (did you mean dataset_conf.batch_size?)",
        "unknown key train_conf.max_epochs (did you mean train_conf.max_epoch?)",
        f"--stage 3 {OPTION_AFTER}",
        f"{bad}:1:35: not valid JSON: Expecting ',' delimiter"]
    assert main(["--config", str(TINY), "--ds-config", str(ROOT / "ds_configs" / "ds_stage1_bf16.json"), "--",
                 "++dataset_conf.batch_size=8000", "++train_conf.max_epoch=15"]) == 0
    assert capsys.readouterr().err == ""  # silent when all is well


def test_a_recipe_keys_value_is_checked_before_any_stage(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``feats_storage`` and ``feats_augment`` are known (model/config.py reads them), and a value or a key
    stage 1 would refuse is named."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(["--config", str(TINY), "--", "++feats_storage=uint16"]) == 0
    assert main(["--config", str(FINETUNE), "--", "++feats_storage=float32"]) == 0
    assert main(["--config", str(TINY), "--", "++feats_augment.reverb_prob=0.3",
                 "++feats_augment.gain_db=[-6,6]"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["--config", str(TINY), "--", "++feats_storage=float16"]) == 2
    assert "feats_storage: 'float16' is not a feature storage; expected one of float32, uint16" in \
        capsys.readouterr().err
    assert main(["--config", str(TINY), "--", "++feats_augment.reverb_probability=0.3"]) == 2
    assert "feats_augment.reverb_probability: not a key of feats_augment; expected one of gain_db, " \
        "noise_prob, reverb_prob, rt60_s, seed, snr_db" in capsys.readouterr().err


def test_the_check_is_fast_and_imports_neither_torch_nor_funasr(tmp_path: Path) -> None:
    """run.sh runs it first on every node: under 2 s with the scan cached, torch and funasr never imported
    (``python -X importtime -m local.check_config ...`` shows what it imports)."""
    code = ("import sys; from local.check_config import main; rc = main(sys.argv[1:]); "
            "print(rc, 'torch' in sys.modules, 'funasr' in sys.modules)")
    argv = [sys.executable, "-c", code, "--config", str(TINY), "--ds-config",
            str(ROOT / "ds_configs" / "ds_stage1_bf16.json"), "--", "++dataset_conf.batch_size=8000"]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    first = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert first.stdout.split() == ["0", "False", "False"], first.stderr
    assert (tmp_path / "funasr_recipe" / "config_keys.json").is_file()
    start = time.monotonic()
    cached = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert cached.stdout.split() == ["0", "False", "False"], cached.stderr
    assert elapsed < 2.0, f"the check took {elapsed:.2f} s"


def test_a_train_conf_key_deepspeed_ignores_must_agree_with_its_json(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Under DeepSpeed, funasr's trainer leaves accumulation and clipping to the engine, which reads them
    from its JSON: an override of train_conf.accum_grad or grad_clip alone would be read by nobody."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shipped = ROOT / "ds_configs" / "ds_stage1_bf16.json"
    assert main(["--config", str(TINY), "--ds-config", str(shipped)]) == 0  # the shipped pairs agree
    assert main(["--config", str(TINY), "--ds-config", str(shipped), "--", "++train_conf.accum_grad=4",
                 "++train_conf.grad_clip=1.0"]) == 2
    lines = [line.split("] ", 2)[-1] for line in capsys.readouterr().err.splitlines()]
    assert any(line.startswith("train_conf.accum_grad=4: under DeepSpeed funasr's trainer does not read it")
               and "gradient_accumulation_steps (1) decides" in line for line in lines), lines
    accumulating = tmp_path / "ds.json"
    accumulating.write_text(json.dumps({**json.loads(shipped.read_text()), "gradient_accumulation_steps": 4}))
    assert main(["--config", str(TINY), "--ds-config", str(accumulating), "--",
                 "++train_conf.accum_grad=4"]) == 0

"""The trainer hooks while training runs: the Prometheus endpoint scraped over loopback during a short
CPU training (with activation checkpointing and the warmup-cosine schedule), the out-of-memory probe
stopping a batch over a memory limit, the Grafana dashboard against what the endpoint serves, and the
pieces as units."""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from funasr_recipe.compat.patching import replace
from funasr_recipe.reports.curves import parse_log
from funasr_recipe.train.collectives import CollectiveTimer
from funasr_recipe.train.memory import advice, largest_batches, model_states
from funasr_recipe.train.metrics import PREFIX, Exporter, StepMeter, log_line, served_metric_names
from funasr_recipe.train.zero import ZeroSettings
from tests.helpers.run_sh import ROOT, run_sh
from tests.helpers.train_fixtures import FAST, dirs, free_port

# A normal batch of the tiny SenseVoice peaks near 1.5 GiB of RSS per CPU process (the process itself is
# most of it); the probe's limit in both runs below sits between that and what the huge batch needs.
LIMIT_GIB = "2.5"


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if not s.labels or s.name.endswith("_info")}


class Scraper(threading.Thread):
    """Scrapes the endpoint every `every` seconds until stopped; keeps what it got."""

    def __init__(self, port: int, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.port, self.every, self.samples, self.stop = port, every, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.samples.append(scrape(self.port))
            except OSError:
                pass  # not serving yet, or already gone
            self.stop.wait(self.every)


def test_metrics_endpoint_moves_during_a_short_training(prepared: Path) -> None:
    port = free_port()
    scraper = Scraper(port)
    scraper.start()
    epochs = 2
    res = run_sh("--stage", "2", "--stop-stage", "2", "--metrics-port", str(port),
                 "--grad-checkpoint", "true", "--memory-limit-gib", LIMIT_GIB,
                 *dirs(prepared, "exp_metrics"), "--",
                 f"++train_conf.max_epoch={epochs}", *FAST, "++scheduler=warmup_cosine",
                 "++scheduler_conf.warmup_steps=6", "++scheduler_conf.final_lr_ratio=0.1", timeout=900)
    scraper.stop.set()
    scraper.join()
    assert res.returncode == 0, res.stderr[-4000:]
    exp = prepared / "exp_metrics"
    log = (exp / "train.log").read_text()
    got = [s for s in scraper.samples if s.get(PREFIX + "step", 0) > 0]
    assert len(got) >= 3, f"{len(scraper.samples)} scrapes, {len(got)} after the first step"
    steps = [s[PREFIX + "step"] for s in got]
    assert steps == sorted(steps) and steps[-1] > steps[0], steps
    assert len({s[PREFIX + "loss"] for s in got}) > 1, "the loss never moved"
    assert all(0.0 <= s[PREFIX + "data_wait_fraction"] <= 1.0 for s in got)
    assert all(s[PREFIX + "utterances_per_second"] > 0 and s[PREFIX + "frames_per_second"] > 0 for s in got)
    assert any(s[PREFIX + "allreduce_seconds"] > 0 for s in got), "no gradient collective was timed"
    assert all(math.isfinite(s[PREFIX + "grad_norm"]) for s in got)
    assert got[-1][PREFIX + "node_info"] == 1.0
    # Activation checkpointing was on, and the probe ran the largest batches under the limit.
    assert "grad checkpointing: 5 encoder blocks" in log
    probes = re.findall(r"OOM probe, batch with the most padded frames: .* of 2.50 GiB", log)
    assert len(probes) == 2  # 2 ranks
    # The schedule: linear warmup to the peak, then cosine to 10% of it at the last step of the last epoch.
    curves = parse_log(exp / "train.log")
    per_epoch = int(re.search(r"step_in_slice: \d+/(\d+)", log).group(1))
    total, peak = epochs * per_epoch, 0.002
    # funasr logs the lr after the step's scheduler.step(): the one of the next step. 4 digits.
    for logged, lr in zip(curves.step, curves.lr, strict=True):
        step = logged + 1
        if step <= 6:
            want = peak * step / 6
        else:
            want = peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - 6) / (total - 6)))))
        assert lr == pytest.approx(want, rel=2e-3, abs=1e-9), (step, lr, want)
    # The schedule's state is in DeepSpeed's checkpoint, so a resumed run continues the same curve.
    state = torch.load(next((exp / "model.pt").glob("*model_states.pt")), map_location="cpu",
                       weights_only=True)["lr_scheduler"]
    assert state["total_steps"] == total and state["warmup_steps"] == 6


def test_oom_probe_stops_a_batch_over_the_memory_limit_with_advice(prepared: Path) -> None:
    start = time.monotonic()
    # The clock runs from run.sh's start: start-up, model build and the probe. The preflight is tested
    # elsewhere and skipped here.
    res = run_sh("--stage", "2", "--stop-stage", "2", "--nproc-per-node", "1", "--preflight", "false",
                 "--memory-limit-gib", LIMIT_GIB,
                 *dirs(prepared, "exp_oom"), "--", "++dataset_conf.batch_size=200000",
                 "++dataset_conf.batch_size_sample_max=1000",
                 "++dataset_conf.max_token_length=200000", timeout=300)
    elapsed = time.monotonic() - start
    assert res.returncode == 1, res.stderr[-3000:]
    assert elapsed < 60, f"the probe took {elapsed:.0f}s to fail"
    m = re.search(r"needs ([\d.]+) GiB, over the limit of 2.50 GiB per process. To fit: lower "
                  r"\+\+dataset_conf.batch_size \(now 200000; about (\d+) would fit\)", res.stderr)
    assert m, res.stderr[-3000:]
    assert float(m.group(1)) > 2.5 and int(m.group(2)) < 200000
    assert "--grad-checkpoint true" in res.stderr and "ZeRO-2" in res.stderr
    assert "does not fit in memory" in res.stderr  # run.sh's pointer
    assert "WARNING: --preflight false" in res.stderr
    assert not list((prepared / "exp_oom").glob("model.pt*")), "training started anyway"


def test_grafana_dashboard_plots_only_served_metrics() -> None:
    dashboard = json.loads((ROOT / "monitoring" / "grafana_dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    plotted = set(re.findall(rf"\b({PREFIX}\w+)", " ".join(exprs)))
    served = set(served_metric_names())
    assert plotted and plotted <= served, plotted - served
    assert {n for n in served if not n.endswith("_info")} <= plotted, "served but not on the dashboard"
    assert "funasr-recipe" in (ROOT / "monitoring" / "prometheus.yml").read_text()


def test_exporter_serves_every_metric_name() -> None:
    port = free_port()
    exporter = Exporter(port, node_rank=3, host="127.0.0.1")
    try:
        meter = StepMeter(step=7, loss=2.5, learning_rate=1e-3)
        meter.batch(utterances=4, frames=400)
        meter.step_done(data_wait_s=0.1, step_s=0.5)
        exporter.update(meter.snapshot())
        got = scrape(port)
    finally:
        exporter.close()
    assert got[PREFIX + "step"] == 7 and got[PREFIX + "loss"] == 2.5
    assert got[PREFIX + "data_wait_fraction"] == pytest.approx(0.2)
    assert {n for n in served_metric_names() if not n.startswith(PREFIX + "gpu_")} <= set(got)


def test_step_meter_rates_and_the_log_line_the_plot_reads(tmp_path: Path) -> None:
    meter = StepMeter(step=40, epoch=1, loss=3.0, learning_rate=2e-4, grad_norm=1.5)
    meter.batch(utterances=10, frames=1000)
    meter.step_done(data_wait_s=0.05, step_s=0.5)
    meter.step_done(data_wait_s=0.05, step_s=0.5)
    snap = meter.snapshot()
    assert snap["data_wait_fraction"] == pytest.approx(0.1) and snap["step_seconds"] == pytest.approx(0.5)
    assert snap["utterances_per_second"] > 0 and math.isnan(snap["allreduce_seconds"])
    assert meter.snapshot()["utterances_per_second"] == 0  # a new interval
    line = log_line(snap)
    log = tmp_path / "train.log"
    log.write_text(f"2026-12-01 11:19:03,731 INFO [node0 rank0] [hooks.py:1] {line}\n")
    curves = parse_log(log)
    assert curves.metric_step == [40] and curves.data_wait == [pytest.approx(0.1)]
    assert json.loads(line.split(": ", 1)[1])["allreduce_s"] is None


def test_largest_batches_and_advice() -> None:
    lengths = {0: 10, 1: 300, 2: 50, 3: 50, 4: 50, 5: 50}
    batches = largest_batches([[0], [1], [2, 3, 4, 5]], lengths.__getitem__)
    assert [(b.why, b.indices, b.padded_frames, b.longest) for b in batches] == [
        ("most padded frames", [1], 300, 300)]
    batches = largest_batches([[0, 1], [2, 3, 4, 5] * 4], lengths.__getitem__)  # 600 vs 800 padded
    assert [b.why for b in batches] == ["most padded frames", "longest utterance"]
    assert "about 4500 would fit" in advice(10000, 0.5) and "about 5000 would fit" in advice(10000, None)


def test_model_states_follow_deepspeeds_estimators() -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(500, 500) for _ in range(8)])
    p = 8 * 250_500
    z2 = model_states(model, ZeroSettings(2), nproc_per_node=4, nnodes=2)
    assert z2.params == p and z2.bytes_per_gpu == 2 * p + int(18 * p / 8)
    z1 = model_states(model, ZeroSettings(1), nproc_per_node=4, nnodes=2)
    assert z1.bytes_per_gpu == z2.bytes_per_gpu + int(2 * p * (1 - 1 / 8))
    # ZeRO-3 holds one gathered layer whole (4 bytes per parameter) instead of all 16-bit weights.
    zero3 = model_states(model, ZeroSettings(3), nproc_per_node=4, nnodes=2)
    assert zero3.bytes_per_gpu == 4 * 250_500 + int(18 * p / 8)
    # ... and with everything offloaded, only that layer (tests/unit/train/test_zero.py: every row).
    assert model_states(model, ZeroSettings(3, True, True), 4, 2).bytes_per_gpu == 4 * 250_500


def test_collective_timer_times_gloo_all_reduce() -> None:
    import torch.distributed as dist

    timer = CollectiveTimer()
    original = dist.all_reduce
    timer.install(replace)
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        timer.reset()
        dist.all_reduce(torch.ones(1 << 20))
        assert timer.seconds() > 0
        timer.reset()
        assert timer.seconds() == 0
    finally:
        dist.destroy_process_group()
        dist.all_reduce = original
        for name in ("reduce_scatter_tensor", "all_gather_into_tensor"):
            setattr(dist, name, getattr(getattr(dist, name), "__wrapped__", getattr(dist, name)))


def test_probe_leaves_the_model_as_it_was_and_reports_oom() -> None:
    from funasr_recipe.train.memory import ProbeBatch, probe

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 1))
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = ProbeBatch("most padded frames", list(range(512)), 512, 1)
    results = probe(model, [batch], lambda idx: {"x": torch.randn(len(idx), 8)},
                    lambda b: model(b["x"]).pow(2).mean(), torch.device("cpu"))
    assert results[0].peak_bytes >= results[0].base_bytes > 0
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "weights or BatchNorm statistics changed"
    assert all(p.grad is None for p in model.parameters()) and not model.training

    def out_of_memory(b: dict) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
    assert probe(model, [batch], lambda idx: {}, out_of_memory, torch.device("cpu"))[0].peak_bytes is None


def test_alerts_follow_the_monitoring_table() -> None:
    from funasr_recipe.train.metrics import alerts

    healthy = {"data_wait_fraction": 0.02, "allreduce_seconds": 0.05}
    assert alerts(healthy, gpu_memory_fraction=0.5, gpu_utilisation=0.85) == {}
    assert alerts({"data_wait_fraction": math.nan, "allreduce_seconds": math.nan}) == {}
    bad = alerts({"data_wait_fraction": 0.4, "allreduce_seconds": 0.9}, gpu_memory_fraction=0.9,
                 gpu_utilisation=0.3)
    assert set(bad) == {"data_wait", "allreduce", "gpu_memory", "gpu_util"}
    assert "40% of step time waits for data" in bad["data_wait"] and "num_workers" in bad["data_wait"]

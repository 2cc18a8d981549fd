"""Stage 5's runtime benchmark: latency, throughput and RTF of each runtime, end to end from audio file to
text, all in this one process and on the same utterances (local/bench_runtime.py writes the report).

Rows, in batches of 1, 8 and 32 by default:
  pytorch          funasr's AutoModel.generate on the paths (PyTorch eager; model/inference.py)
  funasr_onnx      funasr-onnx's class for the family, fp32 and int8 (none for ConformerCTC: funasr-onnx
                   has no CTC-only class)
  ours             runtime/onnx_asr.py, the recipe's runtime, fp32 and int8
  sherpa_onnx      sherpa-onnx's SenseVoice recogniser (runtime/sherpa_onnx_runtime.py) on the same ONNX
                   files with the same threads, fp32 and int8 (SenseVoiceSmall only; CPU only here)
on CPU, and on CUDA where torch (and, for the ONNX rows, onnxruntime) has it. The set is ``max_utts``
utterances spread evenly over the data.jsonl (every digit and length of a sorted set, not its first
lines). Each (runtime, batch) is warmed up on its first batch, then timed per batch on LATENCY_CALLS
batches spread over the set (all of them where there are fewer), the runtimes taking turns every 16
utterances or 4 batches (so that all of them see the same load on a shared machine): latency p50/p95
is per call with one batch (per utterance at batch 1). Throughput and RTF are of calls that hand a
runtime the whole set to transcribe in batches of that size (STREAM_ROUNDS rounds, the runtimes taking
turns, in reverse order every other round so that a load that rises or falls meanwhile favours none):
utterances / seconds and seconds / audio seconds; a runtime may overlap its batches (ours computes the
next batch's features and the last one's texts while onnxruntime runs). Stage 5 runs 100 utterances,
once (--repeats 1, about 25 s on the demo's 2 cores); bench/bench_runtime.py, whose figures the README
quotes, runs 200 twice. Texts are compared with AutoModel's at the same batch:
"same text" is the fraction identical (sherpa-onnx drops SenseVoice's tags: its texts are compared
with AutoModel's without them). The benchmark's own targets (``targets``: ours fp32 >= 2.5x AutoModel's
throughput at batch 1, ours int8 >= 3x at batch 8) are judged only when asked for (bench/bench_runtime.py,
local/bench_runtime.py --targets): they are the recipe's performance goals, not the user's, so stage 5's
report and the model card that embeds it carry the table alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from funasr_recipe.core.log import Progress
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.manifest import read_utterances
from funasr_recipe.data.tags import strip_tags
from funasr_recipe.features.audio import AudioError, is_pipe, probe_audio
from funasr_recipe.runtime.funasr_onnx_runtime import load_funasr_onnx, runtime_text
from funasr_recipe.runtime.onnx_asr import OnnxASR, export_family
from funasr_recipe.runtime.sherpa_onnx_runtime import SherpaASR

log = logging.getLogger(__name__)
TARGETS = ({"name": "ours_fp32_vs_pytorch_batch1", "runtime": "ours", "precision": "fp32", "batch": 1,
            "min_ratio": 2.5},
           {"name": "ours_int8_vs_pytorch_batch8", "runtime": "ours", "precision": "int8", "batch": 8,
            "min_ratio": 3.0})
LABELS = {"pytorch": "PyTorch eager (funasr AutoModel.generate)",
          "funasr_onnx": "funasr-onnx", "ours": "recipe ONNX runtime (funasr_recipe.runtime.onnx_asr)",
          "sherpa_onnx": "sherpa-onnx (OfflineRecognizer.from_sense_voice)"}
TAGLESS = {"sherpa_onnx"}  # runtimes whose texts carry no SenseVoice tags
BLOCK_UTTS = 16
BLOCK_BATCHES = 4
SETTLE_S = 0.05
STREAM_ROUNDS = 2  # whole-set passes per runner and --repeats, in turns (load on a shared machine varies)
# Timed calls per row for latency (and per --repeats): p50/p95 of 16 calls; more calls add time, not
# information, on a set of hundreds (at batch 1 the whole set would be 100-200 calls).
LATENCY_CALLS = 16
Runner = Callable[[list[str], list[str], int], list[str]]


def pytorch_runner(model_dir: Path, device: str, threads: int) -> Runner:
    """AutoModel.generate on paths: funasr reads, resamples and featurises the audio itself (with ``threads``
    torch threads: AutoModel sets them from its ncpu)."""
    from funasr_recipe.model.inference import TorchASR

    asr = TorchASR(model_dir, device, threads)

    def run(paths: list[str], keys: list[str], batch: int) -> list[str]:
        return asr.transcribe(paths, keys, batch)
    return run


def funasr_onnx_runner(export_dir: Path, family: str, quantize: bool, device: str, threads: int) -> Runner:
    if device != "cpu":
        raise RuntimeError("funasr-onnx rows run on CPU only here")
    try:
        runtime = load_funasr_onnx(export_dir, family, quantize, threads)
    except BadInputError as e:  # a family funasr-onnx has no class for: this row cannot run
        raise RuntimeError(str(e)) from None

    def run(paths: list[str], keys: list[str], batch: int) -> list[str]:
        runtime.batch_size = batch
        texts = [runtime_text(r) for r in runtime(paths)]
        # funasr-onnx's Paraformer drops a batch onnxruntime rejects (too short) instead of returning "".
        return texts if len(texts) == len(paths) else [""] * len(paths)
    return run


def ours_runner(export_dir: Path, quantize: bool, device: str, threads: int) -> Runner:
    runtime = OnnxASR(export_dir, quantize=quantize, threads=threads, device=device)

    def run(paths: list[str], keys: list[str], batch: int) -> list[str]:
        runtime.batch_size = batch
        return runtime(paths)
    return run


def sherpa_onnx_runner(export_dir: Path, quantize: bool, device: str, threads: int) -> Runner:
    """sherpa-onnx on the same files. It is handed the paths' audio read and resampled to the model's
    rate by the recipe (SherpaASR), as the recipe's runtime and AutoModel resample, so that it sees the
    samples they see: its own resampler is another filter (funasr-onnx's soxr, another again, changes
    transcripts), and the row would compare resamplers rather than runtimes. That reading and
    resampling is timed with it, as in ours."""
    if device != "cpu":
        raise RuntimeError("sherpa-onnx rows run on CPU only here")
    runtime = SherpaASR(export_dir, quantize=quantize, threads=threads)  # RuntimeError when it would not load

    def run(paths: list[str], keys: list[str], batch: int) -> list[str]:
        runtime.batch_size = batch
        return runtime(paths)
    return run


def runners(export_dir: Path, model_dir: Path, family: str, device: str,
            threads: int) -> tuple[list[tuple[str, str, Runner]], list[str]]:
    """[(runtime, precision, runner)] that load on ``device``, and a note for each that does not."""
    makers = [("pytorch", "fp32", lambda: pytorch_runner(model_dir, device, threads))]
    for precision, quantize in (("fp32", False), ("int8", True)):
        makers.append(("funasr_onnx", precision,
                       lambda q=quantize: funasr_onnx_runner(export_dir, family, q, device, threads)))
        makers.append(("ours", precision, lambda q=quantize: ours_runner(export_dir, q, device, threads)))
        makers.append(("sherpa_onnx", precision,
                       lambda q=quantize: sherpa_onnx_runner(export_dir, q, device, threads)))
    out, notes = [], []
    for name, precision, make in makers:
        try:
            out.append((name, precision, make()))
        except RuntimeError as e:
            notes.append(f"{name} {precision} on {device}: not run ({e})")
            log.warning("%s", notes[-1])
    return out, notes


def spread(items: list, k: int | None) -> list:
    """``k`` of ``items`` evenly spaced from the first (all of them when there are no more than k)."""
    n = len(items)
    return list(items) if not k or n <= k else [items[i * n // k] for i in range(k)]


def benchmark_set(data_jsonl: Path, max_utts: int | None) -> tuple[list[dict], float]:
    """``max_utts`` utterances with audio files spread over the set (pipes left out: funasr-onnx takes
    paths; an unreadable file too) and their seconds."""
    utts = []
    for u in spread([u for u in read_utterances(data_jsonl, None) if not is_pipe(u["source"])], max_utts):
        try:
            u["seconds"] = probe_audio(u["source"]).duration
        except AudioError as e:  # stage 0 rejects these; a data.jsonl edited since may hold one
            log.warning("%s: %s; left out of the benchmark", u["key"], e)
            continue
        utts.append(u)
    if not utts:
        raise BadInputError(f"{data_jsonl}: no utterance with an audio file to benchmark on")
    return utts, sum(u["seconds"] for u in utts)


def measure(loaded: list[tuple[str, str, Runner]], utts: list[dict], batch: int,
            repeats: int) -> list[list[float]]:
    """Per-batch latencies in seconds of each runner, on LATENCY_CALLS batches spread over ``utts``.

    The runners take turns every BLOCK_UTTS utterances (BLOCK_BATCHES batches at least), so that all
    of them run under the same load (others' processes come and go on a shared machine) while each
    keeps its caches warm across a few consecutive batches, as a server running one model would.
    Before each turn, SETTLE_S untimed: the previous runner's idle threads (onnxruntime's and
    OpenMP's spin after each call) would otherwise take the cores from the next, which no deployment
    of one runtime sees.
    """
    chunks = spread([utts[i:i + batch] for i in range(0, len(utts), batch)], LATENCY_CALLS)
    per_block = max(-(-BLOCK_UTTS // batch), BLOCK_BATCHES)  # the first batch of a turn finds caches cold
    blocks = [chunks[i:i + per_block] for i in range(0, len(chunks), per_block)]
    results: list[list[float]] = [[] for _ in loaded]
    for _, _, run in loaded:  # warm-up: first-call allocations and lazy initialisation
        run([u["source"] for u in chunks[0]], [u["key"] for u in chunks[0]], batch)
    for _ in range(repeats):
        for block in blocks:
            for (_, _, run), latencies in zip(loaded, results, strict=True):
                time.sleep(SETTLE_S)
                for chunk in block:
                    paths, keys = [u["source"] for u in chunk], [u["key"] for u in chunk]
                    start = time.perf_counter()
                    run(paths, keys, batch)
                    latencies.append(time.perf_counter() - start)
    return results


def measure_stream(loaded: list[tuple[str, str, Runner]], utts: list[dict], batch: int,
                   rounds: int) -> list[tuple[float, list[str]]]:
    """(seconds, texts of the last round) of each runner transcribing all ``utts`` given in one call,
    ``batch`` at a time (a transcription job: a runtime may overlap its batches, as ours overlaps
    features, network and decoding), seconds summed over ``rounds`` rounds in which the runners take
    turns, in reverse order every other round."""
    paths, keys = [u["source"] for u in utts], [u["key"] for u in utts]
    seconds, texts = [0.0] * len(loaded), [[] for _ in loaded]
    order = list(range(len(loaded)))
    for r in range(rounds):
        for i in order if r % 2 == 0 else order[::-1]:
            time.sleep(SETTLE_S)
            start = time.perf_counter()
            texts[i] = loaded[i][2](paths, keys, batch)
            seconds[i] += time.perf_counter() - start
    return list(zip(seconds, texts, strict=True))


def row(runtime: str, precision: str, device: str, batch: int, latencies: list[float], stream_s: float,
        n_utts: int, audio_s: float, rounds: int) -> dict:
    """Latency from the per-batch calls; throughput and RTF from the whole-set calls (``rounds`` of them,
    ``stream_s`` seconds in all)."""
    return {"runtime": runtime, "label": LABELS[runtime], "precision": precision, "device": device,
            "batch": batch, "utterances": n_utts * rounds, "seconds": round(stream_s, 4),
            "latency_ms": {"p50": round(1000 * float(np.percentile(latencies, 50)), 2),
                           "p95": round(1000 * float(np.percentile(latencies, 95)), 2)},
            "utt_per_s": round(n_utts * rounds / stream_s, 2), "rtf": round(stream_s / (audio_s * rounds), 5)}


def run_benchmark(export_dir: Path, model_dir: Path, utts: list[dict], audio_s: float, batch_sizes: list[int],
                  devices: list[str], threads: int, repeats: int) -> dict:
    family = export_family(export_dir)
    rows, notes = [], []
    for device in devices:
        loaded, skipped = runners(export_dir, model_dir, family, device, threads)
        notes += skipped
        progress = Progress(f"benchmark {device}", len(batch_sizes), unit="batch size", logger=log)
        for batch in batch_sizes:
            reference = None
            per_batch = measure(loaded, utts, batch, repeats)
            rounds = STREAM_ROUNDS * repeats
            stream = measure_stream(loaded, utts, batch, rounds)
            for (name, precision, _), latencies, (stream_s, texts) in zip(loaded, per_batch, stream,
                                                                          strict=True):
                r = row(name, precision, device, batch, latencies, stream_s, len(utts), audio_s, rounds)
                if name == "pytorch":
                    reference = texts
                r["same_text_as_pytorch"] = same_text(texts, reference, name in TAGLESS)
                rows.append(r)
                log.info("%-11s %s %s batch %2d: p50 %.1f ms, p95 %.1f ms, %.1f utt/s, RTF %.4f", name,
                         precision, device, batch, r["latency_ms"]["p50"], r["latency_ms"]["p95"],
                         r["utt_per_s"], r["rtf"])
            progress.update()
        progress.close()
    for r in rows:
        base = next((p for p in rows if p["runtime"] == "pytorch" and p["device"] == r["device"]
                     and p["batch"] == r["batch"]), None)
        r["speedup_vs_pytorch"] = round(r["utt_per_s"] / base["utt_per_s"], 2) if base else None
    return {"family": family, "rows": rows, "notes": notes}


def same_text(texts: list[str], reference: list[str] | None, tagless: bool) -> float | None:
    """Fraction of ``texts`` identical to AutoModel's (without their tags for a runtime that drops them)."""
    if reference is None:
        return None
    if tagless:
        reference = [strip_tags(t) for t in reference]
    return round(sum(a == b for a, b in zip(texts, reference, strict=True)) / len(texts), 4)


def targets(rows: list[dict]) -> list[dict]:
    """The benchmark's two CPU targets, as ratios measured in this run (None where a row is missing)."""
    out = []
    for t in TARGETS:
        ours = next((r for r in rows if r["device"] == "cpu" and r["batch"] == t["batch"]
                     and r["runtime"] == t["runtime"] and r["precision"] == t["precision"]), None)
        ratio = ours["speedup_vs_pytorch"] if ours else None
        out.append({**t, "ratio": ratio, "ok": None if ratio is None else ratio >= t["min_ratio"]})
    return out


def verdict(t: dict) -> str:
    return "n/a (row not run)" if t["ok"] is None else "ok" if t["ok"] else "MISSED"


def markdown(report: dict) -> str:
    """benchmark.md: the table and what the figures were measured on; the target ratios with their
    verdicts where the report has them (``targets``: the benchmark's, not stage 5's)."""
    m = report["machine"]
    # A load above the core count means other processes shared the CPU while this ran.
    loaded = (" (measured under load from other processes: absolute figures are pessimistic, ratios less "
              "affected)" if max(m["load_before"][0], m["load_after"][0]) > m["cores_available"] else "")
    lines = [f"# Runtime benchmark: {report['tag']} ({report['family']})", "",
             *([f"Model: {report['model']}, exported to `{report['export_dir']}`.", ""]
               if report.get("model") else []),
             f"{report['utterances']} utterances of `{report['data_jsonl']}` "
             f"({report['audio_seconds']:.1f} s of audio), end to end from audio file to text; "
             f"{report['threads']} threads per runtime on {m['cores_available']} available cores "
             f"({m['cpu']}); 1-minute load average {m['load_before'][0]:.2f} before, "
             f"{m['load_after'][0]:.2f} after{loaded}. "
             "Latency is per call with one batch of the given size; throughput (utt/s) and RTF are of "
             "calls with the whole set, transcribed that many at a time (a transcription job); x PyTorch is "
             "throughput over AutoModel's at the same batch and device; same text is the fraction of "
             "transcripts identical to AutoModel's.", "",
             "| runtime | precision | device | batch | p50 ms | p95 ms | utt/s | RTF | x PyTorch "
             "| same text |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        same = "n/a" if r["same_text_as_pytorch"] is None else f"{100 * r['same_text_as_pytorch']:.1f}%"
        x = "n/a" if r["speedup_vs_pytorch"] is None else f"{r['speedup_vs_pytorch']:.2f}"
        name = {"funasr_onnx": f"funasr-onnx ({report['funasr_onnx']})",
                "sherpa_onnx": f"sherpa-onnx {report.get('versions', {}).get('sherpa-onnx', '')} "
                               "(OfflineRecognizer.from_sense_voice)"}.get(r["runtime"], r["label"])
        lat = r["latency_ms"]
        lines.append(f"| {name} | {r['precision']} | {r['device']} | {r['batch']} | {lat['p50']:.1f} "
                     f"| {lat['p95']:.1f} | {r['utt_per_s']:.1f} | {r['rtf']:.4f} | {x} | {same} |")
    if report.get("targets"):
        lines += ["", "Targets (CPU, this run):", ""]
        for t in report["targets"]:
            ratio = "n/a" if t["ratio"] is None else f"{t['ratio']:.2f}x"
            lines.append(f"- ours {t['precision']} vs AutoModel.generate at batch {t['batch']}: {ratio} "
                         f"(target >= {t['min_ratio']}x): **{verdict(t)}**")
    elif report["notes"]:
        lines.append("")
    lines += [f"- note: {n}" for n in report["notes"]]
    versus = ours_versus(report["rows"], "sherpa_onnx")
    if versus:
        lines += ["", "Ours against sherpa-onnx (same ONNX files, same threads, this run): throughput "
                  + "; ".join(versus) + "."]
    return "\n".join(lines) + "\n"


def ours_versus(rows: list[dict], other: str) -> list[str]:
    """``precision device batch b: ratio`` of ours' throughput over ``other``'s, for each row of it."""
    out = []
    for r in rows:
        if r["runtime"] != other:
            continue
        same = ("precision", "device", "batch")
        ours = next((o for o in rows if o["runtime"] == "ours" and all(o[k] == r[k] for k in same)), None)
        if ours:
            out.append(f"{r['precision']} {r['device']} batch {r['batch']}: "
                       f"{ours['utt_per_s'] / r['utt_per_s']:.2f}x")
    return out

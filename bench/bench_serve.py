"""Load test of the HTTP service (stage 6) on 127.0.0.1: a bounded number of requests from a few
concurrent clients, with the dynamic batcher on and off, measured in one run.

Reads <export-dir> (stage 4) and a test set's data.jsonl; starts `python -m local.serve` on a free
loopback port once per configuration and stops it; prints throughput (requests/s and audio seconds
per second), p50/p95/p99 latency, errors, whether every text equals the batch decoder's (OnnxASR on the
same files) and the batched/unbatched throughput ratio; --out-json keeps the report.

  .venv/bin/python -m bench.bench_serve [--export-dir exp/tiny_sensevoice/export] \\
      [--data-jsonl data/dev/data.jsonl] \\
      [--requests 400] [--clients 1,4,16,64] [--max-batch 8] [--max-wait-ms 10] [--precision fp32] \\
      [--api-key]

--clients takes a list: each number of clients is a row, the batcher off and on. --api-key starts the
server with a key file and sends the key, as a service facing a network runs.
"""

from __future__ import annotations

import argparse
import json
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import soundfile as sf

from funasr_recipe.core.cli import program_parser
from funasr_recipe.data.tags import strip_tags
from funasr_recipe.runtime.onnx_asr import OnnxASR

ROOT = Path(__file__).resolve().parents[1]
MAX_REQUESTS = 5000  # the loop is bounded whatever the options say
START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, max_batch: int, clients: int,
                 key_file: Path | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "local.serve", "--model-dir", str(args.export_dir), "--port", str(port),
           "--precision", args.precision, "--max-batch", str(max_batch),
           "--max-wait-ms", str(args.max_wait_ms), "--queue-size", str(max(64, 4 * clients))]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if key_file is not None:
        cmd += ["--api-key-file", str(key_file)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"the server did not answer /health in {START_TIMEOUT_S} s")


def load(url: str, files: list[tuple[str, bytes]], requests: int, clients: int, key: str | None) -> dict:
    """``requests`` uploads spread over ``clients`` threads, each with its own connection."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    def client(k: int) -> list[tuple[int, float, int, str]]:
        out = []
        with httpx.Client(base_url=url, timeout=60, headers=headers) as http:
            for i in range(k, requests, clients):
                index = i % len(files)
                name, data = files[index]
                start = time.perf_counter()
                r = http.post("/v1/transcriptions", files={"file": (name, data)})
                out.append((index, time.perf_counter() - start, r.status_code,
                            r.json().get("text", "") if r.status_code == 200 else ""))
        return out

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.perf_counter() - start
    latencies = sorted(r[1] for r in results)

    def q(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {"requests": len(results), "wall_s": round(wall, 2), "req_per_s": round(len(results) / wall, 1),
            "errors": sum(r[2] != 200 for r in results), "p50_ms": round(q(0.50), 1),
            "p95_ms": round(q(0.95), 1), "p99_ms": round(q(0.99), 1),
            "mean_ms": round(statistics.fmean(latencies) * 1000, 1),
            "_texts": [(r[0], r[3]) for r in results]}


def main() -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--export-dir", type=Path, default=ROOT / "exp" / "tiny_sensevoice" / "export")
    parser.add_argument("--data-jsonl", type=Path, default=ROOT / "data" / "dev" / "data.jsonl")
    parser.add_argument("--max-utts", type=int, default=100, help="distinct files, sent round-robin")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", default="8", help="concurrent clients, or a list: 1,4,16,64")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--max-wait-ms", type=float, default=10.0)
    parser.add_argument("--precision", choices=("fp32", "int8"), default="fp32")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime threads of the server")
    parser.add_argument("--api-key", action="store_true", help="serve with an API key and send it")
    parser.add_argument("--out-json", type=Path)
    args = parser.parse_args()
    args.requests = min(args.requests, MAX_REQUESTS)
    concurrency = [int(c) for c in args.clients.split(",")]
    lines = args.data_jsonl.read_text(encoding="utf-8").splitlines()[: args.max_utts]
    paths = [json.loads(line)["source"] for line in lines]
    files = [(Path(p).name, Path(p).read_bytes()) for p in paths]
    audio_s = [sf.info(p).duration for p in paths]
    expected = [strip_tags(t) for t in OnnxASR(args.export_dir, quantize=args.precision == "int8")(paths)]

    report: dict = {"export_dir": str(args.export_dir), "files": len(files), "precision": args.precision,
                    "max_wait_ms": args.max_wait_ms, "api_key": args.api_key, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        key = f"sk-bench-{secrets.token_hex(16)}" if args.api_key else None
        key_file = Path(tmp) / "keys" if key else None
        if key_file is not None:
            key_file.write_text(key + "\n")
            key_file.chmod(0o600)
        for clients in concurrency:
            for label, max_batch in (("unbatched", 1), ("batched", args.max_batch)):
                proc, url = start_server(args, max_batch, clients, key_file)
                try:
                    load(url, files[:clients], clients, clients, key)  # warm-up, not counted
                    run = load(url, files, args.requests, clients, key)
                finally:
                    proc.terminate()
                    proc.wait(30)
                texts = run.pop("_texts")
                run["same_text_as_batch_decoder"] = sum(t == expected[i] for i, t in texts) / len(texts)
                run["audio_s_per_s"] = round(sum(audio_s[i] for i, _ in texts) / run["wall_s"], 1)
                report["runs"].append({"server": label, "clients": clients, "max_batch": max_batch, **run})
    print("| server | clients | max batch | requests | req/s | audio s/s | p50 ms | p95 ms | p99 ms | "
          "errors | same text as batch decoder |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in report["runs"]:
        print(f"| {r['server']} | {r['clients']} | {r['max_batch']} | {r['requests']} | {r['req_per_s']} | "
              f"{r['audio_s_per_s']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['errors']} | "
              f"{100 * r['same_text_as_batch_decoder']:.1f}% |")
    for clients in concurrency:
        u, b = (next(r for r in report["runs"] if r["clients"] == clients and r["server"] == s)
                for s in ("unbatched", "batched"))
        print(f"{clients} clients: batched / unbatched throughput {b['req_per_s'] / u['req_per_s']:.2f}x")
    print(f"{len(files)} files, {args.precision}, {'with' if args.api_key else 'without'} an API key")
    if args.out_json:
        args.out_json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    ok = all(r["errors"] == 0 and r["same_text_as_batch_decoder"] == 1.0 for r in report["runs"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""`verify serve`: run vLLM on this GPU with the plan's launch arguments and measure it with vLLM's own
benchmark client; compare TTFT, TPOT and output tokens/s with the serving model.

The server starts from :func:`trainledger.runconfig.serving.vllm_args` plus ``--load-format dummy``
(random weights: nothing is downloaded; the model's config and tokenizer must be in the local
Hugging Face cache) and ``HF_HUB_OFFLINE=1``. The client is ``vllm bench serve`` on the random
dataset with the plan's prompt and output lengths, ``--ignore-eos``, at ``--max-concurrency``;
its result file gives ``mean_ttft_ms``, ``p99_ttft_ms``, ``mean_tpot_ms``, ``p99_tpot_ms`` and
``output_throughput`` (vllm/benchmarks/serve.py). Skips cleanly (a reason, no error) where there is
no CUDA GPU or vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from trainledger.errors import VerifyError

#: fields of vLLM's benchmark result file we read (vllm/benchmarks/serve.py ``result_json``)
RESULT_FIELDS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                 "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "output_throughput", "request_throughput", "completed")


def skip_reason() -> str | None:
    """Why ``verify serve`` cannot run here (None when it can)."""
    if importlib.util.find_spec("vllm") is None or shutil.which("vllm") is None:
        return "vLLM is not installed (pip install vllm); nothing to measure"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    return None


def parse_result(data: dict[str, Any]) -> dict[str, float]:
    """The measured figures of one ``vllm bench serve`` result, in seconds and tokens/s."""
    missing = [k for k in ("mean_ttft_ms", "mean_tpot_ms", "output_throughput") if k not in data]
    if missing:
        raise VerifyError(f"vLLM benchmark result lacks {', '.join(missing)}; is this a `vllm bench serve` file?")
    out: dict[str, float] = {}
    for k in RESULT_FIELDS:
        if k in data and data[k] is not None:
            v = float(data[k])
            out[k.replace("_ms", "_s")] = v / 1000.0 if k.endswith("_ms") else v
    return out


def compare(measured: dict[str, float], predicted: dict[str, float]) -> list[dict[str, Any]]:
    rows = []
    for name, mk, pk in (("TTFT mean", "mean_ttft_s", "ttft_s"), ("TPOT mean", "mean_tpot_s", "tpot_s"),
                         ("TPOT p99", "p99_tpot_s", "tpot_p99_s"), ("ITL p99", "p99_itl_s", "tpot_worst_s"),
                         ("output tokens/s", "output_throughput", "output_tokens_per_s")):
        m, p = measured.get(mk), predicted.get(pk)
        rows.append({"name": name, "measured": m, "predicted": p,
                     "relative_error": (p - m) / m if m and p is not None else None})
    return rows


def _wait_ready(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise VerifyError(f"vllm serve exited with code {proc.returncode} before it was ready; see its log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    raise VerifyError(f"vllm serve was not ready after {timeout_s:.0f} s")


def run(plan: Any, concurrency: int, num_prompts: int, port: int = 8765, timeout_s: float = 900.0,
        log_dir: str | None = None) -> dict[str, Any]:
    """Start vLLM for ``plan``, run its benchmark client, stop the server; measured vs predicted."""
    from trainledger.estimate.serving import ServingPerf
    from trainledger.runconfig.serving import model_id, vllm_args

    reason = skip_reason()
    if reason:
        return {"skipped": reason, "ok": True}
    plan = plan.model_copy(update={"serving": plan.serving.model_copy(update={"engine": "vllm"})})
    r = plan.recipe
    out_len = max(r.generate_len, 1)
    work = Path(log_dir or tempfile.mkdtemp(prefix="trainledger-serve-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    server_cmd = vllm_args(plan) + ["--load-format", "dummy", "--port", str(port)]
    log = open(work / "vllm_serve.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(server_cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_ready(port, proc, timeout_s)
        bench_cmd = ["vllm", "bench", "serve", "--backend", "vllm", "--model", model_id(plan), "--port", str(port),
                     "--dataset-name", "random", "--random-input-len", str(r.seq_len),
                     "--random-output-len", str(out_len), "--num-prompts", str(num_prompts),
                     "--max-concurrency", str(concurrency), "--ignore-eos", "--save-result",
                     "--result-dir", str(work), "--result-filename", "bench.json"]
        done = subprocess.run(bench_cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise VerifyError(f"vllm bench serve failed ({done.returncode}): {done.stderr[-400:]}")
        measured = parse_result(json.loads((work / "bench.json").read_text()))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    predicted = ServingPerf(plan).continuous(concurrency, r.seq_len, out_len)
    return {"measured": measured, "predicted": predicted, "comparison": compare(measured, predicted),
            "server": server_cmd, "logs": str(work), "ok": True}

"""End to end from Python: a 124M GPT built from torch modules, AdamW through one local optstep
server against local torch AdamW, as docs/benchmarks.md reports it.

    bazel build //server:optstep_server //client/python/native:liboptstep_native.so
    bazel/python_env.sh   # the project's venv, with the native library copied into the package
    .venv/bin/python bench/compare/e2e_python.py [--steps 5] [--seq 128] [--json out.json]

Measured, each the median of --steps steps after one warm-up step:
- optimizer step alone: RemoteOptimizer.step() through shared memory (the default with a server
  on this host), on the native path and on the pure-Python path (OPTSTEP_NATIVE=0) with shared
  memory off, torch.optim.AdamW(foreach=True) and (fused=True);
- a whole training step (forward, backward, optimizer) of batch 1 x --seq tokens: overlap=True
  through the server (through shared memory, and on the native stream path) vs the same step
  with local foreach AdamW;
- bytes moved per step (gradients out, parameters back) and the time raw loopback TCP needs for
  them (two threads, one socket, 4 MiB sends);
- peak RSS of this process and of the server next to what must be held (parameters and
  gradients here; masters and two AdamW moments there).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import pathlib
import resource
import socket
import statistics
import threading
import time
from typing import Any, Callable, Dict

import torch
from torch import nn

import optstep
from optstep import config, native
from optstep.torch import RemoteOptimizer

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, ffn)
        self.out = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    """GPT-2 small: 12 layers, hidden 768, 12 heads, vocabulary 50257, 1024 positions, the
    output layer tied to the word embedding (124.4M parameters)."""

    def __init__(self, layers: int = 12, hidden: int = 768, heads: int = 12,
                 vocab: int = 50257, positions: int = 1024) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(positions, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, 4 * hidden) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


def median_time(fn: Callable[[], Any], steps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def random_grads(model: nn.Module) -> None:
    generator = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator) * 1e-3


def raw_tcp_seconds(nbytes: int) -> float:
    """Seconds loopback TCP takes for `nbytes` from one thread to another."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    block = bytearray(4 << 20)

    def receive() -> None:
        conn, _ = listener.accept()
        view = memoryview(bytearray(4 << 20))
        left = nbytes
        while left:
            left -= conn.recv_into(view, min(left, len(view)))
        conn.close()

    reader = threading.Thread(target=receive)
    reader.start()
    sender = socket.create_connection(("127.0.0.1", port))
    start = time.perf_counter()
    left = nbytes
    while left:
        n = min(left, len(block))
        sender.sendall(memoryview(block)[:n])
        left -= n
    reader.join()
    elapsed = time.perf_counter() - start
    sender.close()
    listener.close()
    return elapsed


def rss_peak_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--server", default=str(ROOT / "bazel-bin/server/optstep_server"))
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    results: Dict[str, Any] = {"threads": threads, "native_library": native.available()}

    model = Gpt()
    n_params = sum(p.numel() for p in model.parameters())
    results["params"] = n_params
    adamw = dict(lr=1e-4, weight_decay=0.1)

    def local_step(**kind: bool) -> float:
        opt = torch.optim.AdamW(model.parameters(), **adamw, **kind)
        random_grads(model)
        return median_time(opt.step, args.steps)

    results["torch_foreach_step_s"] = local_step(foreach=True)
    results["torch_fused_step_s"] = local_step(fused=True)

    with optstep.LocalServer(args.server, flags=["--max_sessions=16"]) as server:
        chain = config.chain(config.adamw(**adamw), clip_grad=0)
        for path in ("shared", "native", "python"):
            os.environ["OPTSTEP_NATIVE"] = "0" if path == "python" else "1"
            with optstep.Client(server.address, shared_memory=path == "shared") as client:
                opt = RemoteOptimizer(model, client, optimizer=chain)
                random_grads(model)
                results[f"remote_{path}_step_s"] = median_time(opt.step, args.steps)
                opt.close_session()
        os.environ["OPTSTEP_NATIVE"] = "1"
        idx = torch.randint(0, 50257, (1, args.seq))
        target = torch.randint(0, 50257, (1, args.seq))

        def train_step(opt: torch.optim.Optimizer) -> None:
            opt.zero_grad()
            logits = model(idx)
            nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]),
                                        target.view(-1)).backward()
            opt.step()

        results["train_step_local_foreach_s"] = median_time(
            functools.partial(train_step, torch.optim.AdamW(model.parameters(), **adamw,
                                                            foreach=True)), 3)
        for path in ("shared", "native"):
            with optstep.Client(server.address, shared_memory=path == "shared") as client:
                remote = RemoteOptimizer(model, client, optimizer=chain, overlap=True)

                def overlapped() -> None:
                    train_step(remote)
                    remote.synchronize()  # the next forward would wait for the same

                results[f"train_step_overlap_{path}_s"] = median_time(overlapped, 3)
                remote.close_session()
        results["server_peak_rss_mib"] = rss_peak_mib(server._process.pid)  # noqa: SLF001

    step_bytes = 2 * 4 * n_params  # fp32 gradients out, fp32 parameters back
    results["bytes_per_step"] = step_bytes
    results["raw_tcp_s"] = raw_tcp_seconds(step_bytes)
    results["trainer_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["trainer_must_hold_mib"] = 2 * 4 * n_params / 2**20  # parameters and gradients
    results["server_must_hold_mib"] = 3 * 4 * n_params / 2**20  # masters and two moments
    r = results
    print(f"124M GPT ({n_params / 1e6:.1f}M params), {threads} threads, native library "
          f"{'on' if r['native_library'] else 'OFF'}")
    rows = [
        ("RemoteOptimizer.step(), shared memory", r["remote_shared_step_s"]),
        ("RemoteOptimizer.step(), native", r["remote_native_step_s"]),
        ("RemoteOptimizer.step(), pure Python", r["remote_python_step_s"]),
        ("torch AdamW foreach", r["torch_foreach_step_s"]),
        ("torch AdamW fused", r["torch_fused_step_s"]),
        ("training step, overlap=True, shared memory", r["train_step_overlap_shared_s"]),
        ("training step, overlap=True, native stream path", r["train_step_overlap_native_s"]),
        ("training step, local foreach", r["train_step_local_foreach_s"]),
        (f"raw loopback TCP, {step_bytes / 1e9:.2f} GB", r["raw_tcp_s"]),
    ]
    for name, seconds in rows:
        print(f"| {name} | {seconds:.3f} s |")
    print(f"shared memory step vs foreach: "
          f"{r['torch_foreach_step_s'] / r['remote_shared_step_s']:.2f}x; vs fused: "
          f"{r['torch_fused_step_s'] / r['remote_shared_step_s']:.2f}x")
    print(f"native step vs foreach: {r['torch_foreach_step_s'] / r['remote_native_step_s']:.2f}x;"
          f" vs fused: {r['torch_fused_step_s'] / r['remote_native_step_s']:.2f}x; overlap "
          f"training step / local foreach: "
          f"{r['train_step_overlap_native_s'] / r['train_step_local_foreach_s']:.2f} (shared "
          f"memory: {r['train_step_overlap_shared_s'] / r['train_step_local_foreach_s']:.2f});"
          f" native step / raw "
          f"TCP: {r['remote_native_step_s'] / r['raw_tcp_s']:.2f}")
    print(f"peak RSS: trainer {r['trainer_peak_rss_mib']:.0f} MiB (holds "
          f"{r['trainer_must_hold_mib']:.0f}), server {r['server_peak_rss_mib']:.0f} MiB (holds "
          f"{r['server_must_hold_mib']:.0f})")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

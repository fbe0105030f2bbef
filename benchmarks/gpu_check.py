"""GPU check: the probe's and the guard's cost on CUDA, and the parts only a GPU has.

One command, under 5 minutes on one GPU. Each check prints one line, ``[PASS]``,
``[FAIL]`` or ``[SKIP]`` with the reason; the exit code is 1 when one failed.

============  ===================================================================
check         what
============  ===================================================================
overhead      plain, probed and guarded steps of the 6-layer d256 decoder (batch
              16 x 128) interleaved in blocks (ABBA...), at bf16 autocast (fused AdamW,
              the guard's ``sync="deferred"``) and at fp16 with a ``GradScaler``; block
              times between two device syncs, medians: probe and guard overhead in %
syncs         host syncs per healthy guarded step: ``torch.cuda.set_sync_debug_mode``
              counts them on CUDA (target 0 at bf16 with a fused optimizer; the fp16
              path reads its facts at once: the scaler's own skip is a sync); on the
              CPU, the count of ``.item()``-like calls instead
nvml          the probe's ``gpu_power_w`` and ``gpu_mem_used`` are measured (NVML)
sdpa          the attention capture under the flash and memory-efficient SDPA
              backends (bf16, the backend forced): the attention signals are measured
============  ===================================================================

Without CUDA every CUDA part is skipped with its reason, and what a CPU can run runs
on a tiny model (``--quick``: seconds; figures are smoke, not measurements).

Usage::

    OMP_WAIT_POLICY=passive python benchmarks/gpu_check.py            # on a GPU
    OMP_WAIT_POLICY=passive python benchmarks/gpu_check.py --quick    # CI, on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

import torch

from collapse_guard.datasets.real.model import GPT, GPTConfig
from collapse_guard.guard import Guard
from collapse_guard.probe import Probe

__all__ = ["main"]

_READS = ("item", "tolist", "__float__", "__bool__", "__int__", "cpu", "nonzero")


class Report:
    """The checks' lines, and whether one failed."""

    def __init__(self) -> None:
        self.failed = False

    def line(self, status: str, name: str, text: str) -> None:
        self.failed |= status == "FAIL"
        print(f"[{status}] {name}: {text}", flush=True)


def _config(quick: bool, cuda: bool) -> GPTConfig:
    if cuda and not quick:
        return GPTConfig(vocab_size=256, seq_len=128, n_layer=6, n_head=8, d_model=256)
    return GPTConfig(vocab_size=64, seq_len=16, n_layer=1, n_head=2, d_model=32)


def _model(config: GPTConfig, device: str, fused: bool):
    torch.manual_seed(0)
    model = GPT(config).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4, fused=fused)


def _batches(config: GPTConfig, device: str, n: int, batch: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    shape = (batch, config.seq_len + 1)
    return [
        torch.randint(0, config.vocab_size, shape, generator=generator).to(device) for _ in range(n)
    ]


def _autocast(device: str, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=dtype)


class Arm:
    """One way of stepping a model: ``step(batch)`` runs forward, backward and update."""

    def __init__(self, kind: str, config, device: str, dtype, scaler_on: bool, folder: str):
        # fused AdamW: the deferred guard's skip on the device (and the fastest step)
        self.model, self.opt = _model(config, device, fused=True)
        self.kind, self.device, self.dtype = kind, device, dtype
        self.scaler = torch.amp.GradScaler(device, init_scale=1024.0) if scaler_on else None
        self.probe = Probe(self.model, self.opt, scaler=self.scaler) if kind == "probe" else None
        self.guard = None
        if kind == "guard":
            sync = "auto" if scaler_on else "deferred"  # the CPU too, for its count
            self.guard = Guard(
                self.model,
                self.opt,
                folder,
                scaler=self.scaler,
                risk="off",
                sync=sync,
                preflight=False,  # no warm-up in a timing loop, on purpose
            )

    def step(self, batch: torch.Tensor) -> None:
        with _autocast(self.device, self.dtype):
            _, loss = self.model(batch[:, :-1], batch[:, 1:])
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        if self.guard is not None:
            self.guard.step(loss)
        else:
            if self.probe is not None:
                self.probe.after_backward(loss)
            if self.scaler is not None:
                self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)
            if self.scaler is not None:
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                self.opt.step()
            if self.probe is not None:
                self.probe.after_step()
        self.opt.zero_grad(set_to_none=True)

    def close(self) -> None:
        if self.guard is not None:
            self.guard.close()
        if self.probe is not None:
            self.probe.close()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def check_overhead(report: Report, device: str, quick: bool, steps: int, block: int) -> None:
    config = _config(quick, device == "cuda")
    batch = 16 if device == "cuda" and not quick else 4
    batches = _batches(config, device, block, batch)
    cases = [("bf16 autocast", torch.bfloat16, False), ("fp16 + GradScaler", torch.float16, True)]
    for label, dtype, scaler_on in cases:
        folder = tempfile.mkdtemp(prefix="gpu-check-")
        arms = {
            k: Arm(k, config, device, dtype, scaler_on, folder) for k in ("plain", "probe", "guard")
        }
        times: dict[str, list[float]] = {k: [] for k in arms}
        for arm in arms.values():  # warm-up: first checkpoint, kernels, allocator
            for b in batches[:3]:
                arm.step(b)
        order = ["plain", "probe", "guard", "guard", "probe", "plain"]
        for i in range(max(1, 2 * steps // block)):
            kind = order[i % len(order)]
            _sync(device)
            began = time.perf_counter()
            for b in batches:
                arms[kind].step(b)
            _sync(device)
            times[kind].append((time.perf_counter() - began) / len(batches))
        for arm in arms.values():
            arm.close()
        med = {k: statistics.median(v) for k, v in times.items()}
        probe = 100 * (med["probe"] / med["plain"] - 1)
        guard = 100 * (med["guard"] / med["plain"] - 1)
        scale = "smoke on the CPU, not a figure" if device != "cuda" or quick else "figure"
        text = (
            f"{label}, {config.n_layer}x{config.d_model}, batch {batch}x{config.seq_len}: "
            f"plain {med['plain'] * 1e3:.2f} ms/step, probe {probe:+.1f} %, guard {guard:+.1f} % "
            f"({len(times['plain'])} blocks of {block} per arm; {scale})"
        )
        report.line("PASS", "overhead", text)


def _counted_reads(steps: Callable[[], None]) -> int:
    """Calls of .item()-like methods of torch.Tensor while ``steps`` runs."""
    count = [0]
    saved = {name: getattr(torch.Tensor, name) for name in _READS}

    def counting(real):
        def counted(tensor, *args, **kwargs):
            count[0] += 1
            return real(tensor, *args, **kwargs)

        return counted

    try:
        for name, real in saved.items():
            setattr(torch.Tensor, name, counting(real))
        steps()
    finally:
        for name, real in saved.items():
            setattr(torch.Tensor, name, real)
    return count[0]


def _cuda_syncs(steps: Callable[[], None]) -> int:
    """Host syncs torch reports (``set_sync_debug_mode("warn")``) while ``steps`` runs."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            steps()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def check_syncs(report: Report, device: str, quick: bool) -> None:
    config = _config(True, device == "cuda")
    batches = _batches(config, device, 8, 4)
    cases = [
        ("bf16 autocast, fused AdamW", torch.bfloat16, False),
        ("fp16 + GradScaler", torch.float16, True),
    ]
    for label, dtype, scaler_on in cases:
        if device != "cuda" and not scaler_on:
            dtype = None  # the CPU count is of the guard's code, not of autocast
        arm = Arm("guard", config, device, dtype, scaler_on, tempfile.mkdtemp(prefix="gpu-check-"))
        for b in (batches * 2)[:12]:  # past the first checkpoint (after 10 quiet steps)
            arm.step(b)
        healthy = batches[2:] + batches[:4]  # steps 12-21: the attention pass of step 20

        def run(arm: Arm = arm, healthy: list = healthy) -> None:
            for b in healthy:
                arm.step(b)

        if device == "cuda":
            n, what = _cuda_syncs(run), "host syncs (set_sync_debug_mode)"
        else:
            n, what = _counted_reads(run), ".item()-like calls (CPU: no CUDA sync to count)"
        deferred = arm.scaler is None
        arm.close()
        per_step = n / len(healthy)
        status = "FAIL" if deferred and n else "PASS"
        mode = "deferred facts" if deferred else "facts read at once (the scaler's skip syncs)"
        report.line(status, "syncs", f"{label}: {per_step:.1f} {what} per healthy step, {mode}")


def check_nvml(report: Report, device: str) -> None:
    if device != "cuda":
        report.line(
            "SKIP", "nvml", "no CUDA device: gpu_power_w and gpu_mem_used are NaN here by design"
        )
        return
    config = _config(True, True)
    model, opt = _model(config, device, fused=True)
    probe = Probe(model, opt)  # system_every=100: due at step 0
    batch = _batches(config, device, 1, 2)[0]
    _, loss = model(batch[:, :-1], batch[:, 1:])
    loss.backward()
    probe.after_backward(loss)
    opt.step()
    record = probe.after_step()
    probe.close()
    values = {k: record[k] for k in ("gpu_power_w", "gpu_mem_used")}
    ok = all(math.isfinite(v) and v > 0 for v in values.values())
    why = "" if ok else " (NaN: pynvml missing, no permission or a MIG slice)"
    report.line("PASS" if ok else "FAIL", "nvml", f"{values}{why}")


def check_sdpa(report: Report, device: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if device != "cuda":
        backends = [("default CPU kernel", None)]
        report.line(
            "SKIP",
            "sdpa",
            "no CUDA device: the flash and memory-efficient backends do not exist on the CPU",
        )
    else:
        backends = [
            ("flash", SDPBackend.FLASH_ATTENTION),
            ("mem-efficient", SDPBackend.EFFICIENT_ATTENTION),
        ]
    config = _config(True, device == "cuda")
    batch = _batches(config, device, 1, 2)[0]
    for name, backend in backends:
        model, opt = _model(config, device, fused=device == "cuda")
        probe = Probe(model, opt)  # attention_every=10: due at step 0
        context = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
        dtype = torch.bfloat16 if device == "cuda" else None
        try:
            with context, _autocast(device, dtype):
                _, loss = model(batch[:, :-1], batch[:, 1:])
                loss.backward()
                probe.after_backward(loss)
                opt.step()
                record = probe.after_step()
        except RuntimeError as error:  # "No available kernel": the backend cannot run it
            report.line("FAIL", "sdpa", f"{name}: {error}"[:300])
            continue
        finally:
            probe.close()
        keys = ("attn_entropy_min", "attn_entropy_mean", "attn_logit_max", "attn_saturation")
        finite = all(math.isfinite(record[k]) for k in keys)
        status = "PASS" if finite and torch.isfinite(loss) else "FAIL"
        shown = ", ".join(f"{k} {record[k]:.3g}" for k in keys)
        report.line(status, "sdpa", f"{name}: {shown}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, a few steps")
    parser.add_argument("--steps", type=int, default=120, help="steps per arm (overhead)")
    parser.add_argument("--block", type=int, default=20, help="steps per interleaved block")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even with CUDA")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    device = "cuda" if cuda else "cpu"
    if args.quick:
        args.steps, args.block = 8, 4
    name = torch.cuda.get_device_name() if cuda else "no CUDA device"
    print(f"gpu_check: torch {torch.__version__}, {name}{', quick' if args.quick else ''}")
    if not cuda:
        print("gpu_check: CUDA parts are skipped; what the CPU can run runs on a tiny model")
    report = Report()
    check_overhead(report, device, args.quick, args.steps, args.block)
    check_syncs(report, device, args.quick)
    check_nvml(report, device)
    check_sdpa(report, device)
    print("gpu_check: " + ("FAILED" if report.failed else "all run checks passed"))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Newton–Schulz, the 124M GPT Muon step and SOAP on one GPT layer: optstep against the
references a user would pick instead (Emerging-Optimizers, torch.optim.Muon), side by side.

Run by bench/compare/matrix.sh, which measures optstep (bench/optim_bench.cc, Google Benchmark
JSON) and passes the file here; this script times the references, each in a fresh subprocess (for
its peak RSS), and prints one table with ratio = optstep speed / the faster reference.

The tests never run this; it needs torch (and Emerging-Optimizers 0.3.0, which needs Python
>= 3.12: without it those columns read "skipped" and say why).

With --device=cuda (tests/gpu/run_bundle.sh, against `optim_bench --device=cuda`) every reference
runs on the GPU, in this process, timed with the device synchronised; the table adds the device
copy and AdamW (torch's fused AdamW on one 16M tensor, in GB/s over the copy's, and on the 124M
GPT layout), and its memory column is the GPU's peak allocation instead of the RSS.
"""

import argparse
import json
import resource
import subprocess
import sys
import time

# Mirrors bench/gpt_layout.h (GPT-2 small: 124.4M parameters).
HIDDEN, FFN, VOCAB, POSITIONS, LAYERS = 768, 3072, 50257, 1024, 12
NS_SHAPES = [(1024, 1024), (1024, 4096), (4096, 1024)]
NS_STEPS = 5
PRECISIONS = {"highest": 0, "medium": 2}  # optim_bench's prec argument
M = 1 << 20


def ns_flops(rows, cols, steps=NS_STEPS):
    r, c = min(rows, cols), max(rows, cols)
    return steps * (4.0 * r * r * c + 2.0 * r * r * r)


def eo_missing():
    """Why Emerging-Optimizers cannot run here, or None."""
    if sys.version_info < (3, 12):
        return "Emerging-Optimizers 0.3.0 needs Python >= 3.12 (this is %d.%d)" % sys.version_info[:2]
    try:
        import emerging_optimizers  # noqa: F401
    except ImportError as e:
        return "Emerging-Optimizers not importable: %s" % e
    return None


# ---- the references, one per subprocess ---------------------------------------------------


def layer_shapes():
    """One GPT layer: (name, shape); 2-D entries go to the matrix optimizer."""
    h = HIDDEN
    return [("ln1.weight", (h,)), ("ln1.bias", (h,)), ("qkv.weight", (3 * h, h)),
            ("qkv.bias", (3 * h,)), ("proj.weight", (h, h)), ("proj.bias", (h,)),
            ("ln2.weight", (h,)), ("ln2.bias", (h,)), ("fc1.weight", (FFN, h)),
            ("fc1.bias", (FFN,)), ("fc2.weight", (h, FFN)), ("fc2.bias", (h,))]


def model_params(torch, layers, device="cpu"):
    """Parameters with random gradients on `device`: (matrix params, the rest), as the muon
    preset routes them (the word embedding and 1-D parameters to AdamW, the position embedding
    to Muon)."""
    gen = torch.Generator().manual_seed(0)
    matrices, rest = [], []
    shapes = [s for _ in range(layers) for _, s in layer_shapes()]
    if layers == LAYERS:
        shapes += [(POSITIONS, HIDDEN), (HIDDEN,), (HIDDEN,)]
        rest.append(torch.nn.Parameter(
            (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02).to(device)))
    for shape in shapes:
        p = torch.nn.Parameter((torch.randn(*shape, generator=gen) * 0.02).to(device))
        (matrices if len(shape) == 2 else rest).append(p)
    for p in matrices + rest:
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-3).to(device)
    return matrices, rest


def torch_ns(torch, x, dtype):
    """Emerging-Optimizers' loop (normalize, 5 × [A = XXᵀ, B = bA + cAA, X = aX + BX]) in
    plain torch, on `dtype` tensors: the reference that needs no Emerging-Optimizers."""
    a, b, c = 3.4445, -4.7750, 2.0315
    transpose = x.size(0) > x.size(1)
    X = x.mT if transpose else x
    X = torch.nn.functional.normalize(X, p=2, dim=(-2, -1), eps=1e-7).to(dtype)
    for _ in range(NS_STEPS):
        A = X @ X.mT
        B = torch.addmm(A, A, A, alpha=c, beta=b)
        X = torch.addmm(X, B, X, alpha=1.0, beta=a)
    X = X.to(torch.float32)
    return X.mT if transpose else X


def make_runner(torch, case):
    """A function that runs `case` once."""
    kind, impl, prec = case["kind"], case["impl"], case["prec"]
    device = case.get("device", "cpu")
    torch.set_float32_matmul_precision("medium" if prec == "medium" else "highest")
    if kind == "copy":  # the device's usable bandwidth: 256M fp32 copied
        src = torch.ones(256 * M, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)
    if kind == "adamw16m":  # torch's fused AdamW on one tensor of 16M
        p = torch.nn.Parameter(torch.ones(16 * M, device=device))
        p.grad = torch.full_like(p, 1e-3)
        opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, fused=True)
        return opt.step
    if kind == "ns":
        x = torch.randn(case["rows"], case["cols"], generator=torch.Generator().manual_seed(0))
        x = x.to(device)
        if impl == "eo":
            from emerging_optimizers.orthogonalized_optimizers.muon_utils import newton_schulz
            return lambda: newton_schulz(x, NS_STEPS, coefficient_type="simple")
        if impl == "torch_muon":
            from torch.optim._muon import _zeropower_via_newtonschulz
            return lambda: _zeropower_via_newtonschulz(x, (3.4445, -4.7750, 2.0315), NS_STEPS, 1e-7)
        dtype = torch.bfloat16 if prec == "medium" else torch.float32
        return lambda: torch_ns(torch, x, dtype)
    layers = LAYERS if kind in ("muon", "adam") else 1
    matrices, rest = model_params(torch, layers, device)
    if kind == "adam":  # the adam preset: AdamW on every parameter, fused where it can be
        opt = torch.optim.AdamW(matrices + rest, lr=1e-4, weight_decay=0.01,
                                fused=device != "cpu")
        return opt.step
    if kind in ("muon", "muon_layer") and impl == "torch_muon":
        matrix_opt = torch.optim.Muon(matrices, lr=1e-4, weight_decay=0.01)
    elif kind in ("muon", "muon_layer"):
        from emerging_optimizers.orthogonalized_optimizers import Muon
        matrix_opt = eo_optimizer(Muon, matrices, fp32_matmul_prec=prec)
    else:
        from emerging_optimizers.soap import SOAP
        matrix_opt = eo_optimizer(SOAP, matrices, fp32_matmul_prec=prec, qr_fp32_matmul_prec=prec,
                                  precondition_frequency=1, use_kl_shampoo=True)
    rest_opt = (torch.optim.AdamW(rest, lr=1e-4, weight_decay=0.01, fused=device != "cpu")
                if rest else None)

    def step():
        matrix_opt.step()
        if rest_opt is not None:
            rest_opt.step()
    return step


def eo_optimizer(cls, params, **wanted):
    """`cls(params, lr, weight_decay, **wanted)` with the arguments its version accepts."""
    import inspect
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in dict(lr=1e-4, weight_decay=0.01, **wanted).items() if k in accepted}
    return cls(params, **kwargs)


def time_case(case):
    """Times `case` in this process: {seconds (the fastest repeat), mean, cpu_s, rss_mb}; on a GPU
    the device is synchronised around each repeat and rss_mb is the GPU's peak allocation."""
    import torch
    torch.set_num_threads(case["threads"])
    cuda = case.get("device", "cpu") != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        run = make_runner(torch, case)
        run()  # warm up (SOAP: its first step factors)
        sync()
        times, cpu = [], []
        for _ in range(case["repeats"]):
            start, cpu_start = time.perf_counter(), time.process_time()
            run()
            sync()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
    rss_mb = (torch.cuda.max_memory_allocated() / 1e6 if cuda else
              resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3)
    return {"seconds": min(times), "mean": sum(times) / len(times), "cpu_s": min(cpu),
            "rss_mb": rss_mb}


def run_case(case):
    """Times `case` in this process; prints one JSON line."""
    print(json.dumps(time_case(case)))


def measure(case):
    if case.get("device", "cpu") != "cpu":  # one process: the GPU's context is made once
        try:
            return time_case(case)
        except Exception as e:  # a reference that fails is a cell of the table, not the end
            return {"error": "%s: %s" % (type(e).__name__, e)}
    proc = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- optstep's figures and the table --------------------------------------------------------


def optstep_figures(path):
    """name -> the benchmark's JSON entry."""
    with open(path) as f:
        return {b["name"]: b for b in json.load(f)["benchmarks"]}


def fmt(result, flops=None):
    if result is None:
        return "skipped"
    if "error" in result:
        return "error: " + result["error"][:60]
    if flops:
        return "%.1f GFLOP/s (%.0f MB)" % (flops / result["seconds"] / 1e9, result["rss_mb"])
    # CPU seconds where known: what other load on the machine distorts least.
    cpu = ", cpu %.3f s" % result["cpu_s"] if result.get("cpu_s") is not None else ""
    return "%.4g s%s (%.0f MB)" % (result["seconds"], cpu, result["rss_mb"])


def device_rows(ours, ref):
    """The GPU's own rows: the device copy, AdamW on one 16M tensor and the adam step of the 124M
    GPT layout, against torch's fused AdamW."""
    def find(prefix):
        return next((v for k, v in ours.items() if k.startswith(prefix)), None)

    copy, adamw = find("DeviceCopy/"), find("Elementwise/adamw/")
    rows = [("device copy, 256M fp32", 8.0 * 256 * M / (copy["GB/s"] * 1e9) if copy else None,
             None, {"torch copy_": ref(kind="copy", impl="torch", prec="highest")}, None),
            ("AdamW, one 16M tensor", 28.0 * 16 * M / (adamw["GB/s"] * 1e9) if adamw else None,
             None, {"torch fused AdamW": ref(kind="adamw16m", impl="torch", prec="highest")},
             None)]
    layer, rest = find("GptStep/adam/one_layer/"), find("GptStep/adam/rest/")
    rows.append(("AdamW step, 124M GPT", rest["step_s"] + LAYERS * layer["step_s"]
                 if layer and rest else None, None,
                 {"torch fused AdamW": ref(kind="adam", impl="torch", prec="highest")}, None))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--optstep_json", help="optim_bench --benchmark_out file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (optim_bench --device=cuda)")
    args = parser.parse_args()
    if args.case:
        return run_case(json.loads(args.case))

    import torch
    print("torch %s, %d threads; Python %d.%d" % ((torch.__version__, args.threads) +
                                                 sys.version_info[:2]))
    if args.device != "cpu":
        print("device %s: %s" % (args.device, torch.cuda.get_device_name(args.device)))
    why_no_eo = eo_missing()
    if why_no_eo:
        print("Emerging-Optimizers columns skipped: " + why_no_eo)
    ours = optstep_figures(args.optstep_json)
    # optstep's memory: its peak RSS on the CPU, the bytes its tensors hold on a GPU.
    mem_key = "peak_RSS_MB" if args.device == "cpu" else "held_MB"
    base = {"threads": args.threads, "repeats": args.repeats, "device": args.device}

    def ref(**case):
        if case["impl"] == "eo" and why_no_eo:
            return None
        return measure(dict(base, **case))

    rows = []
    if args.device != "cpu":
        rows += device_rows(ours, ref)
    for prec, code in PRECISIONS.items():
        for r, c in NS_SHAPES:
            mine = ours.get("NewtonSchulz/rows:%d/cols:%d/prec:%d/manual_time" % (r, c, code))
            refs = {"Emerging-Optimizers": ref(kind="ns", impl="eo", prec=prec, rows=r, cols=c),
                    "torch (same loop)": ref(kind="ns", impl="torch", prec=prec, rows=r, cols=c)}
            if prec == "medium":  # torch.optim.Muon always iterates in bf16
                refs["torch.optim.Muon"] = ref(kind="ns", impl="torch_muon", prec=prec, rows=r,
                                               cols=c)
            ours_s = ns_flops(r, c) / (mine["GFLOP/s"] * 1e9) if mine else None
            rows.append(("Newton–Schulz %dx%d %s" % (r, c, prec), ours_s,
                         mine.get(mem_key) if mine else None, refs, ns_flops(r, c)))
    for prec, label in (("medium", "muon"), ("highest", "muon_highest")):
        layer = ours.get("GptStep/%s/one_layer/iterations:2/manual_time" % label)
        rest = ours.get("GptStep/%s/rest/iterations:2/manual_time" % label)
        ours_s = rest["step_s"] + LAYERS * layer["step_s"] if layer and rest else None
        cpu_s = rest["cpu_s"] + LAYERS * layer["cpu_s"] if layer and rest else None
        refs = {"Emerging-Optimizers": ref(kind="muon", impl="eo", prec=prec)}
        if prec == "medium":
            refs["torch.optim.Muon"] = ref(kind="muon", impl="torch_muon", prec=prec)
        rss = max(layer[mem_key], rest[mem_key]) if layer and rest else None
        rows.append(("Muon step, 124M GPT, %s" % prec, ours_s, rss, refs, None, cpu_s))
    # One layer: the figure that optim_bench measures directly (the whole step extrapolates it).
    layer = ours.get("GptStep/muon/one_layer/iterations:2/manual_time")
    rows.append(("Muon step, one GPT layer, medium", layer["step_s"] if layer else None,
                 layer[mem_key] if layer else None,
                 {"Emerging-Optimizers": ref(kind="muon_layer", impl="eo", prec="medium"),
                  "torch.optim.Muon": ref(kind="muon_layer", impl="torch_muon", prec="medium")},
                 None, layer["cpu_s"] if layer else None))
    for prec, label in (("high", "soap"), ("medium", "soap_medium")):
        layer = ours.get("GptStep/%s/one_layer/iterations:2/manual_time" % label)
        refs = {"Emerging-Optimizers": ref(kind="soap", impl="eo", prec=prec)}
        rows.append(("SOAP step, one GPT layer, %s" % prec, layer["step_s"] if layer else None,
                     layer[mem_key] if layer else None, refs, None,
                     layer["cpu_s"] if layer else None))

    print("\n%-36s %-28s %-62s %s" % ("work", "optstep", "references", "ratio"))
    for name, ours_s, rss, refs, flops, *cpu in rows:
        mine = None if ours_s is None else {"seconds": ours_s, "rss_mb": rss or 0.0,
                                            "cpu_s": cpu[0] if cpu else None}
        timed = [v["seconds"] for v in refs.values() if v and "seconds" in v]
        ratio = "%.2f" % (min(timed) / ours_s) if timed and ours_s else "-"
        text = "; ".join("%s %s" % (k, fmt(v, flops)) for k, v in refs.items())
        print("%-36s %-28s %-62s %s" % (name, fmt(mine, flops), text, ratio))
    print("\nratio = optstep speed / the fastest reference (> 1: optstep is faster); cpu: CPU "
          "seconds of the process per step; MB: %s" % ("peak RSS" if args.device == "cpu" else
                                                        "GPU memory held (optstep) or "
                                                        "allocated at peak (torch)"))


if __name__ == "__main__":
    main()

"""The PyTorch timing both peer scripts use (torch_bench.py, torch_shared.py): CUDA-event medians
of eager, CUDA-graph replay and (optionally) torch.compile runs of one module on one input."""
import torch


def bench(fn, x, iters=200):
    """Median milliseconds of `fn(x)` after 20 warm-up calls (CUDA events, synchronised)."""
    for _ in range(20):
        fn(x)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        s.record(); fn(x); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def modes(name, mm, x, compile_it):
    """(eager, cuda-graph, torch.compile) ms of `mm` on `x`; compile is NaN when skipped or when
    it fails (the failure is printed, not hidden)."""
    with torch.inference_mode():
        eager = bench(mm, x)
        static = x.clone()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                mm(static)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            mm(static)
        graph = bench(lambda _x: g.replay(), x)
        comp = float("nan")
        if compile_it:
            try:
                comp = bench(torch.compile(mm), x, 100)
            except Exception as ex:  # report, do not hide
                print(f"TORCH {name} compile failed: {type(ex).__name__}: {str(ex)[:200]}", flush=True)
    return eager, graph, comp

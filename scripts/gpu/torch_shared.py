"""PyTorch baseline for the two shared models: each ONNX file is constant-folded by ONNX Runtime
(basic level: standard ONNX ops only), converted to a torch module by onnx2torch, checked against
ONNX Runtime on a random input, then timed like torch_bench.py (eager and CUDA graph, CUDA-event
medians, TF32 off) at batch 1 in fp32 and fp16, and with torch.compile when VIGIL_TORCH_COMPILE=1.
Prints one `TORCH ...` line per measurement.
Usage: torch_shared.py MODELS_DIR WORK_DIR"""
import os, sys
import numpy as np
import onnx, onnxruntime as ort, torch
from onnx2torch import convert
from torch_timing import modes

models, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

SHAPE_OPS = ("Reshape", "Resize", "Pad", "Split", "Expand", "Tile", "Slice", "ConstantOfShape")

def shape_constants_on_host(m):
    """onnx2torch reads shape-like constants (Reshape's shape, Resize's scales, Pad's pads,
    Split's sizes) with .tolist()/any() at run time: a device-to-host sync that CUDA-graph
    capture forbids. Keep those constants on the host, as a framework would hold them."""
    for node in m.graph.nodes:
        if node.op != "get_attr":
            continue
        users = list(node.users)
        def is_shape_arg(u):
            if u.op != "call_module":
                return False
            kind = type(m.get_submodule(u.target)).__name__
            return any(k in kind for k in SHAPE_OPS) and bool(u.args) and u.args[0] is not node
        if users and all(is_shape_arg(u) for u in users):
            owner, _, attr = node.target.rpartition(".")
            mod = m.get_submodule(owner) if owner else m
            t = getattr(mod, attr)
            if attr in mod._buffers:
                mod._buffers[attr] = t.cpu()
            elif attr in mod._parameters:
                mod._parameters[attr] = torch.nn.Parameter(t.detach().cpu(), requires_grad=False)
            else:
                setattr(mod, attr, t.cpu())
    return m

for name in ("efficientnet-lite0", "nanodet-m-416"):
    src = os.path.join(models, f"{name}.onnx")
    simp = os.path.join(work, f"{name}.simp.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = simp
    sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    want = sess.run(None, {inp.name: x})
    m = shape_constants_on_host(convert(onnx.load(simp)).eval().cuda())
    with torch.inference_mode():
        got = m(torch.from_numpy(x).cuda())
    got = got if isinstance(got, (list, tuple)) else [got]
    worst = max(float(np.abs(g.float().cpu().numpy() - w).max() / max(np.abs(w).max(), 1e-6)) for g, w in zip(got, want))
    print(f"TORCHCHECK {name}: onnx2torch vs ONNX Runtime max rel diff {worst:.2e}", flush=True)
    for dt in (getattr(torch, d) for d in os.environ.get("VIGIL_TORCH_DTYPES", "float32,float16").split(",")):
        mm = shape_constants_on_host(m.to("cuda", dt))
        xt = torch.from_numpy(x).to("cuda", dt)
        eager, graph, comp = modes(name, mm, xt, os.environ.get("VIGIL_TORCH_COMPILE", "0") != "0")
        print(f"TORCH {name} {str(dt)[6:]} batch 1: eager {eager:.3f} ms, cuda-graph {graph:.3f} ms, compile {comp:.3f} ms", flush=True)

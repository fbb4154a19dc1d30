"""PyTorch baseline on the GPU: exports torchvision ResNet-50 and MobileNetV3-Large (random
weights) to ONNX for Vigil, and times torch eager under a CUDA graph and torch.compile at batch
1 and 32, fp32 and fp16 (VIGIL_TORCH_COMPILE=0 skips torch.compile). Prints one `TORCH ...` line per measurement."""
import os, sys, time
import torch, torchvision
from torch_timing import modes

out = sys.argv[1]
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
models = {
    "resnet50": torchvision.models.resnet50(weights=None),
    "mobilenetv3l": torchvision.models.mobilenet_v3_large(weights=None),
}
for name, m in models.items():
    m = m.eval()
    path = os.path.join(out, f"{name}.onnx")
    torch.onnx.export(m, torch.randn(1, 3, 224, 224), path, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}}, opset_version=17, dynamo=False)
    print(f"EXPORTED {path}", flush=True)
    if os.environ.get("VIGIL_EXPORT_ONLY"):
        continue
    dtypes = os.environ.get("VIGIL_TORCH_DTYPES", "float32,float16").split(",")
    batches = [int(b) for b in os.environ.get("VIGIL_TORCH_BATCHES", "1,32").split(",")]
    for dt in (getattr(torch, d) for d in dtypes):
        mm = m.to("cuda", dt)
        for b in batches:
            x = torch.randn(b, 3, 224, 224, device="cuda", dtype=dt)
            eager, graph, comp = modes(name, mm, x, os.environ.get("VIGIL_TORCH_COMPILE", "1") != "0")
            print(f"TORCH {name} {str(dt)[6:]} batch {b}: eager {eager:.3f} ms, cuda-graph {graph:.3f} ms, compile {comp:.3f} ms", flush=True)

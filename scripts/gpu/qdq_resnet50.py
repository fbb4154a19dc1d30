# Device-side: an INT8 QDQ ResNet-50 from the exported torchvision ONNX (random weights), with
# ONNX Runtime's static quantizer (per-channel int8 weights, uint8 activations, MinMax over 8
# random inputs) — the same recipe as scripts/make-qdq-models.py uses for the shared models.
# A third argument `s8` makes TensorRT-style activations instead: int8, symmetric (zero point 0).
import sys, numpy as np
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process
src, dst = sys.argv[1], sys.argv[2]
quant_pre_process(src, "/tmp/r50.pre.onnx")
class R(CalibrationDataReader):
    def __init__(s):
        rng = np.random.default_rng(0)
        s.it = iter([{"x": rng.standard_normal((1, 3, 224, 224), dtype=np.float32)} for _ in range(8)])
    def get_next(s):
        return next(s.it, None)
s8 = len(sys.argv) > 3 and sys.argv[3] == "s8"
quantize_static("/tmp/r50.pre.onnx", dst, R(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QInt8 if s8 else QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                extra_options={"ActivationSymmetric": True} if s8 else {})
print("QDQ", dst)

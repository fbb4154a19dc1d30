import numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
rng = np.random.default_rng(0)
def save(g, name, opset=17):
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], producer_name="vigil-fuzz-seed")
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, name)
# 1. Conv + Relu + MaxPool + GlobalAveragePool + Gemm
W = nh.from_array(rng.standard_normal((4,3,3,3)).astype(np.float32), "W")
B = nh.from_array(rng.standard_normal(4).astype(np.float32), "B")
G = nh.from_array(rng.standard_normal((5,4)).astype(np.float32), "G")
GB = nh.from_array(rng.standard_normal(5).astype(np.float32), "GB")
g = h.make_graph([
  h.make_node("Conv", ["x","W","B"], ["c"], pads=[1,1,1,1], strides=[1,1], kernel_shape=[3,3]),
  h.make_node("Relu", ["c"], ["r"]),
  h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2,2], strides=[2,2]),
  h.make_node("GlobalAveragePool", ["p"], ["gp"]),
  h.make_node("Flatten", ["gp"], ["f"], axis=1),
  h.make_node("Gemm", ["f","G","GB"], ["y"], transB=1),
  h.make_node("Softmax", ["y"], ["s"], axis=1),
], "conv_relu", [h.make_tensor_value_info("x", T.FLOAT, [1,3,8,8])],
   [h.make_tensor_value_info("s", T.FLOAT, [1,5])], [W,B,G,GB])
save(g, "conv_relu.onnx")
# 2. Reshape / Transpose / Concat / Split / Slice
shp = nh.from_array(np.array([1,4,2,6], np.int64), "shp")
st = nh.from_array(np.array([0], np.int64), "st"); en = nh.from_array(np.array([3], np.int64), "en")
ax = nh.from_array(np.array([3], np.int64), "ax")
sp = nh.from_array(np.array([2,2], np.int64), "sp")
g = h.make_graph([
  h.make_node("Reshape", ["x","shp"], ["a"]),
  h.make_node("Transpose", ["a"], ["b"], perm=[0,2,1,3]),
  h.make_node("Concat", ["b","b"], ["c"], axis=1),
  h.make_node("Split", ["c","sp"], ["d","e"], axis=1),
  h.make_node("Add", ["d","e"], ["f"]),
  h.make_node("Slice", ["f","st","en","ax"], ["g"]),
  h.make_node("Sigmoid", ["g"], ["y"]),
], "reshape_transpose_concat", [h.make_tensor_value_info("x", T.FLOAT, [1,48])],
   [h.make_tensor_value_info("y", T.FLOAT, [1,2,4,3])], [shp,st,en,ax,sp])
save(g, "reshape_transpose_concat.onnx")
# 3. Resize (scales) nearest + linear
sc = nh.from_array(np.array([1,1,2,2], np.float32), "sc")
sz = nh.from_array(np.array([1,2,5,7], np.int64), "sz")
g = h.make_graph([
  h.make_node("Resize", ["x","","sc"], ["a"], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
  h.make_node("Resize", ["a","","","sz"], ["y"], mode="linear", coordinate_transformation_mode="half_pixel"),
], "resize", [h.make_tensor_value_info("x", T.FLOAT, [1,2,4,4])],
   [h.make_tensor_value_info("y", T.FLOAT, [1,2,5,7])], [sc, sz])
save(g, "resize.onnx")
# 4. Exporter-noise shape arithmetic (constant folded): Shape/Gather/ConstantOfShape/Concat/Cast/Pad/Expand/Range/Where
i0 = nh.from_array(np.array(2, np.int64), "i0")
one = nh.from_array(np.array([1], np.int64), "one")
z = nh.from_array(np.array([0], np.int64), "z")
lim = nh.from_array(np.array(4, np.int64), "lim"); dl = nh.from_array(np.array(1, np.int64), "dl"); st0 = nh.from_array(np.array(0, np.int64), "st0")
g = h.make_graph([
  h.make_node("Shape", ["x"], ["s"]),
  h.make_node("Gather", ["s","i0"], ["hdim"], axis=0),
  h.make_node("Unsqueeze", ["hdim","z"], ["hv"]),
  h.make_node("Concat", ["one","hv"], ["cs"], axis=0),
  h.make_node("ConstantOfShape", ["cs"], ["k"], value=h.make_tensor("v", T.FLOAT, [1], [0.5])),
  h.make_node("Cast", ["s"], ["sf"], to=T.FLOAT),
  h.make_node("Concat", ["z","z","one","one","z","z","one","one"], ["pads"], axis=0),
  h.make_node("Pad", ["x","pads"], ["p"], mode="constant"),
  h.make_node("Range", ["st0","lim","dl"], ["rg"]),
  h.make_node("Cast", ["rg"], ["rgf"], to=T.FLOAT),
  h.make_node("Less", ["rgf","k"], ["m"]),
  h.make_node("Where", ["m","rgf","k"], ["w"]),
  h.make_node("Expand", ["w","s"], ["e"]),
  h.make_node("Mul", ["e","x"], ["ex"]),
  h.make_node("ReduceMean", ["ex"], ["rm"], axes=[2,3], keepdims=1),
  h.make_node("Add", ["p","rm"], ["y"]),
], "shape_arith", [h.make_tensor_value_info("x", T.FLOAT, [1,2,4,4])],
   [h.make_tensor_value_info("y", T.FLOAT, [1,2,6,6])], [i0,one,z,lim,dl,st0])
save(g, "shape_arith.onnx", opset=17)
# 5. ConvTranspose + BatchNorm + LeakyRelu + AveragePool + MatMul
CW = nh.from_array(rng.standard_normal((2,3,3,3)).astype(np.float32), "CW")
sc_ = nh.from_array(np.ones(3, np.float32), "bs"); bb = nh.from_array(np.zeros(3, np.float32), "bb")
mu = nh.from_array(rng.standard_normal(3).astype(np.float32), "mu"); var = nh.from_array(np.ones(3, np.float32)*2, "var")
MM = nh.from_array(rng.standard_normal((4,4)).astype(np.float32), "MM")
g = h.make_graph([
  h.make_node("ConvTranspose", ["x","CW"], ["a"], strides=[2,2], pads=[1,1,1,1], output_padding=[1,1]),
  h.make_node("BatchNormalization", ["a","bs","bb","mu","var"], ["b"], epsilon=1e-5),
  h.make_node("LeakyRelu", ["b"], ["c"], alpha=0.1),
  h.make_node("AveragePool", ["c"], ["d"], kernel_shape=[2,2], strides=[2,2]),
  h.make_node("MatMul", ["d","MM"], ["y"]),
], "convt_bn", [h.make_tensor_value_info("x", T.FLOAT, [1,2,4,4])],
   [h.make_tensor_value_info("y", T.FLOAT, [1,3,4,4])], [CW,sc_,bb,mu,var,MM])
save(g, "convt_bn.onnx")

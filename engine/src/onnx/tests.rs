//! Tests for ONNX import: models are built with the prost types and encoded to bytes.

use prost::Message;

use super::proto::attribute_proto::AttributeType;
use super::proto::tensor_shape_proto::{dimension, Dimension};
use super::proto::type_proto::{self, Value as TypeValue};
use super::proto::*;
use super::*;
use crate::ir::*;

fn tensor(name: &str, dtype: i32, dims: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        data_type: Some(dtype),
        dims: dims.to_vec(),
        ..Default::default()
    }
}

fn f32_typed(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        float_data: v.to_vec(),
        ..tensor(name, 1, dims)
    }
}

fn f32_raw(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    let raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    TensorProto {
        raw_data: Some(raw),
        ..tensor(name, 1, dims)
    }
}

fn i64_typed(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
    TensorProto {
        int64_data: v.to_vec(),
        ..tensor(name, 7, dims)
    }
}

fn vi(name: &str, elem: i32, dims: &[Option<i64>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Some(v) => dimension::Value::DimValue(*v),
                None => dimension::Value::DimParam("N".into()),
            }),
            denotation: None,
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(TypeValue::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto { dim }),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

fn attr(name: &str, t: AttributeType) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(t as i32),
        ..Default::default()
    }
}
fn a_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        i: Some(v),
        ..attr(name, AttributeType::Int)
    }
}
fn a_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        ints: v.to_vec(),
        ..attr(name, AttributeType::Ints)
    }
}
fn a_float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        f: Some(v),
        ..attr(name, AttributeType::Float)
    }
}
fn a_floats(name: &str, v: &[f32]) -> AttributeProto {
    AttributeProto {
        floats: v.to_vec(),
        ..attr(name, AttributeType::Floats)
    }
}
fn a_str(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        s: Some(v.as_bytes().to_vec()),
        ..attr(name, AttributeType::String)
    }
}
fn a_tensor(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        t: Some(t),
        ..attr(name, AttributeType::Tensor)
    }
}

fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

struct M {
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    opset: i64,
}

impl M {
    fn new(opset: i64) -> Self {
        M {
            nodes: vec![],
            inits: vec![],
            inputs: vec![],
            outputs: vec![],
            opset,
        }
    }
    fn proto(&self) -> ModelProto {
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(self.opset),
            }],
            graph: Some(GraphProto {
                node: self.nodes.clone(),
                initializer: self.inits.clone(),
                input: self.inputs.clone(),
                output: self.outputs.clone(),
                name: Some("g".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
    fn bytes(&self) -> Vec<u8> {
        self.proto().encode_to_vec()
    }
    fn load(&self) -> Result<Graph> {
        load_model(&self.bytes())
    }
}

/// A model with one op applied to input `x` (float, `dims`) plus extra initializers.
fn single(opset: i64, n: NodeProto, dims: &[Option<i64>], inits: Vec<TensorProto>) -> M {
    let mut m = M::new(opset);
    m.inputs.push(vi("x", 1, dims));
    for o in &n.output {
        if !o.is_empty() {
            m.outputs.push(vi(o, 1, &[]));
        }
    }
    m.nodes.push(n);
    m.inits = inits;
    m
}

fn only_op(g: &Graph) -> &Op {
    assert_eq!(g.nodes.len(), 1, "{:?}", g.nodes);
    &g.nodes[0].op
}

fn const_by_name<'a>(g: &'a Graph, name: &str) -> &'a Tensor {
    let id = g
        .value_by_name(name)
        .unwrap_or_else(|| panic!("no value {name}"));
    g.constant(id)
        .unwrap_or_else(|| panic!("{name} is not constant"))
}

#[test]
fn raw_and_typed_initializers_agree() {
    let vals = [1.5f32, -2.0, 3.25, 0.0, 1e-3, 7.0];
    let mut m = M::new(17);
    m.inputs.push(vi("x", 1, &[Some(2), Some(3)]));
    m.inits.push(f32_raw("a", &[2, 3], &vals));
    m.inits.push(f32_typed("b", &[2, 3], &vals));
    m.nodes
        .push(node("Add", "add1", &["x", "a"], &["y"], vec![]));
    m.nodes
        .push(node("Add", "add2", &["y", "b"], &["z"], vec![]));
    m.outputs.push(vi("z", 1, &[Some(2), Some(3)]));
    let g = m.load().unwrap();
    let a = const_by_name(&g, "a");
    let b = const_by_name(&g, "b");
    assert_eq!(a, b);
    assert_eq!(a.shape, vec![2, 3]);
    assert_eq!(a.as_f32().unwrap(), &vals);
    assert_eq!(g.inputs.len(), 1);
    assert_eq!(g.nodes.len(), 2);
    assert_eq!(
        g.nodes[1].inputs,
        vec![g.value_by_name("y"), g.value_by_name("b")]
    );
}

#[test]
fn widened_and_integer_initializers() {
    let halfs = [1.0f32, -0.5, 65504.0];
    let f16_bits: Vec<u16> = halfs
        .iter()
        .map(|&x| half::f16::from_f32(x).to_bits())
        .collect();
    let bf16_bits: Vec<u16> = halfs
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_bits())
        .collect();
    let mut m = M::new(17);
    m.inputs.push(vi("x", 1, &[Some(3)]));
    m.inits.push(TensorProto {
        raw_data: Some(f16_bits.iter().flat_map(|b| b.to_le_bytes()).collect()),
        ..tensor("h_raw", 10, &[3])
    });
    m.inits.push(TensorProto {
        int32_data: f16_bits.iter().map(|&b| b as i32).collect(),
        ..tensor("h_typed", 10, &[3])
    });
    m.inits.push(TensorProto {
        int32_data: bf16_bits.iter().map(|&b| b as i32).collect(),
        ..tensor("bf", 16, &[3])
    });
    m.inits.push(TensorProto {
        double_data: vec![0.25, -8.0, 3.0],
        ..tensor("d", 11, &[3])
    });
    m.inits.push(i64_typed("i", &[2], &[-3, 1 << 40]));
    m.inits.push(TensorProto {
        raw_data: Some([5i64, -6].iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..tensor("i_raw", 7, &[2])
    });
    m.inits.push(TensorProto {
        int32_data: vec![1, 0, 2],
        ..tensor("b", 9, &[3])
    });
    m.inits.push(TensorProto {
        int32_data: vec![-5, 127],
        ..tensor("s8", 3, &[2])
    });
    m.inits.push(TensorProto {
        int32_data: vec![200, 7],
        ..tensor("u8", 2, &[2])
    });
    m.inits.push(TensorProto {
        int32_data: vec![-70000],
        ..tensor("i32", 6, &[])
    });
    m.nodes.push(node("Identity", "id", &["x"], &["y"], vec![]));
    m.outputs.push(vi("y", 1, &[Some(3)]));
    let g = m.load().unwrap();
    assert_eq!(const_by_name(&g, "h_raw").as_f32().unwrap(), &halfs);
    assert_eq!(const_by_name(&g, "h_typed").as_f32().unwrap(), &halfs);
    assert_eq!(
        const_by_name(&g, "bf").as_f32().unwrap(),
        &[1.0, -0.5, 65536.0]
    );
    assert_eq!(const_by_name(&g, "d").as_f32().unwrap(), &[0.25, -8.0, 3.0]);
    assert_eq!(
        const_by_name(&g, "i").data,
        TensorData::I64(vec![-3, 1 << 40])
    );
    assert_eq!(
        const_by_name(&g, "i_raw").data,
        TensorData::I64(vec![5, -6])
    );
    assert_eq!(const_by_name(&g, "b").data, TensorData::Bool(vec![1, 0, 1]));
    assert_eq!(const_by_name(&g, "s8").data, TensorData::I8(vec![-5, 127]));
    assert_eq!(const_by_name(&g, "u8").data, TensorData::U8(vec![200, 7]));
    let s = const_by_name(&g, "i32");
    assert_eq!(
        (s.shape.clone(), s.data.clone()),
        (vec![], TensorData::I32(vec![-70000]))
    );
}

#[test]
fn bad_initializers_are_rejected() {
    let base = |t: TensorProto| {
        let mut m = M::new(17);
        m.inputs.push(vi("x", 1, &[Some(2)]));
        m.inits.push(t);
        m.nodes
            .push(node("Add", "add", &["x", "w"], &["y"], vec![]));
        m.outputs.push(vi("y", 1, &[Some(2)]));
        m.load()
    };
    // raw_data too short
    let r = base(TensorProto {
        raw_data: Some(vec![0; 7]),
        ..tensor("w", 1, &[2])
    });
    assert!(matches!(r, Err(Error::InvalidModel(_))), "{r:?}");
    // typed data count mismatch
    let r = base(f32_typed("w", &[3], &[1.0, 2.0]));
    assert!(matches!(r, Err(Error::InvalidModel(_))), "{r:?}");
    // negative and absurd dims
    let r = base(f32_typed("w", &[-1], &[]));
    assert!(matches!(r, Err(Error::InvalidModel(_))), "{r:?}");
    let r = base(f32_typed("w", &[1 << 20, 1 << 20, 1 << 20], &[]));
    assert!(matches!(r, Err(Error::InvalidModel(_))), "{r:?}");
    let r = base(f32_typed("w", &[i64::MAX, i64::MAX], &[]));
    assert!(matches!(r, Err(Error::InvalidModel(_))), "{r:?}");
    // external data
    let r = base(TensorProto {
        data_location: Some(1),
        external_data: vec![StringStringEntryProto {
            key: Some("location".into()),
            value: Some("w.bin".into()),
        }],
        ..tensor("w", 1, &[2])
    });
    match r {
        Err(Error::Unsupported(m)) => assert!(m.contains("external"), "{m}"),
        other => panic!("{other:?}"),
    }
    // string tensors
    let r = base(TensorProto {
        string_data: vec![b"a".to_vec(), b"b".to_vec()],
        ..tensor("w", 8, &[2])
    });
    assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
}

#[test]
fn constant_nodes_become_constants() {
    let mut m = M::new(13);
    m.inputs.push(vi("x", 1, &[Some(2), Some(2)]));
    m.nodes.push(node(
        "Constant",
        "c1",
        &[],
        &["t"],
        vec![a_tensor("value", f32_raw("", &[2], &[4.0, 5.0]))],
    ));
    m.nodes.push(node(
        "Constant",
        "c2",
        &[],
        &["f"],
        vec![a_float("value_float", 2.5)],
    ));
    m.nodes.push(node(
        "Constant",
        "c3",
        &[],
        &["fs"],
        vec![a_floats("value_floats", &[1.0, 2.0, 3.0])],
    ));
    m.nodes.push(node(
        "Constant",
        "c4",
        &[],
        &["i"],
        vec![a_int("value_int", -7)],
    ));
    m.nodes.push(node(
        "Constant",
        "c5",
        &[],
        &["is"],
        vec![a_ints("value_ints", &[4, 1])],
    ));
    m.nodes
        .push(node("Reshape", "r", &["x", "is"], &["y"], vec![]));
    m.outputs.push(vi("y", 1, &[Some(4), Some(1)]));
    let g = m.load().unwrap();
    assert_eq!(g.nodes.len(), 1);
    assert_eq!(g.nodes[0].op, Op::Reshape { allowzero: false });
    assert_eq!(const_by_name(&g, "t").as_f32().unwrap(), &[4.0, 5.0]);
    let f = const_by_name(&g, "f");
    assert_eq!(
        (f.shape.as_slice(), f.as_f32().unwrap()),
        (&[][..], &[2.5f32][..])
    );
    assert_eq!(const_by_name(&g, "fs").shape, vec![3]);
    assert_eq!(const_by_name(&g, "i").data, TensorData::I64(vec![-7]));
    assert_eq!(const_by_name(&g, "is").data, TensorData::I64(vec![4, 1]));
    assert_eq!(g.nodes[0].inputs[1], g.value_by_name("is"));
    // No value attribute, or two of them: invalid.
    let mut bad = M::new(13);
    bad.nodes.push(node("Constant", "c", &[], &["t"], vec![]));
    bad.outputs.push(vi("t", 1, &[]));
    assert!(matches!(bad.load(), Err(Error::InvalidModel(_))));
    bad.nodes[0].attribute = vec![a_int("value_int", 1), a_float("value_float", 1.0)];
    assert!(matches!(bad.load(), Err(Error::InvalidModel(_))));
}

#[test]
fn conv_and_pool_defaults() {
    let w = f32_typed("w", &[4, 3, 3, 3], &[0.5; 108]);
    let m = single(
        17,
        node("Conv", "conv", &["x", "w"], &["y"], vec![]),
        &[Some(1), Some(3), Some(8), Some(8)],
        vec![w],
    );
    let g = m.load().unwrap();
    let Op::Conv(a) = only_op(&g) else { panic!() };
    assert_eq!(a.kernel_shape, vec![3, 3]);
    assert_eq!(a.strides, vec![1, 1]);
    assert_eq!(a.dilations, vec![1, 1]);
    assert_eq!(a.pads, vec![0, 0, 0, 0]);
    assert_eq!(
        (a.group, a.auto_pad, a.activation, a.layout),
        (1, AutoPad::NotSet, None, Layout::Nchw)
    );

    let w = f32_typed("w", &[4, 1, 3, 3], &[0.5; 36]);
    let attrs = vec![
        a_ints("kernel_shape", &[3, 3]),
        a_ints("strides", &[2, 2]),
        a_str("auto_pad", "SAME_UPPER"),
        a_int("group", 4),
        a_ints("dilations", &[1, 2]),
    ];
    let m = single(
        17,
        node("Conv", "dw", &["x", "w"], &["y"], attrs),
        &[Some(1), Some(4), Some(8), Some(8)],
        vec![w],
    );
    let g = m.load().unwrap();
    let Op::Conv(a) = only_op(&g) else { panic!() };
    assert_eq!(
        (a.group, a.auto_pad, a.strides.clone(), a.dilations.clone()),
        (4, AutoPad::SameUpper, vec![2, 2], vec![1, 2])
    );

    // Bad auto_pad string and wrong-length strides are invalid.
    let w = f32_typed("w", &[4, 3, 3, 3], &[0.5; 108]);
    let m = single(
        17,
        node(
            "Conv",
            "c",
            &["x", "w"],
            &["y"],
            vec![a_str("auto_pad", "SAME")],
        ),
        &[Some(1)],
        vec![w.clone()],
    );
    assert!(matches!(m.load(), Err(Error::InvalidModel(_))));
    let attrs = vec![a_ints("kernel_shape", &[3, 3]), a_ints("strides", &[1])];
    let m = single(
        17,
        node("Conv", "c", &["x", "w"], &["y"], attrs),
        &[Some(1)],
        vec![w],
    );
    assert!(matches!(m.load(), Err(Error::InvalidModel(_))));

    let m = single(
        17,
        node(
            "MaxPool",
            "mp",
            &["x"],
            &["y"],
            vec![a_ints("kernel_shape", &[2, 2])],
        ),
        &[Some(1)],
        vec![],
    );
    let g = m.load().unwrap();
    let Op::MaxPool(p) = only_op(&g) else {
        panic!()
    };
    assert_eq!(
        (p.strides.clone(), p.pads.clone(), p.dilations.clone()),
        (vec![1, 1], vec![0; 4], vec![1, 1])
    );
    assert!(!p.ceil_mode && !p.count_include_pad);
    let attrs = vec![
        a_ints("kernel_shape", &[3]),
        a_int("count_include_pad", 1),
        a_int("ceil_mode", 1),
    ];
    let m = single(
        17,
        node("AveragePool", "ap", &["x"], &["y"], attrs),
        &[Some(1)],
        vec![],
    );
    let g = m.load().unwrap();
    let Op::AveragePool(p) = only_op(&g) else {
        panic!()
    };
    assert!(p.ceil_mode && p.count_include_pad);
    // MaxPool without kernel_shape: invalid; with an Indices output: unsupported.
    let m = single(
        17,
        node("MaxPool", "mp", &["x"], &["y"], vec![]),
        &[Some(1)],
        vec![],
    );
    assert!(matches!(m.load(), Err(Error::InvalidModel(_))));
    let n = node(
        "MaxPool",
        "mp",
        &["x"],
        &["y", "idx"],
        vec![a_ints("kernel_shape", &[2, 2])],
    );
    match single(17, n, &[Some(1)], vec![]).load() {
        Err(Error::Unsupported(m)) => assert!(m.contains("mp") && m.contains("MaxPool"), "{m}"),
        other => panic!("{other:?}"),
    }
    // An omitted (empty) Indices output is fine.
    let n = node(
        "MaxPool",
        "mp",
        &["x"],
        &["y", ""],
        vec![a_ints("kernel_shape", &[2, 2])],
    );
    assert_eq!(
        single(17, n, &[Some(1)], vec![]).load().unwrap().nodes[0]
            .outputs
            .len(),
        1
    );
}

#[test]
fn conv_transpose_attrs() {
    let w = f32_typed("w", &[3, 2, 2, 2], &[1.0; 24]);
    let attrs = vec![
        a_ints("strides", &[2, 2]),
        a_ints("output_padding", &[1, 0]),
        a_ints("output_shape", &[9, 8]),
    ];
    let m = single(
        17,
        node("ConvTranspose", "ct", &["x", "w"], &["y"], attrs),
        &[Some(1)],
        vec![w],
    );
    let g = m.load().unwrap();
    let Op::ConvTranspose(a) = only_op(&g) else {
        panic!()
    };
    assert_eq!(a.conv.kernel_shape, vec![2, 2]);
    assert_eq!(a.output_padding, vec![1, 0]);
    assert_eq!(a.output_shape, Some(vec![9, 8]));
}

#[test]
fn elementwise_and_activation_defaults() {
    let check = |op: &str, attrs: Vec<AttributeProto>, want: Op| {
        let g = single(17, node(op, "n", &["x"], &["y"], attrs), &[Some(2)], vec![])
            .load()
            .unwrap();
        assert_eq!(only_op(&g), &want, "{op}");
    };
    check("Relu", vec![], Op::Unary(UnaryOp::Act(Activation::Relu)));
    check(
        "LeakyRelu",
        vec![],
        Op::Unary(UnaryOp::Act(Activation::LeakyRelu { alpha: 0.01 })),
    );
    check(
        "LeakyRelu",
        vec![a_float("alpha", 0.1)],
        Op::Unary(UnaryOp::Act(Activation::LeakyRelu { alpha: 0.1 })),
    );
    check(
        "HardSigmoid",
        vec![],
        Op::Unary(UnaryOp::Act(Activation::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        })),
    );
    check(
        "HardSwish",
        vec![],
        Op::Unary(UnaryOp::Act(Activation::HardSwish)),
    );
    check(
        "Sigmoid",
        vec![],
        Op::Unary(UnaryOp::Act(Activation::Sigmoid)),
    );
    check("Tanh", vec![], Op::Unary(UnaryOp::Act(Activation::Tanh)));
    check("Erf", vec![], Op::Unary(UnaryOp::Erf));
    check("Not", vec![], Op::Unary(UnaryOp::Not));
    check("Clip", vec![], Op::Clip);
    check("Identity", vec![], Op::Identity);
    check("Dropout", vec![], Op::Identity);
    check("Flatten", vec![], Op::Flatten { axis: 1 });
    check(
        "Shape",
        vec![],
        Op::Shape {
            start: 0,
            end: None,
        },
    );
    check(
        "Shape",
        vec![a_int("start", 1), a_int("end", -1)],
        Op::Shape {
            start: 1,
            end: Some(-1),
        },
    );
    check("Cast", vec![a_int("to", 7)], Op::Cast { to: DataType::I64 });
    // f16 tensors are held as f32, so a Cast to f16 could not round as ONNX requires.
    let cast_f16 = single(
        17,
        node("Cast", "n", &["x"], &["y"], vec![a_int("to", 10)]),
        &[Some(2)],
        vec![],
    );
    assert!(matches!(cast_f16.load(), Err(Error::Unsupported(_))));
    check("Softmax", vec![], Op::Softmax { axis: -1 });
    check(
        "ReduceMean",
        vec![a_ints("axes", &[1])],
        Op::ReduceMean {
            axes: Some(vec![1]),
            keepdims: true,
        },
    );
    check(
        "ReduceMean",
        vec![a_int("keepdims", 0)],
        Op::ReduceMean {
            axes: None,
            keepdims: false,
        },
    );
    check("Transpose", vec![], Op::Transpose { perm: vec![0] });
    check(
        "GlobalAveragePool",
        vec![],
        Op::GlobalAveragePool {
            layout: Layout::Nchw,
        },
    );
    let cos = single(
        17,
        node("ConstantOfShape", "n", &["x"], &["y"], vec![]),
        &[Some(2)],
        vec![],
    )
    .load()
    .unwrap();
    let Op::ConstantOfShape { value } = only_op(&cos) else {
        panic!()
    };
    assert_eq!(value.as_f32().unwrap(), &[0.0]);
    let v = i64_typed("", &[1], &[3]);
    let cos = single(
        17,
        node(
            "ConstantOfShape",
            "n",
            &["x"],
            &["y"],
            vec![a_tensor("value", v)],
        ),
        &[Some(2)],
        vec![],
    )
    .load()
    .unwrap();
    let Op::ConstantOfShape { value } = only_op(&cos) else {
        panic!()
    };
    assert_eq!(value.data, TensorData::I64(vec![3]));

    // Softmax default axis is 1 before opset 13.
    let g = single(
        11,
        node("Softmax", "n", &["x"], &["y"], vec![]),
        &[Some(2)],
        vec![],
    )
    .load()
    .unwrap();
    assert_eq!(only_op(&g), &Op::Softmax { axis: 1 });
    // Transpose default perm reverses the declared rank.
    let g = single(
        17,
        node("Transpose", "n", &["x"], &["y"], vec![]),
        &[None, Some(3), Some(4)],
        vec![],
    )
    .load()
    .unwrap();
    assert_eq!(
        only_op(&g),
        &Op::Transpose {
            perm: vec![2, 1, 0]
        }
    );
    // Transpose with a non-permutation is invalid.
    let r = single(
        17,
        node(
            "Transpose",
            "n",
            &["x"],
            &["y"],
            vec![a_ints("perm", &[0, 0])],
        ),
        &[Some(2)],
        vec![],
    )
    .load();
    assert!(matches!(r, Err(Error::InvalidModel(_))));
    // Gemm defaults and parsed flags.
    let mut m = M::new(17);
    m.inputs.push(vi("x", 1, &[Some(2), Some(3)]));
    m.inits.push(f32_typed("b", &[4, 3], &[0.0; 12]));
    m.nodes.push(node(
        "Gemm",
        "gemm",
        &["x", "b"],
        &["y"],
        vec![a_int("transB", 1), a_float("alpha", 2.0)],
    ));
    m.outputs.push(vi("y", 1, &[Some(2), Some(4)]));
    let g = m.load().unwrap();
    assert_eq!(
        only_op(&g),
        &Op::Gemm {
            alpha: 2.0,
            beta: 1.0,
            trans_a: false,
            trans_b: true,
            activation: None
        }
    );
}

#[test]
fn binary_ops_and_nary() {
    let mk = |op: &str, ins: &[&str]| {
        let mut m = M::new(17);
        m.inputs.push(vi("x", 1, &[Some(2)]));
        m.inputs.push(vi("z", 1, &[Some(2)]));
        m.inputs.push(vi("w", 1, &[Some(2)]));
        m.nodes.push(node(op, "nd", ins, &["y"], vec![]));
        m.outputs.push(vi("y", 1, &[Some(2)]));
        m.load()
    };
    assert_eq!(
        only_op(&mk("Max", &["x", "z"]).unwrap()),
        &Op::Binary(BinaryOp::Max)
    );
    assert_eq!(
        only_op(&mk("Sum", &["x", "z"]).unwrap()),
        &Op::Binary(BinaryOp::Add)
    );
    assert_eq!(
        only_op(&mk("Pow", &["x", "z"]).unwrap()),
        &Op::Binary(BinaryOp::Pow)
    );
    assert_eq!(
        only_op(&mk("Greater", &["x", "z"]).unwrap()),
        &Op::Binary(BinaryOp::Greater)
    );
    match mk("Min", &["x", "z", "w"]) {
        Err(Error::Unsupported(m)) => assert!(m.contains("Min") && m.contains("nd"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(mk("Add", &["x"]), Err(Error::InvalidModel(_))));
    assert!(matches!(mk("Add", &["x", ""]), Err(Error::InvalidModel(_))));
}

#[test]
fn opset_dependent_inputs() {
    // Split: attribute before 13, input from 13.
    let n = node(
        "Split",
        "s",
        &["x"],
        &["a", "b"],
        vec![a_int("axis", 1), a_ints("split", &[1, 3])],
    );
    let g = single(11, n, &[Some(2), Some(4)], vec![]).load().unwrap();
    assert_eq!(
        only_op(&g),
        &Op::Split {
            axis: 1,
            split: Some(vec![1, 3])
        }
    );
    assert_eq!(g.nodes[0].outputs.len(), 2);
    let n = node("Split", "s", &["x", "sp"], &["a", "b"], vec![]);
    let g = single(13, n, &[Some(4)], vec![i64_typed("sp", &[2], &[3, 1])])
        .load()
        .unwrap();
    assert_eq!(
        only_op(&g),
        &Op::Split {
            axis: 0,
            split: Some(vec![3, 1])
        }
    );
    assert_eq!(g.nodes[0].inputs.len(), 2);
    let n = node(
        "Split",
        "s",
        &["x"],
        &["a", "b", "c"],
        vec![a_int("num_outputs", 3)],
    );
    let g = single(18, n, &[Some(4)], vec![]).load().unwrap();
    assert_eq!(
        only_op(&g),
        &Op::Split {
            axis: 0,
            split: None
        }
    );
    let n = node(
        "Split",
        "s",
        &["x"],
        &["a", "b"],
        vec![a_int("num_outputs", 3)],
    );
    assert!(matches!(
        single(18, n, &[Some(4)], vec![]).load(),
        Err(Error::InvalidModel(_))
    ));

    // Squeeze / Unsqueeze axes.
    let n = node("Unsqueeze", "u", &["x"], &["y"], vec![a_ints("axes", &[0])]);
    assert_eq!(
        only_op(&single(11, n, &[Some(2)], vec![]).load().unwrap()),
        &Op::Unsqueeze {
            axes: Some(vec![0])
        }
    );
    let n = node("Unsqueeze", "u", &["x"], &["y"], vec![]);
    assert!(matches!(
        single(11, n, &[Some(2)], vec![]).load(),
        Err(Error::InvalidModel(_))
    ));
    let n = node("Unsqueeze", "u", &["x", "ax"], &["y"], vec![]);
    let g = single(13, n, &[Some(2)], vec![i64_typed("ax", &[1], &[-1])])
        .load()
        .unwrap();
    assert_eq!(
        only_op(&g),
        &Op::Unsqueeze {
            axes: Some(vec![-1])
        }
    );
    let n = node("Squeeze", "sq", &["x"], &["y"], vec![]);
    assert_eq!(
        only_op(&single(13, n, &[Some(1)], vec![]).load().unwrap()),
        &Op::Squeeze { axes: None }
    );

    // ReduceMean: axes input from 18; must be constant.
    let n = node(
        "ReduceMean",
        "rm",
        &["x", "ax"],
        &["y"],
        vec![a_int("keepdims", 0)],
    );
    let g = single(
        18,
        n,
        &[Some(2), Some(3)],
        vec![i64_typed("ax", &[1], &[1])],
    )
    .load()
    .unwrap();
    assert_eq!(
        only_op(&g),
        &Op::ReduceMean {
            axes: Some(vec![1]),
            keepdims: false
        }
    );
    assert_eq!(g.nodes[0].inputs.len(), 1);
    let mut m = M::new(18);
    m.inputs.push(vi("x", 1, &[Some(2)]));
    m.inputs.push(vi("ax", 7, &[Some(1)]));
    m.nodes
        .push(node("ReduceMean", "rm", &["x", "ax"], &["y"], vec![]));
    m.outputs.push(vi("y", 1, &[]));
    match m.load() {
        Err(Error::Unsupported(msg)) => {
            assert!(msg.contains("runtime") && msg.contains("rm"), "{msg}")
        }
        other => panic!("{other:?}"),
    }

    // Resize defaults and rejected modes.
    let n = node("Resize", "rs", &["x", "", "sc"], &["y"], vec![]);
    let g = single(13, n, &[Some(1)], vec![f32_typed("sc", &[1], &[2.0])])
        .load()
        .unwrap();
    assert_eq!(
        only_op(&g),
        &Op::Resize(ResizeAttrs {
            mode: ResizeMode::Nearest,
            coord: CoordMode::HalfPixel,
            nearest: NearestMode::RoundPreferFloor,
            layout: Layout::Nchw
        })
    );
    assert_eq!(g.nodes[0].inputs[1], None);
    let attrs = vec![
        a_str("mode", "linear"),
        a_str("coordinate_transformation_mode", "align_corners"),
    ];
    let g = single(
        13,
        node("Resize", "rs", &["x", "", "sc"], &["y"], attrs),
        &[Some(1)],
        vec![f32_typed("sc", &[1], &[2.0])],
    )
    .load()
    .unwrap();
    let Op::Resize(r) = only_op(&g) else { panic!() };
    assert_eq!(
        (r.mode, r.coord),
        (ResizeMode::Linear, CoordMode::AlignCorners)
    );
    let n = node(
        "Resize",
        "rs",
        &["x", "", "sc"],
        &["y"],
        vec![a_str("mode", "cubic")],
    );
    match single(13, n, &[Some(1)], vec![f32_typed("sc", &[1], &[2.0])]).load() {
        Err(Error::Unsupported(m)) => assert!(m.contains("cubic") && m.contains("rs"), "{m}"),
        other => panic!("{other:?}"),
    }
    // ScatterND reduction and Pad mode.
    let n = node(
        "ScatterND",
        "sc",
        &["x", "i", "u"],
        &["y"],
        vec![a_str("reduction", "add")],
    );
    let inits = vec![i64_typed("i", &[1, 1], &[0]), f32_typed("u", &[1], &[1.0])];
    assert!(matches!(
        single(16, n, &[Some(2)], inits).load(),
        Err(Error::Unsupported(_))
    ));
    let n = node(
        "Pad",
        "p",
        &["x", "pads"],
        &["y"],
        vec![a_str("mode", "reflect")],
    );
    let g = single(13, n, &[Some(2)], vec![i64_typed("pads", &[2], &[1, 1])])
        .load()
        .unwrap();
    assert_eq!(
        only_op(&g),
        &Op::Pad {
            mode: PadMode::Reflect
        }
    );
    let n = node(
        "Pad",
        "p",
        &["x", "pads"],
        &["y"],
        vec![a_str("mode", "wrap")],
    );
    assert!(matches!(
        single(19, n, &[Some(2)], vec![i64_typed("pads", &[2], &[1, 1])]).load(),
        Err(Error::Unsupported(_))
    ));
}

#[test]
fn unsupported_ops_and_domains_name_the_node() {
    let r = single(
        17,
        node("LSTM", "my_lstm", &["x"], &["y"], vec![]),
        &[Some(2)],
        vec![],
    )
    .load();
    match r {
        Err(Error::Unsupported(m)) => assert_eq!(m, "op LSTM (node 'my_lstm') is not supported"),
        other => panic!("{other:?}"),
    }
    let mut n = node("Relu", "ms_relu", &["x"], &["y"], vec![]);
    n.domain = Some("com.microsoft".into());
    match single(17, n, &[Some(2)], vec![]).load() {
        Err(Error::Unsupported(m)) => {
            assert!(m.contains("com.microsoft") && m.contains("ms_relu"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    // Unnamed nodes get an op-based name.
    match single(
        17,
        node("Einsum", "", &["x"], &["y"], vec![]),
        &[Some(2)],
        vec![],
    )
    .load()
    {
        Err(Error::Unsupported(m)) => assert!(m.contains("Einsum#0"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn opset_range_is_enforced() {
    let mk = |v: i64| {
        single(
            v,
            node("Relu", "r", &["x"], &["y"], vec![]),
            &[Some(2)],
            vec![],
        )
    };
    for v in [10, 26, 0] {
        match mk(v).load() {
            Err(Error::Unsupported(m)) => assert!(m.contains(&format!("opset {v}")), "{m}"),
            other => panic!("{v}: {other:?}"),
        }
    }
    for v in [11, 17, 21, 25] {
        assert_eq!(mk(v).load().unwrap().opset, v);
    }
    // "ai.onnx" is the default domain too; a model with only other domains is unsupported.
    let mut p = mk(17).proto();
    p.opset_import = vec![OperatorSetIdProto {
        domain: Some("ai.onnx".into()),
        version: Some(15),
    }];
    assert_eq!(load_model(&p.encode_to_vec()).unwrap().opset, 15);
    p.opset_import = vec![OperatorSetIdProto {
        domain: Some("ai.onnx.ml".into()),
        version: Some(2),
    }];
    assert!(matches!(
        load_model(&p.encode_to_vec()),
        Err(Error::Unsupported(_))
    ));
    p.opset_import.clear();
    assert!(matches!(
        load_model(&p.encode_to_vec()),
        Err(Error::InvalidModel(_))
    ));
}

#[test]
fn unsorted_nodes_are_sorted_and_cycles_rejected() {
    let mut m = M::new(17);
    m.inputs.push(vi("x", 1, &[Some(2)]));
    m.nodes.push(node("Relu", "c", &["b"], &["y"], vec![]));
    m.nodes.push(node("Neg", "b", &["a"], &["b"], vec![]));
    m.nodes.push(node("Abs", "a", &["x"], &["a"], vec![]));
    m.outputs.push(vi("y", 1, &[Some(2)]));
    let g = m.load().unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(g.outputs, vec![g.value_by_name("y").unwrap()]);
    assert_eq!(g.values[g.outputs[0]].declared, Some(vec![Some(2)]));

    m.nodes[2] = node("Add", "a", &["x", "y"], &["a"], vec![]);
    match m.load() {
        Err(Error::InvalidModel(msg)) => assert!(msg.contains("cycle"), "{msg}"),
        other => panic!("{other:?}"),
    }
    m.nodes[2] = node("Add", "a", &["x", "nowhere"], &["a"], vec![]);
    match m.load() {
        Err(Error::InvalidModel(msg)) => assert!(msg.contains("nowhere"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // Two producers of one value.
    m.nodes[2] = node("Abs", "a", &["x"], &["b"], vec![]);
    assert!(matches!(m.load(), Err(Error::InvalidModel(_))));
    // An output nobody produces.
    let mut m2 = single(
        17,
        node("Relu", "r", &["x"], &["y"], vec![]),
        &[Some(2)],
        vec![],
    );
    m2.outputs.push(vi("ghost", 1, &[]));
    assert!(matches!(m2.load(), Err(Error::InvalidModel(_))));
}

#[test]
fn inputs_declared_shapes_and_initializer_inputs() {
    let mut m = single(
        17,
        node("Add", "a", &["x", "w"], &["y"], vec![]),
        &[None, Some(3), Some(7)],
        vec![f32_typed("w", &[1], &[1.0])],
    );
    m.inputs.push(vi("w", 1, &[Some(1)])); // initializer listed as an input: not a runtime input
    m.outputs[0] = vi("y", 1, &[None, Some(3), Some(7)]);
    let g = m.load().unwrap();
    assert_eq!(g.inputs, vec![g.value_by_name("x").unwrap()]);
    let x = &g.values[g.inputs[0]];
    assert_eq!(x.declared, Some(vec![None, Some(3), Some(7)]));
    assert_eq!((x.dtype, x.shape.clone()), (DataType::F32, None));
    // Output dtype comes from the declaration; unknown intermediates default to F32.
    let mut m = M::new(17);
    m.inputs.push(vi("x", 1, &[Some(2)]));
    m.nodes.push(node("Shape", "s", &["x"], &["sh"], vec![]));
    m.nodes
        .push(node("Cast", "c", &["sh"], &["y"], vec![a_int("to", 6)]));
    m.outputs.push(vi("y", 6, &[Some(1)]));
    let g = m.load().unwrap();
    assert_eq!(g.values[g.outputs[0]].dtype, DataType::I32);
    assert_eq!(
        g.values[g.value_by_name("sh").unwrap()].dtype,
        DataType::F32
    );
}

#[test]
fn garbage_and_truncated_bytes_are_invalid() {
    for bytes in [
        &b"\xff\xff\xff\xff\xff"[..],
        b"hello world, not onnx",
        b"\x0a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    ] {
        assert!(
            matches!(load_model(bytes), Err(Error::InvalidModel(_))),
            "{bytes:?}"
        );
    }
    assert!(matches!(load_model(&[]), Err(Error::InvalidModel(_))));
    // Every prefix and many single-byte corruptions of a valid model: errors, never panics.
    let mut m = single(
        17,
        node(
            "Conv",
            "c",
            &["x", "w"],
            &["y"],
            vec![a_ints("strides", &[1, 1])],
        ),
        &[Some(1), Some(1), Some(4), Some(4)],
        vec![f32_raw("w", &[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0])],
    );
    m.nodes.insert(
        0,
        node(
            "Constant",
            "k",
            &[],
            &["unused"],
            vec![a_ints("value_ints", &[1, 2])],
        ),
    );
    let bytes = m.bytes();
    assert!(load_model(&bytes).is_ok());
    let mut ok = 0;
    for len in 0..bytes.len() {
        if load_model(&bytes[..len]).is_ok() {
            ok += 1;
        }
    }
    assert!(
        ok < bytes.len() / 2,
        "{ok} of {} prefixes loaded",
        bytes.len()
    );
    for i in 0..bytes.len() {
        for v in [0x00u8, 0xff, 0x7f, 0x80] {
            let mut b = bytes.clone();
            b[i] = v;
            let _ = load_model(&b);
        }
    }
}

fn model_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")).join(name)
}

fn histogram(g: &Graph) -> Vec<(&'static str, usize)> {
    let mut h = g.op_histogram();
    h.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    h
}

#[test]
fn real_model_efficientnet() {
    let g = load_file(&model_path("efficientnet-lite0.onnx")).unwrap();
    assert_eq!(g.opset, 17);
    assert_eq!(g.nodes.len(), 230);
    let want = [
        ("Conv", 49),
        ("Reshape", 35),
        ("Clip", 33),
        ("Cast", 17),
        ("Concat", 17),
        ("ConstantOfShape", 17),
        ("Pad", 17),
        ("Slice", 17),
        ("Transpose", 17),
        ("Add", 9),
        ("Gemm", 1),
        ("GlobalAveragePool", 1),
    ];
    assert_eq!(histogram(&g), want);
    assert_eq!(g.inputs.len(), 1);
    let x = &g.values[g.inputs[0]];
    assert_eq!(
        (x.name.as_str(), x.declared.clone()),
        ("input", Some(vec![Some(1), Some(3), Some(224), Some(224)]))
    );
    assert_eq!(g.outputs.len(), 1);
    assert_eq!(
        g.values[g.outputs[0]].declared,
        Some(vec![None, Some(1000)])
    );
    // 100 initializers + 220 Constant nodes are constants.
    assert_eq!(
        g.values.iter().filter(|v| v.constant.is_some()).count(),
        320
    );
    // Independent count with python onnx: elements of all constants read by nodes.
    assert_eq!(g.parameter_count(), 4_631_289);
}

#[test]
fn real_model_nanodet() {
    let g = load_file(&model_path("nanodet-m-416.onnx")).unwrap();
    assert_eq!(g.opset, 17);
    assert_eq!(g.nodes.len(), 136);
    let want = [
        ("Conv", 34),
        ("Pad", 29),
        ("LeakyRelu", 28),
        ("Concat", 12),
        ("Add", 6),
        ("Reshape", 6),
        ("Transpose", 6),
        ("Resize", 4),
        ("Sigmoid", 3),
        ("Split", 3),
        ("Cast", 2),
        ("Expand", 1),
        ("MaxPool", 1),
        ("ScatterND", 1),
    ];
    assert_eq!(histogram(&g), want);
    assert_eq!(g.outputs.len(), 6);
    assert_eq!(g.values[g.inputs[0]].name, "input_1:0");
    assert_eq!(g.parameter_count(), 3_786_095);
}

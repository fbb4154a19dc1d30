//! KServe v2 / Triton HTTP protocol (`/v2`): health, metadata and tensor inference, including
//! the binary tensor data extension.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use vigil_engine::{DataType, Tensor, TensorData, TensorInfo};

use super::metrics::{record_request, record_stage};
use super::{json_ok, status_only, ApiError, AppState};
use crate::registry::LoadedModel;

/// Header carrying the JSON header length of a binary-extension body.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// `GET /v2/health/live`.
pub async fn live() -> Response {
    status_only(StatusCode::OK)
}

/// `GET /v2/health/ready`: 200 once every configured model is loaded.
pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    if state.ready.load(std::sync::atomic::Ordering::Relaxed) {
        status_only(StatusCode::OK)
    } else {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server is not ready").into_response()
    }
}

/// `GET /v2`: server metadata.
pub async fn server_metadata() -> Response {
    json_ok(&json!({
        "name": "vigil",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data"],
    }))
}

fn tensor_meta(t: &TensorInfo) -> Value {
    json!({ "name": t.name, "datatype": t.dtype.kserve_name(), "shape": t.shape })
}

fn lookup(state: &AppState, name: &str) -> Result<Arc<LoadedModel>, ApiError> {
    state
        .registry
        .get(name)
        .ok_or_else(|| ApiError::unknown_model(name))
}

fn check_version(version: &str) -> Result<(), ApiError> {
    if version == "1" {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("unknown model version '{version}' (only '1' exists)"),
        ))
    }
}

/// `GET /v2/models/{name}`: model metadata.
pub async fn model_metadata(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let m = lookup(&state, &name)?;
    Ok(json_ok(&json!({
        "name": m.name,
        "versions": ["1"],
        "platform": "onnx",
        "inputs": m.inputs.iter().map(tensor_meta).collect::<Vec<_>>(),
        "outputs": m.outputs.iter().map(tensor_meta).collect::<Vec<_>>(),
    })))
}

/// `GET /v2/models/{name}/versions/{version}`.
pub async fn model_metadata_versioned(
    state: State<Arc<AppState>>,
    Path((name, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    check_version(&version)?;
    model_metadata(state, Path(name)).await
}

/// `GET /v2/models/{name}/ready`.
pub async fn model_ready(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    lookup(&state, &name)?;
    Ok(status_only(StatusCode::OK))
}

/// `GET /v2/models/{name}/versions/{version}/ready`.
pub async fn model_ready_versioned(
    state: State<Arc<AppState>>,
    Path((name, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    check_version(&version)?;
    model_ready(state, Path(name)).await
}

/// One input tensor of an inference request.
#[derive(Debug, Deserialize)]
struct RequestInput {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    data: Option<Value>,
}

/// One requested output.
#[derive(Debug, Deserialize)]
struct RequestOutput {
    name: String,
    #[serde(default)]
    parameters: Map<String, Value>,
}

/// The JSON part of an inference request.
#[derive(Debug, Deserialize)]
struct InferRequest {
    id: Option<String>,
    inputs: Vec<RequestInput>,
    outputs: Option<Vec<RequestOutput>>,
    #[serde(default)]
    parameters: Map<String, Value>,
}

fn param_bool(p: &Map<String, Value>, keys: &[&str]) -> Option<bool> {
    keys.iter().find_map(|k| p.get(*k).and_then(Value::as_bool))
}

/// Flattens (possibly nested) JSON arrays into their leaf values, in row-major order.
fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other),
    }
}

fn json_to_tensor(
    name: &str,
    dtype: DataType,
    shape: Vec<usize>,
    data: &Value,
) -> Result<Tensor, ApiError> {
    let mut leaves = Vec::new();
    flatten(data, &mut leaves);
    let want: usize = shape.iter().product();
    if leaves.len() != want {
        return Err(ApiError::bad_request(format!(
            "input '{name}': {} data elements for shape {shape:?} ({want} elements)",
            leaves.len()
        )));
    }
    let bad = |i: usize| {
        ApiError::bad_request(format!(
            "input '{name}': element {i} ({}) is not a valid {}",
            leaves[i],
            dtype.kserve_name()
        ))
    };
    fn ints<T: TryFrom<i64>>(
        leaves: &[&Value],
        bad: &dyn Fn(usize) -> ApiError,
    ) -> Result<Vec<T>, ApiError> {
        leaves
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_i64()
                    .and_then(|x| T::try_from(x).ok())
                    .ok_or_else(|| bad(i))
            })
            .collect()
    }
    let data = match dtype {
        DataType::F32 => TensorData::F32(
            leaves
                .iter()
                .enumerate()
                .map(|(i, v)| v.as_f64().map(|x| x as f32).ok_or_else(|| bad(i)))
                .collect::<Result<_, _>>()?,
        ),
        DataType::I64 => TensorData::I64(ints(&leaves, &bad)?),
        DataType::I32 => TensorData::I32(ints(&leaves, &bad)?),
        DataType::I8 => TensorData::I8(ints(&leaves, &bad)?),
        DataType::U8 => TensorData::U8(ints(&leaves, &bad)?),
        DataType::Bool => TensorData::Bool(
            leaves
                .iter()
                .enumerate()
                .map(|(i, v)| v.as_bool().map(u8::from).ok_or_else(|| bad(i)))
                .collect::<Result<_, _>>()?,
        ),
    };
    Tensor::new(shape, data).map_err(|e| ApiError::bad_request(format!("input '{name}': {e}")))
}

/// Splits a body into its JSON header and binary tail per `Inference-Header-Content-Length`.
fn split_body<'a>(headers: &HeaderMap, body: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), ApiError> {
    match headers.get(HEADER_LENGTH) {
        None => Ok((body, &[])),
        Some(v) => {
            let n: usize = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "Inference-Header-Content-Length must be a non-negative integer",
                    )
                })?;
            if n > body.len() {
                return Err(ApiError::bad_request(format!(
                    "Inference-Header-Content-Length {n} exceeds the body size {}",
                    body.len()
                )));
            }
            Ok(body.split_at(n))
        }
    }
}

/// Validates the request against the model signature and builds input tensors in model order.
fn build_inputs(
    model: &LoadedModel,
    req: &InferRequest,
    binary: &[u8],
) -> Result<Vec<Tensor>, ApiError> {
    let mut slots: Vec<Option<Tensor>> = vec![None; model.inputs.len()];
    let mut offset = 0usize;
    for inp in &req.inputs {
        let idx = model
            .inputs
            .iter()
            .position(|i| i.name == inp.name)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unknown input '{}'; model '{}' expects {:?}",
                    inp.name,
                    model.name,
                    model
                        .inputs
                        .iter()
                        .map(|i| i.name.as_str())
                        .collect::<Vec<_>>()
                ))
            })?;
        let info = &model.inputs[idx];
        if slots[idx].is_some() {
            return Err(ApiError::bad_request(format!(
                "input '{}' given twice",
                inp.name
            )));
        }
        if inp.datatype != info.dtype.kserve_name() {
            return Err(ApiError::bad_request(format!(
                "input '{}': datatype {} does not match the model's {}",
                inp.name,
                inp.datatype,
                info.dtype.kserve_name()
            )));
        }
        let shape_ok = inp.shape.len() == info.shape.len()
            && inp
                .shape
                .iter()
                .zip(&info.shape)
                .all(|(&a, &b)| a >= 0 && a as u64 == b as u64);
        if !shape_ok {
            return Err(ApiError::bad_request(format!(
                "input '{}': shape {:?} does not match the model's {:?}",
                inp.name, inp.shape, info.shape
            )));
        }
        let shape = info.shape.clone();
        let elems: usize = shape.iter().product();
        let tensor = match inp.parameters.get("binary_data_size") {
            Some(size) => {
                let size = size
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("input '{}': bad binary_data_size", inp.name))
                    })?;
                if inp.data.is_some() {
                    return Err(ApiError::bad_request(format!(
                        "input '{}' has both data and binary_data_size",
                        inp.name
                    )));
                }
                let want = elems * info.dtype.size();
                if size != want {
                    return Err(ApiError::bad_request(format!(
                        "input '{}': binary_data_size {size} but shape {:?} of {} needs {want} bytes",
                        inp.name,
                        info.shape,
                        info.dtype.kserve_name()
                    )));
                }
                let end = offset
                    .checked_add(size)
                    .filter(|&e| e <= binary.len())
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "input '{}': binary data ends after the body ({} bytes after the header)",
                            inp.name,
                            binary.len()
                        ))
                    })?;
                let t = Tensor::from_bytes(info.dtype, shape, &binary[offset..end])
                    .map_err(|e| ApiError::bad_request(format!("input '{}': {e}", inp.name)))?;
                offset = end;
                t
            }
            None => {
                let data = inp.data.as_ref().ok_or_else(|| {
                    ApiError::bad_request(format!("input '{}' has no data", inp.name))
                })?;
                json_to_tensor(&inp.name, info.dtype, shape, data)?
            }
        };
        slots[idx] = Some(tensor);
    }
    if offset != binary.len() {
        return Err(ApiError::bad_request(format!(
            "{} bytes of binary data after the header but inputs declare {offset}",
            binary.len()
        )));
    }
    slots
        .into_iter()
        .zip(&model.inputs)
        .map(|(t, info)| {
            t.ok_or_else(|| ApiError::bad_request(format!("missing input '{}'", info.name)))
        })
        .collect()
}

fn tensor_json_data(t: &Tensor) -> Value {
    match &t.data {
        TensorData::F32(v) => json!(v),
        TensorData::I64(v) => json!(v),
        TensorData::I32(v) => json!(v),
        TensorData::I8(v) => json!(v),
        TensorData::U8(v) => json!(v),
        TensorData::Bool(v) => json!(v.iter().map(|&b| b != 0).collect::<Vec<_>>()),
    }
}

/// Builds the response: JSON, or JSON header + binary tails when any output asks for binary.
fn build_response(
    model: &LoadedModel,
    req: &InferRequest,
    outputs: Vec<Tensor>,
) -> Result<Response, ApiError> {
    let default_binary =
        param_bool(&req.parameters, &["binary_data_output", "binary_data"]).unwrap_or(false);
    // (model output index, binary?) in response order.
    let selected: Vec<(usize, bool)> = match &req.outputs {
        Some(list) if !list.is_empty() => list
            .iter()
            .map(|o| {
                let idx = model
                    .outputs
                    .iter()
                    .position(|m| m.name == o.name)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("unknown output '{}' requested", o.name))
                    })?;
                Ok((
                    idx,
                    param_bool(&o.parameters, &["binary_data", "binary_data_output"])
                        .unwrap_or(default_binary),
                ))
            })
            .collect::<Result<_, ApiError>>()?,
        _ => (0..model.outputs.len())
            .map(|i| (i, default_binary))
            .collect(),
    };
    let mut json_outputs = Vec::with_capacity(selected.len());
    let mut tail: Vec<u8> = Vec::new();
    for &(idx, binary) in &selected {
        let t = outputs.get(idx).ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("model produced no output #{idx}"),
            )
        })?;
        let info = &model.outputs[idx];
        let mut o = json!({
            "name": info.name,
            "datatype": t.dtype().kserve_name(),
            "shape": t.shape,
        });
        if binary {
            let bytes = t.as_bytes();
            o["parameters"] = json!({ "binary_data_size": bytes.len() });
            tail.extend_from_slice(bytes);
        } else {
            o["data"] = tensor_json_data(t);
        }
        json_outputs.push(o);
    }
    let mut body =
        json!({ "model_name": model.name, "model_version": "1", "outputs": json_outputs });
    if let Some(id) = &req.id {
        body["id"] = json!(id);
    }
    let header_bytes = serde_json::to_vec(&body).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode response: {e}"),
        )
    })?;
    if selected.iter().any(|s| s.1) {
        let len = header_bytes.len();
        let mut all = header_bytes;
        all.extend_from_slice(&tail);
        let mut resp = (StatusCode::OK, all).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        h.insert(HEADER_LENGTH, HeaderValue::from(len));
        Ok(resp)
    } else {
        let mut resp = (StatusCode::OK, header_bytes).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Ok(resp)
    }
}

async fn infer_tensors(
    state: &AppState,
    model: Arc<LoadedModel>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let (json_part, binary) = split_body(headers, body)?;
    let req: InferRequest = serde_json::from_slice(json_part)
        .map_err(|e| ApiError::bad_request(format!("invalid inference request JSON: {e}")))?;
    let inputs = build_inputs(&model, &req, binary)?;
    let job = model.queue.execute(move |exec| {
        let t = Instant::now();
        exec.run(&inputs)
            .map(|o| (o, t.elapsed().as_secs_f64() * 1e3))
    });
    let (outputs, inference_ms) =
        tokio::time::timeout(Duration::from_millis(state.limits.request_timeout_ms), job)
            .await
            .map_err(|_| ApiError::new(StatusCode::GATEWAY_TIMEOUT, "request timed out"))??
            .map_err(|e| ApiError::from_engine(e, false))?;
    let resp = build_response(&model, &req, outputs)?;
    record_stage(&model.name, "inference", inference_ms);
    record_stage(&model.name, "total", started.elapsed().as_secs_f64() * 1e3);
    Ok(resp)
}

/// `POST /v2/models/{name}/infer`.
pub async fn infer(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(model) = state.registry.get(&name) else {
        return ApiError::unknown_model(&name).into_response();
    };
    let resp = match infer_tensors(&state, model, &headers, &body).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(model = %name, status = e.status.as_u16(), error = %e.message, "request failed");
            e.into_response()
        }
    };
    record_request(&name, resp.status().as_u16());
    resp
}

/// `POST /v2/models/{name}/versions/{version}/infer`.
pub async fn infer_versioned(
    state: State<Arc<AppState>>,
    Path((name, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = check_version(&version) {
        return e.into_response();
    }
    infer(state, Path(name), headers, body).await
}

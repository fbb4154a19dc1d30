//! One logging path: `tracing` events go either to the systemd journal (native protocol, through
//! `systemd-journal-logger`) or to stderr in human-readable form.
//!
//! The journal is chosen when systemd connected stderr to it (`JOURNAL_STREAM` matches stderr's
//! device and inode, see `systemd.exec(5)`) and the journal socket answers; otherwise stderr.
//! [`JournalLayer`] turns each event into a `log::Record` whose key-values become journal fields;
//! fields of the enclosing spans are included, and the well-known ones get stable names:
//! `MODEL`, `CAMERA`, `REQUEST_ID` and `LATENCY_MS` (see [`journal_fields`]).

use std::fmt::Write as _;

use systemd_journal_logger::JournalLog;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Where logs go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    /// The systemd journal, with structured fields.
    Journal,
    /// stderr, human-readable.
    Stderr,
}

/// Installs the process-wide subscriber (journal or stderr, `RUST_LOG` filter, default `info`).
pub fn init() -> Sink {
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let mut journal_error = None;
    if systemd_journal_logger::connected_to_journal() {
        match JournalLog::new() {
            Ok(j) => {
                let layer = JournalLayer::new(j.with_syslog_identifier("vigil".to_string()));
                tracing_subscriber::registry()
                    .with(filter())
                    .with(layer)
                    .init();
                return Sink::Journal;
            }
            Err(e) => journal_error = Some(e),
        }
    }
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if let Some(e) = journal_error {
        tracing::warn!(error = %e, "JOURNAL_STREAM is set but the journal socket does not answer; logging to stderr");
    }
    Sink::Stderr
}

/// Fields recorded on one span or event, in order.
#[derive(Clone, Debug, Default)]
pub struct Fields(pub Vec<(String, String)>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_string(), value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .push((field.name().to_string(), format!("{value:?}")));
    }
}

/// A span's name and fields, as [`journal_fields`] sees them.
pub struct SpanFields<'a> {
    /// The span's name (`request` for HTTP requests).
    pub name: &'a str,
    /// Its recorded fields.
    pub fields: &'a Fields,
}

/// The model name in an API path (`/v1/models/{name}/...`, `/v2/models/{name}...`).
fn model_from_path(path: &str) -> Option<&str> {
    let rest = path
        .strip_prefix("/v1/models/")
        .or_else(|| path.strip_prefix("/v2/models/"))?;
    let name = rest.split('/').next()?;
    (!name.is_empty()).then_some(name)
}

/// Journal fields for an event: the fields of its spans (root first), then its own (without
/// `message`). Names are upper-cased by the journal logger; these are renamed for stable queries:
/// `model` → `MODEL`, `camera` → `CAMERA`, `request_id` and the `request` span's `id` →
/// `REQUEST_ID`, `latency_ms` and an event's `ms` inside a `request` span → `LATENCY_MS`.
/// Without a `model` field, `MODEL` is taken from the request path. Later values win.
pub fn journal_fields(spans: &[SpanFields<'_>], event: &Fields) -> Vec<(String, String)> {
    fn put(out: &mut Vec<(String, String)>, k: &str, v: &str) {
        if let Some(slot) = out.iter_mut().find(|(key, _)| key == k) {
            slot.1 = v.to_string();
        } else {
            out.push((k.to_string(), v.to_string()));
        }
    }
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_request = false;
    let mut path_model = None;
    for s in spans {
        let is_request = s.name == "request";
        in_request |= is_request;
        for (k, v) in &s.fields.0 {
            let name = match (is_request, k.as_str()) {
                (true, "id") => "REQUEST_ID".to_string(),
                (true, "path") => {
                    path_model = model_from_path(v).map(str::to_string);
                    "HTTP_PATH".to_string()
                }
                (true, "method") => "HTTP_METHOD".to_string(),
                _ => well_known(k),
            };
            put(&mut out, &name, v);
        }
    }
    for (k, v) in &event.0 {
        if k == "message" {
            continue;
        }
        let name = if in_request && k == "ms" {
            "LATENCY_MS".to_string()
        } else {
            well_known(k)
        };
        put(&mut out, &name, v);
    }
    if let Some(m) = path_model {
        if !out.iter().any(|(k, _)| k == "MODEL") {
            put(&mut out, "MODEL", &m);
        }
    }
    out
}

fn well_known(key: &str) -> String {
    match key {
        "model" => "MODEL".into(),
        "camera" => "CAMERA".into(),
        "request_id" => "REQUEST_ID".into(),
        "latency_ms" => "LATENCY_MS".into(),
        other => other.to_ascii_uppercase(),
    }
}

/// The human-readable `MESSAGE`: the event's message followed by its own fields, as on stderr.
pub fn message_text(event: &Fields) -> String {
    let mut text = String::new();
    for (k, v) in &event.0 {
        if k == "message" {
            text.insert_str(0, v);
        }
    }
    for (k, v) in &event.0 {
        if k != "message" {
            let _ = write!(text, " {k}={v}");
        }
    }
    text.trim_start().to_string()
}

struct Kvs<'a>(&'a [(String, String)]);

impl log::kv::Source for Kvs<'_> {
    fn visit<'kvs>(
        &'kvs self,
        visitor: &mut dyn log::kv::VisitSource<'kvs>,
    ) -> Result<(), log::kv::Error> {
        for (k, v) in self.0 {
            visitor.visit_pair(log::kv::Key::from_str(k), log::kv::Value::from(v.as_str()))?;
        }
        Ok(())
    }

    fn count(&self) -> usize {
        self.0.len()
    }
}

/// A `tracing` layer that sends every event to the journal as a `log::Record` with key-values.
pub struct JournalLayer {
    journal: JournalLog,
}

impl JournalLayer {
    /// A layer over a connected journal logger.
    pub fn new(journal: JournalLog) -> JournalLayer {
        JournalLayer { journal }
    }
}

fn log_level(l: &Level) -> log::Level {
    match *l {
        Level::ERROR => log::Level::Error,
        Level::WARN => log::Level::Warn,
        Level::INFO => log::Level::Info,
        Level::DEBUG => log::Level::Debug,
        Level::TRACE => log::Level::Trace,
    }
}

impl<S> Layer<S> for JournalLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id) {
            let mut f = Fields::default();
            attrs.record(&mut f);
            span.extensions_mut().insert(f);
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id) {
            let mut ext = span.extensions_mut();
            if let Some(f) = ext.get_mut::<Fields>() {
                values.record(f);
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut own = Fields::default();
        event.record(&mut own);
        let mut span_data: Vec<(&'static str, Fields)> = Vec::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                let fields = span
                    .extensions()
                    .get::<Fields>()
                    .cloned()
                    .unwrap_or_default();
                span_data.push((span.name(), fields));
            }
        }
        let spans: Vec<SpanFields<'_>> = span_data
            .iter()
            .map(|(name, fields)| SpanFields { name, fields })
            .collect();
        let kvs = journal_fields(&spans, &own);
        let text = message_text(&own);
        let meta = event.metadata();
        let source = Kvs(&kvs);
        // A lost log line must never take the daemon down.
        let _ = self.journal.journal_send(
            &log::Record::builder()
                .level(log_level(meta.level()))
                .target(meta.target())
                .module_path(meta.module_path())
                .file(meta.file())
                .line(meta.line())
                .args(format_args!("{text}"))
                .key_values(&source)
                .build(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(pairs: &[(&str, &str)]) -> Fields {
        Fields(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn get<'a>(kv: &'a [(String, String)], k: &str) -> Option<&'a str> {
        kv.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn request_span_fields_become_well_known_journal_fields() {
        let span = f(&[
            ("id", "abc-000001"),
            ("method", "POST"),
            ("path", "/v1/models/people/infer"),
        ]);
        let event = f(&[("message", "done"), ("status", "200"), ("ms", "12.5")]);
        let kv = journal_fields(
            &[SpanFields {
                name: "request",
                fields: &span,
            }],
            &event,
        );
        assert_eq!(get(&kv, "REQUEST_ID"), Some("abc-000001"));
        assert_eq!(get(&kv, "MODEL"), Some("people"));
        assert_eq!(get(&kv, "LATENCY_MS"), Some("12.5"));
        assert_eq!(get(&kv, "STATUS"), Some("200"));
        assert_eq!(get(&kv, "HTTP_PATH"), Some("/v1/models/people/infer"));
        assert_eq!(get(&kv, "MS"), None);
        assert_eq!(get(&kv, "MESSAGE"), None);
        assert_eq!(message_text(&event), "done status=200 ms=12.5");
    }

    #[test]
    fn explicit_model_and_camera_fields_win_and_ms_outside_requests_stays_ms() {
        let span = f(&[("camera", "gate-1")]);
        let event = f(&[
            ("message", "frame"),
            ("model", "nanodet"),
            ("ms", "3"),
            ("latency_ms", "7"),
        ]);
        let kv = journal_fields(
            &[SpanFields {
                name: "camera",
                fields: &span,
            }],
            &event,
        );
        assert_eq!(get(&kv, "CAMERA"), Some("gate-1"));
        assert_eq!(get(&kv, "MODEL"), Some("nanodet"));
        assert_eq!(get(&kv, "MS"), Some("3"));
        assert_eq!(get(&kv, "LATENCY_MS"), Some("7"));
        assert_eq!(get(&kv, "REQUEST_ID"), None);
    }

    #[test]
    fn model_from_path_accepts_both_apis_and_rejects_others() {
        assert_eq!(model_from_path("/v2/models/m1/infer"), Some("m1"));
        assert_eq!(model_from_path("/v2/models/m1"), Some("m1"));
        assert_eq!(model_from_path("/v1/models"), None);
        assert_eq!(model_from_path("/v1/models/"), None);
        assert_eq!(model_from_path("/metrics"), None);
    }
}

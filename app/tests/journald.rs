//! The journald records of the real `vigil serve`: the test binds a datagram socket where the
//! journal's would be and parses the native protocol's fields.
//!
//! `systemd-journal-logger` always sends to `/run/systemd/journal/socket`, so the daemon runs in
//! its own mount namespace (`unshare --mount`, as root) with a tmpfs over `/run` whose
//! `systemd/journal/socket` is a symlink to the test's socket. Its stderr is a file and
//! `JOURNAL_STREAM` names that file's device and inode, exactly as systemd does for a unit whose
//! output goes to the journal. Without the privilege for a mount namespace the test says SKIP.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = "efficientnet-lite0";

type Record = BTreeMap<String, String>;

/// Parses one native-protocol datagram: `KEY=value\n` lines, or `KEY\n` + 64-bit LE length +
/// bytes + `\n` for values that may hold newlines.
fn parse_native(mut b: &[u8]) -> Result<Record, String> {
    let mut out = Record::new();
    while !b.is_empty() {
        let sep = b
            .iter()
            .position(|&c| c == b'=' || c == b'\n')
            .ok_or("field name without '=' or newline")?;
        let name = String::from_utf8_lossy(&b[..sep]).into_owned();
        if name.is_empty()
            || !name
                .bytes()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
        {
            return Err(format!("invalid field name {name:?}"));
        }
        if b[sep] == b'=' {
            let rest = &b[sep + 1..];
            let end = rest
                .iter()
                .position(|&c| c == b'\n')
                .ok_or("value without newline")?;
            out.insert(name, String::from_utf8_lossy(&rest[..end]).into_owned());
            b = &rest[end + 1..];
        } else {
            let rest = &b[sep + 1..];
            let len_bytes: [u8; 8] = rest
                .get(..8)
                .ok_or("short length")?
                .try_into()
                .map_err(|_| "length")?;
            let len = usize::try_from(u64::from_le_bytes(len_bytes)).map_err(|_| "huge length")?;
            let value = rest.get(8..8 + len).ok_or("short value")?;
            if rest.get(8 + len) != Some(&b'\n') {
                return Err("value not followed by newline".into());
            }
            out.insert(name, String::from_utf8_lossy(value).into_owned());
            b = &rest[8 + len + 1..];
        }
    }
    Ok(out)
}

#[test]
fn native_protocol_parser_reads_both_field_forms() {
    let mut b = b"PRIORITY=5\nMESSAGE\n".to_vec();
    b.extend_from_slice(&5u64.to_le_bytes());
    b.extend_from_slice(b"a\nb=c\nMODEL=m\n");
    let r = parse_native(&b).expect("parse");
    assert_eq!(r.get("PRIORITY").map(String::as_str), Some("5"));
    assert_eq!(r.get("MESSAGE").map(String::as_str), Some("a\nb=c"));
    assert_eq!(r.get("MODEL").map(String::as_str), Some("m"));
    assert!(parse_native(b"lower=1\n").is_err());
    assert!(parse_native(b"A=1").is_err());
}

struct Daemon {
    child: Child,
    sock: UnixDatagram,
    dir: PathBuf,
    stderr: PathBuf,
    records: Vec<Record>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Daemon {
    /// Receives records until one matches `pred`, keeping all of them.
    fn wait_for(&mut self, what: &str, pred: impl Fn(&Record) -> bool) -> Record {
        if let Some(r) = self.records.iter().find(|r| pred(r)) {
            return r.clone();
        }
        let end = Instant::now() + Duration::from_secs(300);
        let mut buf = vec![0u8; 256 * 1024];
        while Instant::now() < end {
            if let Ok(Some(s)) = self.child.try_wait() {
                panic!(
                    "vigil exited with {s} before logging {what}; stderr:\n{}",
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                );
            }
            self.sock
                .set_read_timeout(Some(Duration::from_secs(1)))
                .expect("timeout");
            let Ok(n) = self.sock.recv(&mut buf) else {
                continue;
            };
            if n == 0 {
                continue; // the logger's connection check
            }
            let r = parse_native(&buf[..n])
                .unwrap_or_else(|e| panic!("bad datagram ({e}): {:?}", &buf[..n]));
            self.records.push(r.clone());
            if pred(&r) {
                return r;
            }
        }
        panic!("no journal record for {what}; got {:#?}", self.records);
    }
}

fn message_starts(r: &Record, prefix: &str) -> bool {
    r.get("MESSAGE").is_some_and(|m| m.starts_with(prefix))
}

fn png() -> Vec<u8> {
    let img = image::RgbImage::from_fn(64, 48, |x, y| {
        image::Rgb([(x * 4) as u8, (y * 5) as u8, 90])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .expect("encode png");
    out.into_inner()
}

#[test]
fn journal_records_carry_model_request_id_and_latency_fields() {
    let probe = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        println!("SKIP: journald record test because this process cannot create a mount namespace (unshare --mount needs root/CAP_SYS_ADMIN)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("vigil-journal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\n[limits]\nworkers = 1\n\n[[models]]\nname = \"{MODEL}\"\n\
             path = \"{}\"\ntask = \"classification\"\nlabels = \"{}\"\nthreads = 1\n",
            models.join("efficientnet-lite0.onnx").display(),
            models.join("imagenet-labels.txt").display()
        ),
    )
    .expect("config");
    let sock_path = dir.join("journal.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind journal socket");
    let stderr_path = dir.join("stderr.log");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let meta = stderr.metadata().expect("stat");
    let journal_stream = format!("{}:{}", meta.dev(), meta.ino());
    let script = "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && \
                  ln -s \"$TEST_JOURNAL_SOCKET\" /run/systemd/journal/socket && \
                  exec \"$TEST_VIGIL\" serve --config \"$TEST_CONFIG\"";
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("TEST_JOURNAL_SOCKET", &sock_path)
        .env("TEST_VIGIL", env!("CARGO_BIN_EXE_vigil"))
        .env("TEST_CONFIG", &config)
        .env("JOURNAL_STREAM", &journal_stream)
        .env("RUST_LOG", "info")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove(vigil::service::fault::STALL_ENGINE_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn unshare");
    let mut d = Daemon {
        child,
        sock,
        dir,
        stderr: stderr_path,
        records: Vec::new(),
    };

    let loaded = d.wait_for("model loaded", |r| message_starts(r, "model loaded"));
    assert_eq!(loaded.get("MODEL").map(String::as_str), Some(MODEL));
    assert_eq!(loaded.get("PRIORITY").map(String::as_str), Some("5"));
    assert_eq!(
        loaded.get("SYSLOG_IDENTIFIER").map(String::as_str),
        Some("vigil")
    );
    assert_eq!(
        loaded.get("TASK").map(String::as_str),
        Some("classification")
    );
    let listening = d.wait_for("vigil listening", |r| message_starts(r, "vigil listening"));
    let addr = listening.get("ADDR").expect("ADDR field").clone();

    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent
        .post(&format!("http://{addr}/v1/models/{MODEL}/infer"))
        .header("content-type", "image/png")
        .header("x-request-id", "journal-test-42")
        .send(&png()[..])
        .expect("infer request");
    assert_eq!(resp.status().as_u16(), 200);
    let body: serde_json::Value =
        serde_json::from_str(&resp.body_mut().read_to_string().expect("body")).expect("json");
    let handler_ms = body["timings"]["total_ms"].as_f64().expect("total_ms");

    let done = d.wait_for("the request's completion", |r| {
        r.get("REQUEST_ID").map(String::as_str) == Some("journal-test-42")
            && message_starts(r, "done")
    });
    assert_eq!(
        done.get("MODEL").map(String::as_str),
        Some(MODEL),
        "{done:?}"
    );
    assert_eq!(
        done.get("STATUS").map(String::as_str),
        Some("200"),
        "{done:?}"
    );
    assert_eq!(
        done.get("HTTP_METHOD").map(String::as_str),
        Some("POST"),
        "{done:?}"
    );
    let latency: f64 = done
        .get("LATENCY_MS")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric LATENCY_MS in {done:?}"));
    // The middleware's latency encloses the handler's own end-to-end time.
    assert!(
        latency >= handler_ms,
        "LATENCY_MS {latency} < handler total_ms {handler_ms}"
    );
    assert!(
        done.contains_key("CODE_FILE") && done.contains_key("TARGET"),
        "{done:?}"
    );

    // One logging path: nothing went to stderr.
    let stderr = std::fs::read_to_string(&d.stderr).unwrap_or_default();
    assert!(
        !stderr.contains("vigil listening"),
        "stderr also got logs:\n{stderr}"
    );
}

//! Plays systemd for the real `vigil serve` binary: a `NOTIFY_SOCKET` datagram socket and
//! `WATCHDOG_USEC`, then checks `READY=1` comes only after the model is loaded and warmed up,
//! `WATCHDOG=1` keeps coming, `STOPPING=1` arrives on SIGTERM, and a stalled engine
//! (`VIGIL_FAULT_STALL_ENGINE_MS`) stops the pings.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = "efficientnet-lite0";

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models")
}

/// A running `vigil serve` with our notify socket; killed and cleaned up on drop.
struct Daemon {
    child: Child,
    sock: UnixDatagram,
    dir: PathBuf,
    log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(tag: &str, env: &[(&str, &str)]) -> Daemon {
    let dir = std::env::temp_dir().join(format!("vigil-notify-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let models = models_dir();
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
    .expect("write config");
    let sock_path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind notify socket");
    let log = dir.join("stderr.log");
    let stderr = std::fs::File::create(&log).expect("log file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigil"));
    cmd.args(["serve", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &sock_path)
        .env_remove("JOURNAL_STREAM")
        .env_remove("WATCHDOG_PID")
        .env_remove(fault_env())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn vigil serve");
    Daemon {
        child,
        sock,
        dir,
        log,
    }
}

fn fault_env() -> &'static str {
    vigil::service::fault::STALL_ENGINE_ENV
}

impl Daemon {
    /// The next notification datagram, or None once `timeout` has passed without one.
    fn recv(&mut self, timeout: Duration) -> Option<String> {
        self.sock
            .set_read_timeout(Some(timeout))
            .expect("read timeout");
        let mut buf = vec![0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(_) => None,
        }
    }

    /// Receives until a message has `line` as one of its lines; returns it and everything before.
    fn wait_for(&mut self, line: &str, timeout: Duration) -> (String, Vec<String>) {
        let end = Instant::now() + timeout;
        let mut seen = Vec::new();
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "vigil exited with {status} before sending {line}; log:\n{}",
                    self.log_text()
                );
            }
            if let Some(msg) = self.recv(left.min(Duration::from_secs(1))) {
                if msg.lines().any(|l| l == line) {
                    return (msg, seen);
                }
                seen.push(msg);
            }
        }
        panic!(
            "no {line} within {timeout:?}; got {seen:?}; log:\n{}",
            self.log_text()
        );
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn status_of(msg: &str) -> Option<&str> {
    msg.lines().find_map(|l| l.strip_prefix("STATUS="))
}

/// The listen address from the ready status ("... on 127.0.0.1:PORT; ...").
fn addr_from_status(status: &str) -> String {
    let after = status
        .split(" on ")
        .nth(1)
        .unwrap_or_else(|| panic!("no address in status {status:?}"));
    after.split(';').next().unwrap_or(after).trim().to_string()
}

fn get(url: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut resp = agent
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    (status, body)
}

#[test]
fn ready_only_after_load_and_warm_up_then_watchdog_pings_and_stopping_on_sigterm() {
    let mut d = start("ready", &[("WATCHDOG_USEC", "4000000")]);
    let (ready, before) = d.wait_for("READY=1", Duration::from_secs(300));

    // Everything that happened before READY=1 is already in the log: the model was loaded and
    // ran its warm-up inference first.
    let log = d.log_text();
    let loaded = log
        .find("model loaded")
        .unwrap_or_else(|| panic!("no 'model loaded' before READY=1; log:\n{log}"));
    let warmed = log
        .find("model warmed up")
        .unwrap_or_else(|| panic!("no 'model warmed up' before READY=1; log:\n{log}"));
    assert!(loaded < warmed, "warm-up logged before load:\n{log}");
    assert!(log[loaded..].contains(MODEL), "{log}");
    assert!(
        !before.iter().any(|m| m.lines().any(|l| l == "WATCHDOG=1")),
        "watchdog pings before READY=1: {before:?}"
    );
    let statuses: Vec<&str> = before.iter().filter_map(|m| status_of(m)).collect();
    assert!(
        statuses.first().is_some_and(|s| s.starts_with("loading")),
        "{statuses:?}"
    );
    assert!(
        statuses.iter().any(|s| s.starts_with("warming up")),
        "{statuses:?}"
    );

    // The ready status names the models and the cameras, and the port answers with the model.
    let status = status_of(&ready).expect("STATUS= with READY=1");
    assert!(
        status.starts_with("serving 1 models (efficientnet-lite0)"),
        "{status}"
    );
    assert!(status.contains("cameras up: 0"), "{status}");
    let addr = addr_from_status(status);
    let (code, body) = get(&format!("http://{addr}/v1/models"));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(MODEL), "{body}");

    // WATCHDOG=1 keeps coming while idle (the idle probes keep the heartbeat fresh).
    for _ in 0..4 {
        d.wait_for("WATCHDOG=1", Duration::from_secs(120));
    }

    // SIGTERM: STOPPING=1, then a clean exit.
    let pid = d.child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let (stopping, _) = d.wait_for("STOPPING=1", Duration::from_secs(60));
    assert!(
        status_of(&stopping).is_some_and(|s| s.starts_with("SIGTERM")),
        "{stopping}"
    );
    let end = Instant::now() + Duration::from_secs(60);
    let code = loop {
        if let Some(s) = d.child.try_wait().expect("try_wait") {
            break s;
        }
        assert!(Instant::now() < end, "vigil did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "exit status {code}; log:\n{}", d.log_text());
    assert!(d.log_text().contains("shut down"));
}

#[test]
fn a_stalled_engine_stops_the_watchdog_pings() {
    let mut d = start(
        "stall",
        &[("WATCHDOG_USEC", "2000000"), (fault_env(), "600000")],
    );
    // The warm-up is exempt from the fault: the service still becomes ready.
    d.wait_for("READY=1", Duration::from_secs(300));
    // The first idle probe hangs; once the heartbeat is older than WatchdogSec/2 the daemon says
    // so and withholds the pings.
    let end = Instant::now() + Duration::from_secs(120);
    let withheld = loop {
        let left = end
            .checked_duration_since(Instant::now())
            .unwrap_or_else(|| panic!("no 'watchdog withheld' status; log:\n{}", d.log_text()));
        if let Some(msg) = d.recv(left.min(Duration::from_secs(1))) {
            if status_of(&msg).is_some_and(|s| s.starts_with("watchdog withheld")) {
                break msg;
            }
        }
    };
    assert!(withheld.contains(MODEL), "{withheld}");
    // From then on no WATCHDOG=1 comes: systemd would kill and restart the service.
    let quiet_until = Instant::now() + Duration::from_secs(5);
    while let Some(left) = quiet_until.checked_duration_since(Instant::now()) {
        if let Some(msg) = d.recv(left) {
            assert!(
                !msg.lines().any(|l| l == "WATCHDOG=1"),
                "a ping came while the engine was stalled: {msg}"
            );
        }
    }
    assert!(d.log_text().contains("withholding watchdog pings"));
}

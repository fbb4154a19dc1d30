//! `vigil bench --paced`, driven over real pipes with the real EfficientNet-Lite0 model: each
//! stdin count is answered by one JSON line of that many latencies, and a line that is not a
//! count ends the process with a clear error.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

fn paced() -> std::process::Child {
    let models = concat!(env!("CARGO_MANIFEST_DIR"), "/../models");
    Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["bench", "--models-dir", models, "efficientnet-lite0"])
        .args(["--threads", "1", "--warmup", "1", "--paced"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vigil bench --paced")
}

#[test]
fn each_count_is_answered_by_that_many_latencies() {
    let mut child = paced();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for n in [2usize, 3] {
        // A blank line between requests is skipped, not answered.
        writeln!(stdin, "{n}\n").unwrap();
        stdin.flush().unwrap();
        let line = lines.next().expect("a reply line").unwrap();
        let v: Vec<f64> = serde_json::from_str(&line).unwrap();
        assert_eq!(v.len(), n, "{line}");
        assert!(v.iter().all(|&ms| ms.is_finite() && ms > 0.0), "{line}");
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "no reply after end of input");
}

#[test]
fn a_line_that_is_not_a_count_is_a_clear_error() {
    let mut child = paced();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "1\nabc").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("line 2: expected a count of iterations, got 'abc'"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // The count before the bad line was still answered.
    let replies: Vec<Vec<f64>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].len(), 1);
}

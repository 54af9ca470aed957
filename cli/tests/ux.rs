//! Everyday use of the binary as an operator meets it: a user error is one line
//! even with RUST_BACKTRACE=1, logs off a terminal carry no colour codes, the
//! JSON log format is one object a line, the device plugin takes `--socket`
//! like every other subcommand (and its old `--manager-socket`), and
//! `demo --json` streams numbers.

use std::process::{Command, Output, Stdio};

fn tessera(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tessera"));
    c.args(args)
        .env_remove("RUST_LOG")
        .env_remove("TESSERA_LOG_FORMAT")
        .env_remove("TESSERA_CONFIG")
        .env_remove("TESSERA_SOCKET")
        .stdin(Stdio::null());
    for (k, v) in envs {
        c.env(k, v);
    }
    // stdout and stderr are pipes: not a terminal, as under `kubectl logs`.
    c.output().expect("tessera runs")
}

/// `tessera device-plugin` with a config file that does not exist: a user
/// error after the first log line.
fn plugin_with_missing_config(extra: &[&str], envs: &[(&str, &str)]) -> (Output, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-config.yaml");
    let missing = missing.to_str().expect("utf-8");
    let mut args = vec![
        "device-plugin",
        "--node-name",
        "n1",
        "--kube",
        "off",
        "--no-pod-resources",
        "--config",
        missing,
    ];
    args.extend_from_slice(extra);
    let out = tessera(&args, envs);
    (out, missing.to_owned())
}

#[test]
fn a_user_error_is_one_line_without_a_backtrace_even_with_rust_backtrace() {
    for bt in ["1", "full"] {
        let (out, missing) = plugin_with_missing_config(&[], &[("RUST_BACKTRACE", bt)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(errors.len(), 1, "one error line: {err}");
        assert!(errors[0].contains(&missing), "names the file: {err}");
        assert!(
            !err.contains("backtrace") && !err.contains("Stack") && !err.contains("  0: "),
            "RUST_BACKTRACE={bt} printed a backtrace:\n{err}"
        );
    }
    // A bad flag value too (clap's own message, exit 2).
    let out = tessera(
        &["device-plugin", "--config-poll", "soon"],
        &[("RUST_BACKTRACE", "1")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--config-poll") && !err.contains("backtrace"),
        "{err}"
    );
}

#[test]
fn logs_off_a_terminal_are_plain_text() {
    let (out, _) = plugin_with_missing_config(&[], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("starting the device plugin"),
        "the info line is logged: {err}"
    );
    assert!(
        !err.contains('\x1b'),
        "ANSI escape codes in piped logs: {err:?}"
    );
}

#[test]
fn json_log_format_is_one_object_a_line() {
    for how in [
        (vec!["--log-format", "json"], vec![]),
        (vec![], vec![("TESSERA_LOG_FORMAT", "json")]),
    ] {
        let (out, _) = plugin_with_missing_config(&how.0, &how.1);
        let err = String::from_utf8_lossy(&out.stderr);
        let logs: Vec<serde_json::Value> = err
            .lines()
            .filter(|l| !l.starts_with("error: "))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
            .collect();
        let start = logs
            .iter()
            .find(|v| v["fields"]["message"] == "starting the device plugin")
            .unwrap_or_else(|| panic!("no start line: {err}"));
        assert_eq!(start["level"], "INFO");
        assert_eq!(start["fields"]["node"], "n1");
        assert!(!err.contains('\x1b'));
    }
    let out = tessera(&["--log-format", "yaml", "status"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("yaml"));
}

#[test]
fn the_device_plugin_takes_socket_like_every_subcommand() {
    let help = tessera(&["device-plugin", "--help"], &[]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--socket <PATH>"), "{help}");
    assert!(
        !help.contains("--manager-socket"),
        "the old name is hidden: {help}"
    );
    for flag in ["--socket", "--manager-socket"] {
        let (out, _) = plugin_with_missing_config(&[flag, "/tmp/x.sock"], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        // Parsed (the failure is the missing config, not the flag).
        assert_eq!(out.status.code(), Some(1), "{flag}: {err}");
        assert!(err.contains("no-such-config"), "{flag}: {err}");
    }
}

#[test]
fn demo_json_streams_progress_then_a_summary_in_numbers() {
    let out = tessera(&["demo", "--json", "--duration", "3", "--warmup", "1"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    assert!(
        lines.len() >= 3,
        "progress lines while it runs, then the summary: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (summary, progress) = lines.split_last().expect("lines");
    assert!(progress.iter().all(|p| p["event"] == "progress"), "{text}");
    let first = &progress[0];
    assert!(first["elapsed_seconds"].is_f64());
    assert_eq!(first["workloads"].as_array().expect("workloads").len(), 5);
    // A mixed node: the workloads' two NVIDIA GPUs and an AMD one.
    let vendors: Vec<&str> = first["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g["vendor"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(vendors, ["nvidia", "nvidia", "amd"], "{first}");
    for w in first["workloads"].as_array().expect("workloads") {
        assert!(
            w["memory_limit_bytes"].is_u64() && w["target_pct"].is_f64(),
            "{w}"
        );
    }
    assert_eq!(summary["event"], "summary");
    for w in summary["workloads"].as_array().expect("workloads") {
        let b = &w["bound"];
        let numeric = b["equals"]["pct"].is_f64() && b["equals"]["tolerance_pp"].is_f64()
            || b["at_least"]["pct"].is_f64();
        assert!(numeric, "bound as numbers, not a display string: {w}");
        assert!(
            w["memory_peak"].is_u64() && w["achieved_pct"].is_f64(),
            "{w}"
        );
    }
}

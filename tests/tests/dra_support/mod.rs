//! The DRA plugin as a child process of a test executable, shared by the tests that
//! run the real plugin against a fake kubelet (`dra_plugin_kubelet`, `dropin_dra`):
//! its role (the executable re-run with `ROLE_ENV=dra-plugin`), the child it runs
//! in, its flags for a node in one directory, and a probe started with a claim's CDI
//! device.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use clap::Parser;
use serde_json::Value;
use tessera_dra_plugin::cdi;
use tessera_e2e::{Mode, ProbeChild, SimNode};

use crate::manager_support::*;

/// The node every DRA test's plugin serves.
pub const NODE: &str = "node-1";

/// Declares the test executable's ignored `role` test, its helper processes' entry point
/// (`role`): every test file that runs the DRA plugin as a child has one.
#[macro_export]
macro_rules! dra_role_test {
    () => {
        /// The test executable's helper processes (`dra_support::role`).
        #[test]
        #[ignore = "helper: the manager or DRA plugin process the other tests start"]
        fn role() {
            dra_support::role();
        }
    };
}

/// The test executable's helper processes: the DRA plugin here, the manager and
/// the client commands in `manager_support`. Each test file's ignored `role`
/// test calls this.
pub fn role() {
    if std::env::var(ROLE_ENV).as_deref() == Ok("dra-plugin") {
        std::process::exit(dra_role());
    }
    role_main();
}

#[derive(Parser)]
#[command(name = "dra-plugin")]
pub struct DraCli {
    #[command(flatten)]
    args: tessera_dra_plugin::DraPluginArgs,
}

pub fn dra_role() -> i32 {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .try_init();
    let args: Vec<String> = std::env::var(ARGS_ENV)
        .unwrap_or_default()
        .split('\u{1f}')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let cli = match DraCli::try_parse_from(std::iter::once("dra-plugin".to_owned()).chain(args)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    // The test stops the plugin with SIGKILL only: no shutdown cue needed.
    let run = cli.args.options().and_then(|opts| {
        tokio::runtime::Runtime::new()
            .expect("a runtime")
            .block_on(tessera_dra_plugin::run(opts, std::future::pending()))
    });
    match run {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}

/// The plugin in a child process.
pub struct Plugin {
    pub child: Child,
    log: PathBuf,
}

impl Plugin {
    pub fn start(args: &[String], log: &Path) -> Plugin {
        let child = role_command("dra-plugin", args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log"))
            .spawn()
            .expect("spawn the plugin");
        Plugin {
            child,
            log: log.to_owned(),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The plugin's flags for a node in `dir`: its registry, plugin, CDI dirs,
/// kubeconfig, node config and preload file all there.
pub fn plugin_args(dir: &Path, manager_socket: &Path) -> Vec<String> {
    let s = |p: &Path| p.display().to_string();
    [
        ("--node-name", NODE.to_owned()),
        ("--registry-dir", s(&dir.join("registry"))),
        ("--plugin-dir", s(&dir.join("plugin"))),
        ("--cdi-dir", s(&dir.join("cdi"))),
        ("--kubeconfig", s(&dir.join("kubeconfig"))),
        ("--socket", s(manager_socket)),
        ("--config", s(&dir.join("config.yaml"))),
        ("--hook-library", s(&hook())),
        ("--preload-file", s(&dir.join("ld.so.preload"))),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_owned(), value])
    .collect()
}

/// A probe started as a runtime would start a container with the claim's
/// CDI device (or one of its requests'): the spec's env, with mounted paths read as their host paths,
/// and only the claim's GPUs visible (what the NVIDIA toolkit does with
/// NVIDIA_VISIBLE_DEVICES).
pub fn probe_with_claim(n: &SimNode, cdi_dir: &Path, cdi_id: &str) -> ProbeChild {
    let (kind, device) = cdi_id.split_once('=').expect("qualified CDI name");
    assert_eq!(kind, cdi::KIND);
    // The claim's own device, or one of its requests' (`<uid>_<k>`), in the claim's spec.
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(cdi::spec_path(cdi_dir, cdi::claim_of(device)))
            .expect("the claim's spec"),
    )
    .expect("spec JSON");
    let env = cdi::host_env(&spec, device).expect("the claim's device in its spec");
    let mut c = n.probe(Mode::Dlopen, &[]);
    for (k, v) in &env {
        c.env(k, v);
        if k == "NVIDIA_VISIBLE_DEVICES" {
            c.env("CUDA_VISIBLE_DEVICES", v);
        }
    }
    assert!(
        env.iter()
            .any(|(k, v)| k == "LD_PRELOAD" && v == &hook().display().to_string()),
        "{env:?}"
    );
    ProbeChild::start(c)
}

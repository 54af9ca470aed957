//! The client side of the manager: `tessera status`, `tessera top`,
//! `tessera run`, `tessera resize`, `tessera pause`/`resume` and
//! `tessera install-hook`, with
//! their flags, and the connection to the manager's socket ([`connect()`]).
//! Each command is a function the `tessera` binary calls with its parsed
//! arguments; rendering is pure and tested on its own.
//! The manager (the server) is not a dependency: only its API, in
//! `tessera-proto`, and the shared contract.

pub mod connect;
pub mod install_hook;
pub mod pause;
pub mod private;
pub mod resize;
pub mod run;
pub mod status;
pub mod top;

pub use connect::{ClientError, connect};

use std::path::PathBuf;

use tessera_contract::units::UnitError;

/// What a client command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Unit(#[from] UnitError),
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
}

impl From<tonic::Status> for CliError {
    fn from(s: tonic::Status) -> Self {
        CliError::Client(ClientError::Rpc(s))
    }
}

/// The socket option every client command shares.
#[derive(clap::Args, Debug, Clone)]
pub struct SocketArg {
    /// The manager's socket.
    #[arg(long, env = tessera_contract::env::SOCKET, default_value = tessera_proto::manager::v1::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// A per-GPU flag (`--memory`, `--compute` of `run` and `resize`) takes one
/// value for every GPU or one per GPU.
fn check_per_gpu(flag: &str, values: &[String], gpus: usize) -> Result<(), CliError> {
    if values.len() == 1 || values.len() == gpus {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "{flag} has {} values for {gpus} GPUs: give one value (for every GPU) or one per GPU",
            values.len()
        )))
    }
}

/// A runtime for one client command.
fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| CliError::Io {
            what: "cannot start the async runtime".into(),
            error,
        })
}

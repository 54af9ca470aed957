//! Connecting to the manager over its unix socket, with errors that say
//! what is wrong and what to do.

use std::path::{Path, PathBuf};

use tessera_proto::manager::v1::manager_client::ManagerClient;
use tonic::transport::Channel;

/// Why the manager could not be reached or refused a request.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "the Tessera manager is not running (no socket at {0}): start it with `tessera manager` \
         (or pass --socket if it listens elsewhere)"
    )]
    NotRunning(PathBuf),
    #[error(
        "nothing is listening on {0}: the manager has stopped; start it with `tessera manager`"
    )]
    Refused(PathBuf),
    #[error(
        "permission denied on {0}: run as root, or have the manager started with \
         --socket-group set to a group you belong to"
    )]
    Permission(PathBuf),
    #[error("cannot connect to the manager at {path}: {message}")]
    Connect { path: PathBuf, message: String },
    #[error("{}", describe(.0))]
    Rpc(tonic::Status),
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Rpc(s)
    }
}

fn describe(s: &tonic::Status) -> String {
    use tonic::Code;
    let what = match s.code() {
        Code::InvalidArgument => "invalid request",
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::ResourceExhausted => "not enough room",
        Code::FailedPrecondition => "refused",
        Code::Unavailable => "manager unavailable",
        _ => "manager error",
    };
    format!("{what}: {}", s.message())
}

impl ClientError {
    fn from_io(path: &Path, e: &std::io::Error) -> Self {
        use std::io::ErrorKind;
        match e.kind() {
            ErrorKind::NotFound => ClientError::NotRunning(path.to_owned()),
            ErrorKind::ConnectionRefused => ClientError::Refused(path.to_owned()),
            ErrorKind::PermissionDenied => ClientError::Permission(path.to_owned()),
            _ => ClientError::Connect {
                path: path.to_owned(),
                message: e.to_string(),
            },
        }
    }
}

/// Connects to the manager's socket: one connection, its error said
/// exactly (the io error under the transport's, which alone would only say
/// "transport error").
pub async fn connect(socket: &Path) -> Result<ManagerClient<Channel>, ClientError> {
    let channel = tessera_proto::unix::channel(socket)
        .await
        .map_err(|e| match io_cause(&e) {
            Some(io) => ClientError::from_io(socket, io),
            None => ClientError::Connect {
                path: socket.to_owned(),
                message: e.to_string(),
            },
        })?;
    Ok(ManagerClient::new(channel))
}

/// The io error at the root of a transport error, if any.
fn io_cause<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e std::io::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            // An io error may wrap the real one (tonic boxes its connector's).
            return match io.get_ref() {
                Some(inner) => io_cause(inner).or(Some(io)),
                None => Some(io),
            };
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_socket_says_start_the_manager() {
        let dir = tempfile::tempdir().unwrap();
        let e = connect(&dir.path().join("m.sock")).await.unwrap_err();
        assert!(matches!(e, ClientError::NotRunning(_)));
        assert!(
            e.to_string().contains("start it with `tessera manager`"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_stale_socket_says_the_manager_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let e = connect(&path).await.unwrap_err();
        assert!(matches!(e, ClientError::Refused(_)), "{e}");
        assert!(e.to_string().contains("tessera manager"));
    }

    #[test]
    fn permission_errors_name_the_fix() {
        let e = ClientError::from_io(
            Path::new("/run/tessera/manager.sock"),
            &std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        let msg = e.to_string();
        assert!(
            msg.contains("permission denied on /run/tessera/manager.sock"),
            "{msg}"
        );
        assert!(msg.contains("--socket-group"), "{msg}");
    }

    #[test]
    fn rpc_errors_keep_the_managers_words() {
        let e = ClientError::from(tonic::Status::resource_exhausted("GPU x has 1 byte"));
        assert_eq!(e.to_string(), "not enough room: GPU x has 1 byte");
    }
}

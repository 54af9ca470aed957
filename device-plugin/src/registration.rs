//! Registration with the kubelet, and noticing when the kubelet restarts.
//!
//! A restarting kubelet removes every socket in its device-plugins dir and
//! creates a new `kubelet.sock`; a plugin must then serve again and register
//! again. The socket file's identity (device and inode) tells a new socket
//! from the old one.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::deviceplugin::v1beta1::registration_client::RegistrationClient;

/// Why registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("cannot reach the kubelet at {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the kubelet refused the registration: {0}")]
    Rejected(#[from] tonic::Status),
}

/// Identity of a file: a recreated socket has a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

/// The identity of the file at `path`, None when it does not exist.
pub fn file_id(path: &Path) -> Option<FileId> {
    std::fs::metadata(path).ok().map(|m| FileId {
        dev: m.dev(),
        ino: m.ino(),
    })
}

/// Registers `resource_name`, served on `endpoint` (a file name in the
/// kubelet's dir), with the kubelet listening on `kubelet_socket`.
pub async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource_name: &str,
    options: dp::DevicePluginOptions,
) -> Result<(), RegistrationError> {
    let channel = crate::grpc::unix_channel(kubelet_socket)
        .await
        .map_err(|source| RegistrationError::Connect {
            path: kubelet_socket.display().to_string(),
            source,
        })?;
    RegistrationClient::new(channel)
        .register(dp::RegisterRequest {
            version: dp::VERSION.to_owned(),
            endpoint: endpoint.to_owned(),
            resource_name: resource_name.to_owned(),
            options: Some(options),
        })
        .await?;
    Ok(())
}

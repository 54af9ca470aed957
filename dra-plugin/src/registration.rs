//! Registration through the kubelet's plugin watcher: the plugin serves
//! `pluginregistration.Registration` on a socket in the kubelet's registry
//! dir; the kubelet finds it there, asks GetInfo (type `DRAPlugin`, the
//! driver name, the DRA socket, the service versions) and tells the verdict
//! with NotifyRegistrationStatus.

use tessera_proto::dra;
use tessera_proto::pluginregistration::v1 as reg;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The registration socket's file name for `driver` in the registry dir.
pub fn socket_name(driver: &str) -> String {
    format!("{driver}-reg.sock")
}

/// The kubelet's last verdict: None until it has given one.
pub type Verdict = Option<Result<(), String>>;

/// The Registration service.
pub struct Registration {
    info: reg::PluginInfo,
    verdict: watch::Sender<Verdict>,
}

impl Registration {
    /// Registers `driver` served on the DRA socket `endpoint`.
    pub fn new(driver: &str, endpoint: &str) -> (Self, watch::Receiver<Verdict>) {
        let (tx, rx) = watch::channel(None);
        let info = reg::PluginInfo {
            r#type: reg::DRA_PLUGIN_TYPE.to_owned(),
            name: driver.to_owned(),
            endpoint: endpoint.to_owned(),
            supported_versions: vec![
                dra::v1::SERVICE.to_owned(),
                dra::v1beta1::SERVICE.to_owned(),
            ],
        };
        (Self { info, verdict: tx }, rx)
    }
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _req: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        let verdict = if s.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
            Ok(())
        } else {
            tracing::error!(driver = %self.info.name, error = %s.error, "the kubelet refused the registration");
            Err(s.error)
        };
        self.verdict.send_replace(Some(verdict));
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

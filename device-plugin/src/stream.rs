//! ListAndWatch's stream, for both resources the plugin serves (slices in
//! `service`, KAI's reservation GPUs in `kai`): below both, so that neither
//! service names the other for it.

use std::pin::Pin;

use futures::Stream;
use tessera_proto::deviceplugin::v1beta1 as dp;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

pub(crate) type DeviceStream =
    Pin<Box<dyn Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

/// The device list `project` makes of the watched state, sent first and then
/// again whenever it changes, until the kubelet hangs up or the state's sender
/// is dropped.
pub(crate) fn device_stream<T: Send + Sync + 'static>(
    mut rx: tokio::sync::watch::Receiver<T>,
    project: impl Fn(&T) -> Vec<dp::Device> + Send + 'static,
) -> DeviceStream {
    let (tx, out) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut last: Option<Vec<dp::Device>> = None;
        loop {
            let devices = project(&rx.borrow_and_update());
            if last.as_ref() != Some(&devices) {
                let msg = dp::ListAndWatchResponse {
                    devices: devices.clone(),
                };
                if tx.send(Ok(msg)).await.is_err() {
                    return;
                }
                tracing::debug!(devices = devices.len(), "sent device list");
                last = Some(devices);
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                () = tx.closed() => return,
            }
        }
    });
    Box::pin(ReceiverStream::new(out))
}

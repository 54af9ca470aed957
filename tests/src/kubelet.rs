//! What the kubelet asks a device plugin for one container, as the tests ask it: the
//! slices it prefers out of those available, then their Allocate. The plugin tests
//! (`dropin_device_plugin*`, `vendor_device_plugin`) ask the same two questions.

use tessera_proto::deviceplugin::v1beta1 as dp;
use tonic::transport::Channel;

/// A kubelet's connection to a device plugin.
pub type PluginClient = dp::device_plugin_client::DevicePluginClient<Channel>;

/// GetPreferredAllocation for one container asking `size` of `available`: the plugin's
/// choice.
pub async fn preferred(c: &mut PluginClient, available: Vec<String>, size: u32) -> Vec<String> {
    c.get_preferred_allocation(dp::PreferredAllocationRequest {
        container_requests: vec![dp::ContainerPreferredAllocationRequest {
            available_device_i_ds: available,
            must_include_device_i_ds: vec![],
            allocation_size: i32::try_from(size).expect("a container's slice count fits an i32"),
        }],
    })
    .await
    .expect("preferred")
    .into_inner()
    .container_responses
    .remove(0)
    .device_i_ds
}

/// Allocate for one container holding `devices`: its answer.
pub async fn allocate(c: &mut PluginClient, devices: Vec<String>) -> dp::ContainerAllocateResponse {
    c.allocate(dp::AllocateRequest {
        container_requests: vec![dp::ContainerAllocateRequest {
            devices_ids: devices,
        }],
    })
    .await
    .expect("allocate")
    .into_inner()
    .container_responses
    .remove(0)
}

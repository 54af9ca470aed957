//! A [`ManagerApi`] fake for the plugins' tests: allocations kept in memory,
//! every call recorded, and a chosen call made to fail (fault injection), so
//! that a test can show what a plugin does when the manager refuses step k.
//!
//! It answers as the manager does where the plugins depend on it: a create
//! of an id in use with the same request returns the allocation, with another
//! request `AlreadyExists`; an unknown id is `NotFound`; an allocation carries
//! the paths, mounts and environment the manager gives (see
//! `manager/src/wire.rs`), here under a made-up state dir.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use futures::StreamExt;
use tessera_contract::env;
use tessera_contract::paths::{CONTAINER_CONTROL, CONTAINER_HOOK_LIBRARY, CONTAINER_STATE};
use tessera_proto::manager::v1 as mgr;
use tonic::Status;

use crate::manager::{ManagerApi, StatusStream};

/// The manager's methods, to record calls and aim failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Create,
    List,
    Delete,
    SetOwner,
    Resize,
    Status,
    Watch,
}

/// One call the fake answered: the method and the allocation id (empty for
/// list and watch).
pub type Call = (Method, String);

#[derive(Default)]
struct Inner {
    allocations: BTreeMap<String, mgr::Allocation>,
    status: mgr::NodeStatus,
    calls: Vec<Call>,
    /// Failures to answer, each on the next call of its method.
    fail: Vec<(Method, Status)>,
}

/// The fake manager; see the module docs.
pub struct FakeManager {
    inner: Mutex<Inner>,
    /// The host path the fake answers for the hook library mount.
    hook_library: String,
}

impl Default for FakeManager {
    fn default() -> Self {
        Self::new("/var/lib/tessera/lib/libtessera.so")
    }
}

impl FakeManager {
    /// A fake whose allocations mount the hook from `hook_library`.
    pub fn new(hook_library: &str) -> Self {
        Self {
            inner: Mutex::default(),
            hook_library: hook_library.to_owned(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A test that panicked while holding the lock has failed already.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node status answered by `node_status` and `watch_node_status`.
    pub fn set_status(&self, status: mgr::NodeStatus) {
        self.lock().status = status;
    }

    /// The next call of `method` answers `status` (queued in order).
    pub fn fail_next(&self, method: Method, status: Status) {
        self.lock().fail.push((method, status));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// How many calls of `method` were made.
    pub fn count(&self, method: Method) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|(m, _)| *m == method)
            .count()
    }

    /// The allocations held now.
    pub fn allocations(&self) -> Vec<mgr::Allocation> {
        self.lock().allocations.values().cloned().collect()
    }

    /// Puts an allocation in place as if made earlier (by anyone).
    pub fn insert(&self, alloc: mgr::Allocation) {
        self.lock().allocations.insert(alloc.id.clone(), alloc);
    }

    /// Records the call; the injected failure for it, if any.
    fn enter(&self, method: Method, id: &str) -> Result<MutexGuard<'_, Inner>, Status> {
        let mut i = self.lock();
        i.calls.push((method, id.to_owned()));
        if let Some(k) = i.fail.iter().position(|(m, _)| *m == method) {
            return Err(i.fail.remove(k).1);
        }
        Ok(i)
    }

    /// The allocation the manager would answer for `req`.
    fn made(&self, req: &mgr::CreateAllocationRequest) -> mgr::Allocation {
        let dir = format!("/fake/allocations/{}", req.id);
        let control = format!("{dir}/control");
        let state = format!("{dir}/state");
        let mount = |host: &str, container: &str, read_only| mgr::Mount {
            host_path: host.to_owned(),
            container_path: container.to_owned(),
            read_only,
        };
        let uuids: Vec<&str> = req.devices.iter().map(|d| d.gpu_uuid.as_str()).collect();
        mgr::Allocation {
            id: req.id.clone(),
            devices: req.devices.clone(),
            policy: req.policy,
            device_ids: req.device_ids.clone(),
            labels: req.labels.clone(),
            control_path: control.clone(),
            state_path: state.clone(),
            mounts: vec![
                mount(&control, CONTAINER_CONTROL, true),
                mount(&state, CONTAINER_STATE, false),
                mount(&self.hook_library, CONTAINER_HOOK_LIBRARY, true),
            ],
            env: [
                (env::CONTROL.to_owned(), CONTAINER_CONTROL.to_owned()),
                (env::STATE.to_owned(), CONTAINER_STATE.to_owned()),
                (env::ALLOCATION.to_owned(), req.id.clone()),
                (env::NVIDIA_VISIBLE_DEVICES.to_owned(), uuids.join(",")),
            ]
            .into(),
            ..Default::default()
        }
    }
}

impl ManagerApi for FakeManager {
    async fn create_allocation(
        &self,
        req: mgr::CreateAllocationRequest,
    ) -> Result<mgr::Allocation, Status> {
        let made = self.made(&req);
        let mut i = self.enter(Method::Create, &req.id)?;
        match i.allocations.get(&req.id) {
            Some(a) if a.devices == req.devices && a.policy == req.policy => Ok(a.clone()),
            Some(_) => Err(Status::already_exists(format!(
                "allocation {} exists with another request",
                req.id
            ))),
            None => {
                i.allocations.insert(req.id.clone(), made.clone());
                Ok(made)
            }
        }
    }

    async fn list_allocations(&self) -> Result<Vec<mgr::Allocation>, Status> {
        let i = self.enter(Method::List, "")?;
        Ok(i.allocations.values().cloned().collect())
    }

    async fn delete_allocation(&self, id: String) -> Result<(), Status> {
        let mut i = self.enter(Method::Delete, &id)?;
        match i.allocations.remove(&id) {
            Some(_) => Ok(()),
            None => Err(Status::not_found(format!("no allocation {id}"))),
        }
    }

    async fn set_allocation_owner(
        &self,
        req: mgr::SetAllocationOwnerRequest,
    ) -> Result<mgr::Allocation, Status> {
        let mut i = self.enter(Method::SetOwner, &req.id)?;
        let a = i
            .allocations
            .get_mut(&req.id)
            .ok_or_else(|| Status::not_found(format!("no allocation {}", req.id)))?;
        a.namespace = req.namespace;
        a.pod = req.pod;
        a.container = req.container;
        if req.policy != mgr::ComputePolicy::Unspecified as i32 {
            a.policy = req.policy;
        }
        Ok(a.clone())
    }

    async fn resize_allocation(
        &self,
        req: mgr::ResizeAllocationRequest,
    ) -> Result<mgr::Allocation, Status> {
        let mut i = self.enter(Method::Resize, &req.id)?;
        let a = i
            .allocations
            .get_mut(&req.id)
            .ok_or_else(|| Status::not_found(format!("no allocation {}", req.id)))?;
        if let Some(p) = req.priority {
            a.priority = p;
        }
        Ok(a.clone())
    }

    async fn node_status(&self) -> Result<mgr::NodeStatus, Status> {
        let i = self.enter(Method::Status, "")?;
        Ok(i.status.clone())
    }

    /// The status set with [`FakeManager::set_status`], once; then the
    /// stream stays open and silent, as a manager with nothing new does
    /// between its intervals.
    async fn watch_node_status(&self, _interval_ms: u32) -> Result<StatusStream, Status> {
        let i = self.enter(Method::Watch, "")?;
        let first = futures::stream::iter([Ok(i.status.clone())]);
        Ok(first.chain(futures::stream::pending()).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: &str, memory: u64) -> mgr::CreateAllocationRequest {
        mgr::CreateAllocationRequest {
            id: id.into(),
            devices: vec![mgr::DeviceRequest {
                gpu_uuid: "GPU-a".into(),
                memory_limit_bytes: memory,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn answers_as_the_manager_and_fails_where_told() {
        futures::executor::block_on(async {
            let m = FakeManager::default();
            let a = m.create_allocation(req("x", 1)).await.expect("create");
            assert_eq!(a.env[env::ALLOCATION], "x");
            assert_eq!(a.mounts.len(), 3);
            assert_eq!(m.create_allocation(req("x", 1)).await.expect("again"), a);
            let e = m.create_allocation(req("x", 2)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::AlreadyExists);
            m.fail_next(Method::Delete, Status::unavailable("down"));
            let e = m.delete_allocation("x".into()).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unavailable);
            assert_eq!(m.allocations().len(), 1, "a failed delete deletes nothing");
            m.delete_allocation("x".into()).await.expect("delete");
            let e = m.delete_allocation("x".into()).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::NotFound);
            assert_eq!(m.count(Method::Delete), 3);
            assert_eq!(m.count(Method::Create), 3);
        });
    }
}

//! Counts of the plugin's completed background passes (config reload,
//! kubelet socket checks, PodResources sync), so that tests wait for the
//! next pass instead of guessing how long one takes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Which background pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// One look at the config file: unchanged, reloaded, refused or unreadable.
    Config,
    /// One look at the kubelet's socket: a registration tried, or the
    /// socket checked for a kubelet restart.
    Kubelet,
    /// One PodResources sync: owners recorded, orphans tracked or deleted,
    /// or a failed listing that changed nothing.
    PodResources,
}

/// Completed passes since start, per kind. Cloning shares the counts: the
/// clone in [`crate::Options`] is the one the running plugin counts on.
#[derive(Clone)]
pub struct Passes {
    config: Arc<watch::Sender<u64>>,
    kubelet: Arc<watch::Sender<u64>>,
    pod_resources: Arc<watch::Sender<u64>>,
}

impl Default for Passes {
    fn default() -> Self {
        Self {
            config: Arc::new(watch::channel(0).0),
            kubelet: Arc::new(watch::channel(0).0),
            pod_resources: Arc::new(watch::channel(0).0),
        }
    }
}

impl std::fmt::Debug for Passes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Passes")
            .field("config", &self.get(Pass::Config))
            .field("kubelet", &self.get(Pass::Kubelet))
            .field("pod_resources", &self.get(Pass::PodResources))
            .finish()
    }
}

/// A wait for passes that did not complete in time.
#[derive(Debug, thiserror::Error)]
#[error("{pass:?} passes: {seen} completed, waited for {wanted} for {waited:?}")]
pub struct Timeout {
    pub pass: Pass,
    pub seen: u64,
    pub wanted: u64,
    pub waited: Duration,
}

impl Passes {
    fn sender(&self, pass: Pass) -> &watch::Sender<u64> {
        match pass {
            Pass::Config => &self.config,
            Pass::Kubelet => &self.kubelet,
            Pass::PodResources => &self.pod_resources,
        }
    }

    /// Passes of this kind completed so far.
    pub fn get(&self, pass: Pass) -> u64 {
        *self.sender(pass).borrow()
    }

    /// Marks one pass of this kind complete.
    pub(crate) fn count(&self, pass: Pass) {
        self.sender(pass).send_modify(|n| *n += 1);
    }

    /// Waits until `n` more passes of this kind than `seen` have completed.
    /// With `n = 2` and `seen` read before a change, a whole pass began
    /// after the change (the one running at the read may have missed it).
    pub async fn wait_beyond(
        &self,
        pass: Pass,
        seen: u64,
        n: u64,
        deadline: Duration,
    ) -> Result<u64, Timeout> {
        let wanted = seen + n;
        let mut rx = self.sender(pass).subscribe();
        match tokio::time::timeout(deadline, rx.wait_for(|c| *c >= wanted)).await {
            Ok(Ok(c)) => Ok(*c),
            // The sender lives in `self`: it cannot close while we wait.
            Ok(Err(_)) | Err(_) => Err(Timeout {
                pass,
                seen: self.get(pass),
                wanted,
                waited: deadline,
            }),
        }
    }

    /// Waits until a whole pass of this kind that began after this call has
    /// completed; the count then.
    pub async fn next_complete(&self, pass: Pass, deadline: Duration) -> Result<u64, Timeout> {
        self.wait_beyond(pass, self.get(pass), 2, deadline).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waits_for_passes_begun_after_the_call() {
        let p = Passes::default();
        p.count(Pass::Config);
        let seen = p.get(Pass::Config);
        assert_eq!(seen, 1);
        let q = p.clone();
        let waiter = tokio::spawn(async move {
            q.wait_beyond(Pass::Config, seen, 2, Duration::from_secs(60))
                .await
        });
        p.count(Pass::Config);
        // Other kinds do not count: one of two is not enough.
        p.count(Pass::PodResources);
        let short = p.wait_beyond(Pass::Config, seen, 2, Duration::from_millis(10));
        assert!(short.await.is_err());
        p.count(Pass::Config);
        assert_eq!(waiter.await.unwrap().unwrap(), 3);
        assert_eq!(p.get(Pass::PodResources), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_that_never_comes_is_a_timeout_naming_it() {
        let p = Passes::default();
        let e = p
            .next_complete(Pass::PodResources, Duration::from_millis(10))
            .await
            .unwrap_err();
        assert_eq!((e.pass, e.seen, e.wanted), (Pass::PodResources, 0, 2));
        assert!(e.to_string().contains("PodResources"), "{e}");
    }
}

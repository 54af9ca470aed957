//! Draining a server on shutdown: it stops accepting, tells each open connection to close
//! once its requests in flight are answered (HTTP/1.1 `Connection: close`, HTTP/2
//! GOAWAY), and waits for them, up to a deadline. A request that reached the server
//! before SIGTERM is answered rather than cut off when the process exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};

/// The open connections of one server.
#[derive(Debug)]
pub struct Drain {
    open: AtomicUsize,
    /// Wakes `close` when the last connection ends.
    idle: Notify,
    closing: watch::Sender<bool>,
}

/// One connection, counted open until dropped.
#[derive(Debug)]
pub struct Held(Arc<Drain>);

impl Drop for Held {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            // `notify_one` keeps a permit when no one waits yet: `close` cannot miss it.
            self.0.idle.notify_one();
        }
    }
}

impl Drain {
    pub fn new() -> Arc<Drain> {
        Arc::new(Drain {
            open: AtomicUsize::new(0),
            idle: Notify::new(),
            closing: watch::channel(false).0,
        })
    }

    /// Counts a connection until the returned guard is dropped.
    pub fn hold(self: &Arc<Self>) -> Held {
        self.open.fetch_add(1, Ordering::AcqRel);
        Held(self.clone())
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Completes once the server is closing (at once if it already is): the cue for a
    /// connection to finish what is in flight and close.
    pub async fn closing(&self) {
        let mut rx = self.closing.subscribe();
        // The sender lives in `self`, so the channel cannot close under us.
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Tells every connection to close and waits until they have, at most `deadline`.
    /// Returns how many were still open at the deadline (they are cut off when the
    /// process exits).
    pub async fn close(&self, deadline: Duration) -> usize {
        self.closing.send_replace(true);
        let wait = async {
            while self.open() > 0 {
                self.idle.notified().await;
            }
        };
        let _ = tokio::time::timeout(deadline, wait).await;
        self.open()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn close_waits_for_the_connections_then_returns() {
        let d = Drain::new();
        let a = d.hold();
        let b = d.hold();
        assert_eq!(d.open(), 2);
        let d2 = d.clone();
        // A connection that closes once told to.
        let conn = tokio::spawn(async move {
            d2.closing().await;
            drop(a);
            drop(b);
        });
        assert_eq!(d.close(Duration::from_secs(60)).await, 0);
        conn.await.expect("join");
        // Closing again (and a late connection) completes at once.
        let _late = d.hold();
        d.closing().await;
    }

    #[tokio::test]
    async fn a_connection_that_never_closes_is_left_at_the_deadline() {
        let d = Drain::new();
        let _stuck = d.hold();
        assert_eq!(d.close(Duration::from_millis(50)).await, 1);
    }
}

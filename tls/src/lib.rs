//! TLS for Tessera's HTTPS servers (the admission webhook and the scheduler extender):
//! certificates and the rustls configuration ([`certs`]), serving certificates from
//! mounted files re-read when they change ([`files`]), draining connections on shutdown
//! ([`drain`]), and, for tests, an HTTPS client (`testing`, feature `testing`).

pub mod certs;
pub mod drain;
pub mod files;
#[cfg(feature = "testing")]
pub mod testing;

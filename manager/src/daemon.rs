//! The running manager: started over a GPU backend and an arbiter
//! ([`Manager::start`]: state directory locked, allocations reloaded,
//! threads running, sockets bound), then serving until told to stop.
//!
//! The parts it wires together: [`crate::core`] (shared state and the
//! allocation operations), [`crate::reaper`], [`crate::sampler`],
//! [`crate::listeners`] (gRPC and metrics) and [`crate::service`].

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use crate::alloc::AllocError;
use crate::arbiter::Arbitration;
use crate::backstop::Backstop;
use crate::config::Config;
use crate::core::Core;
use crate::error::ManagerError;
use crate::gpu::GpuBackend;
use crate::store::Store;
use crate::{listeners, reaper, sampler};

/// A started manager: threads running, sockets bound, not yet serving.
pub struct Manager {
    core: Arc<Core>,
    threads: Vec<JoinHandle<()>>,
    grpc: tokio::net::UnixListener,
    socket: PathBuf,
    socket_ino: u64,
    metrics: Option<tokio::net::TcpListener>,
    metrics_addr: Option<SocketAddr>,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("socket", &self.socket)
            .field("metrics_addr", &self.metrics_addr)
            .finish()
    }
}

fn state_dir_err(path: &Path) -> impl Fn(std::io::Error) -> ManagerError + '_ {
    move |error| ManagerError::StateDir {
        path: path.to_owned(),
        error,
    }
}

fn lock_state_dir(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, ManagerError> {
    use nix::fcntl::{Flock, FlockArg};
    std::fs::create_dir_all(dir).map_err(state_dir_err(dir))?;
    let path = dir.join("manager.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(state_dir_err(dir))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            ManagerError::Locked(dir.to_owned())
        } else {
            ManagerError::StateDir {
                path: path.clone(),
                error: std::io::Error::from(errno),
            }
        }
    })
}

/// The reaper, the sampler and the GPU-event threads.
fn spawn_threads(core: &Arc<Core>) -> std::io::Result<Vec<JoinHandle<()>>> {
    Ok(vec![
        reaper::spawn(core.clone())?,
        sampler::spawn_sampler(core.clone())?,
        sampler::spawn_events(core.clone())?,
    ])
}

impl Manager {
    /// Starts a manager over `backend`: takes the state directory, reads
    /// the inventory, reloads allocations, starts the background threads
    /// and binds the sockets. Must run inside a tokio runtime.
    pub async fn start(
        config: Config,
        backend: Arc<dyn GpuBackend>,
        arbitration: Arc<dyn Arbitration>,
    ) -> Result<Manager, ManagerError> {
        for w in &config.warnings {
            tracing::warn!("{w}");
        }
        let lock = lock_state_dir(&config.state_dir)?;
        let gpus = backend.devices()?;
        let driver_version = backend.driver_version().unwrap_or_default();
        tracing::info!(gpus = gpus.len(), driver = %driver_version, "GPU inventory read");
        for g in &gpus {
            tracing::info!(
                index = g.index,
                uuid = %g.uuid,
                name = %g.name,
                memory = g.memory_total_bytes,
                pci = %g.pci_bus_id,
                "GPU"
            );
        }
        let store = Store::open(&config.allocations_dir()).map_err(|e| match e {
            AllocError::Io { path, error } => ManagerError::StateDir { path, error },
            e => ManagerError::Alloc(e),
        })?;
        let (metrics, metrics_addr) = match config.metrics_addr {
            Some(addr) => {
                let (l, bound) = listeners::bind_metrics(addr).await?;
                (Some(l), bound)
            }
            None => (None, None),
        };
        let (grpc, socket_ino) =
            listeners::bind_socket(&config.socket, config.socket_group.as_deref())?;
        // Before anything is served or sampled: the manager's own contexts
        // would otherwise show on the GPUs' process lists.
        let context_sizes = backend.context_sizes();
        for g in &gpus {
            match context_sizes.get(&g.uuid) {
                Some(bytes) => tracing::info!(
                    gpu = g.index,
                    uuid = %g.uuid,
                    context_bytes = bytes,
                    "a CUDA context holds this much here (measured: the driver's count for \
                     the manager's own context); the shim charges it per context"
                ),
                None => tracing::warn!(
                    gpu = g.index,
                    uuid = %g.uuid,
                    context_overhead_bytes = config.context_overhead_bytes,
                    "could not measure what a CUDA context holds here; the shim charges \
                     contextOverhead per context until the driver's figure settles it"
                ),
            }
        }
        let mut core = Core::new(config, gpus, driver_version, backend, store, arbitration);
        core.context_sizes = context_sizes;
        let core = Arc::new(core);
        let socket = core.config.socket.clone();
        let cleanup = |e: ManagerError| {
            let _ = std::fs::remove_file(&socket);
            e
        };
        core.reload().map_err(cleanup)?;
        // A first sample before serving, so status and metrics start full.
        sampler::sample_once(&core, &mut Backstop::default());
        let threads = spawn_threads(&core)
            .map_err(|e| cleanup(ManagerError::Serve(format!("cannot start threads: {e}"))))?;
        Ok(Manager {
            core,
            threads,
            grpc,
            socket,
            socket_ino,
            metrics,
            metrics_addr,
            _lock: lock,
        })
    }

    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Where metrics are served (the bound port when 0 was asked for).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Serves until `shutdown` completes (or, with `--idle-exit`, the
    /// manager has been idle for that long: [`crate::idle`]), then stops
    /// every thread and removes the socket. Allocation files stay: containers keep running.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ManagerError> {
        let Manager {
            core,
            threads,
            grpc,
            socket,
            socket_ino,
            metrics,
            _lock,
            ..
        } = self;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let metrics_task =
            metrics.map(|l| listeners::serve_metrics(l, core.clone(), stop_rx.clone()));
        let grpc_task = listeners::serve_grpc(grpc, core.clone(), stop_rx);
        // Held from the idle decision until everything is let go (below).
        let mut users = None;
        match core.config.idle_exit {
            Some(grace) => tokio::select! {
                () = shutdown => {}
                held = crate::idle::idle_for(core.clone(), grace, socket_ino) => users = held,
            },
            None => shutdown.await,
        }
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
        let grpc_result = grpc_task.await;
        if let Some(t) = metrics_task {
            let _ = t.await;
        }
        core.stop.store(true, Ordering::Release);
        core.arbitration.shutdown();
        for t in threads {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        // Said once, at the one moment it becomes true: what runs on without a manager.
        let left = core.live_list();
        if !left.is_empty() {
            let processes: usize = left
                .iter()
                .map(|l| l.state().processes(l.control().n_devices()).len())
                .sum();
            tracing::warn!(
                allocations = left.len(),
                processes,
                "manager stopped: running processes keep their last memory limits (enforced by \
                 the shim); compute shares are not arbitrated (gates open after their timeout) \
                 and no allocation can be made until a manager starts again"
            );
        }
        // Only our own socket: a successor may already have bound a new one.
        if listeners::socket_is_ours(&socket, socket_ino) {
            let _ = std::fs::remove_file(&socket);
        }
        let result = match grpc_result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ManagerError::Serve(e.to_string())),
            Err(e) => Err(ManagerError::Serve(e.to_string())),
        };
        // The state directory first, then the users lock: a run waiting on
        // it may start a successor at once, which needs the directory.
        drop(_lock);
        drop(users);
        result
    }
}

/// Runs `tessera manager`: NVML and ROCm SMI (`vendors`), the arbiter, and serving until SIGTERM or
/// SIGINT.
pub async fn run(config: Config) -> Result<(), ManagerError> {
    run_with(config, |_| {}).await
}

/// [`run`], calling `ready` once the manager is started and before it
/// serves (embedders and tests learn the bound metrics port this way).
pub async fn run_with(config: Config, ready: impl FnOnce(&Manager)) -> Result<(), ManagerError> {
    let backend = crate::vendors::open(
        config.nvml_library.as_deref(),
        config.rocm_smi_library.as_deref(),
    )?;
    if !config.hook_library.exists() {
        tracing::warn!(
            path = %config.hook_library.display(),
            "hook library not found; containers and `tessera run` need it there"
        );
    }
    let arbiter = crate::arbiter::Arbiter::new(config.arbiter)
        .map_err(|e| ManagerError::Arbiter(e.to_string()))?;
    let arbitration: Arc<dyn Arbitration> = Arc::new(arbiter);
    // Installed before anyone can learn the manager is up: a SIGTERM sent
    // the moment it serves must stop it cleanly, not by the default action.
    let shutdown = shutdown_signal();
    let manager = Manager::start(config, backend, arbitration).await?;
    tracing::info!(
        socket = %manager.socket().display(),
        metrics = ?manager.metrics_addr(),
        "manager serving"
    );
    ready(&manager);
    manager.serve(shutdown).await
}

/// Installs the SIGTERM and SIGINT handlers now (must run inside a tokio
/// runtime) and returns what completes on either: a signal that arrives
/// between this call and the first poll is kept, not lost to the default
/// action.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            // Without signal handlers the default action (exit) still applies.
            std::future::pending::<()>().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}

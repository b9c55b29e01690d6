//! Assembling and running the service: state directory and lock, store and recovery,
//! backends, the socket, the scheduler, signals, systemd notifications and the drain.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kiln_daemon::api::{self, Access, AppState, Facts};
use kiln_daemon::config::Config;
use kiln_daemon::events::EventBus;
use kiln_daemon::metrics::Metrics;
use kiln_daemon::sched::Scheduler;
use kiln_daemon::store::{SqliteStore, Store};
use kiln_daemon::{backends, systemd};
use nix::fcntl::{Flock, FlockArg};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// How long each step of leaving the cluster may take once the drain is over.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything set up before the async runtime starts.
pub struct Prepared {
    socket: PathBuf,
    listener: std::os::unix::net::UnixListener,
    owns_socket: bool,
    config: Config,
    local: Arc<SqliteStore>,
    node: String,
    backends: backends::start::Built,
    facts: Facts,
    access: Access,
    state_dir: PathBuf,
    _lock: Flock<std::fs::File>,
}

/// Synchronous set-up, run while the process is single-threaded.
pub fn prepare(socket: PathBuf, state_dir: PathBuf, config: Config) -> Result<Prepared> {
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("cannot create state directory {}", state_dir.display()))?;
    let _ = std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o700));
    let lock_path = state_dir.join("kilnd.lock");
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open {}", lock_path.display()))?;
    let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        anyhow::anyhow!(
            "another kilnd is using the state directory {} ({e})",
            state_dir.display()
        )
    })?;

    let node = kiln_daemon::cluster::node_id(&config);
    let local = Arc::new(
        SqliteStore::open(&state_dir, &node)
            .with_context(|| format!("cannot open the store in {}", state_dir.display()))?,
    );
    if !config.cluster.enabled() {
        // One host: the queue is in this database; a cluster node recovers in PostgreSQL.
        let recovery = local
            .recover_interrupted(config.queue.max_attempts)
            .context("cannot recover interrupted jobs")?;
        if recovery.waiting > 0 {
            tracing::info!(
                jobs = recovery.waiting,
                "queued again the jobs a previous daemon had claimed but not started evaluating"
            );
        }
        if recovery.requeued + recovery.failed > 0 {
            tracing::warn!(
                requeued = recovery.requeued,
                failed = recovery.failed,
                "recovered jobs whose evaluation a previous daemon left running"
            );
        }
    }

    // Backends and jail probes fork: do them now, before any thread exists.
    let built = backends::start::build(&config, &state_dir, &local)
        .context("cannot choose the GPUs to use")?;
    let gpu = built.gpu.clone();
    if let Some(e) = &gpu.error {
        tracing::info!(reason = %e, "no GPUs listed");
    }
    let access = Access::resolve(&config.access);
    let (listener, owns_socket) = bind(&socket, &config)?;
    let facts = Facts {
        backends: built.status.clone(),
        gpu,
        jail: built.jail.clone(),
        cuda_headers: built.cuda_headers.clone(),
        triton: built.triton.clone(),
        socket: socket.display().to_string(),
        state_dir: state_dir.display().to_string(),
    };
    Ok(Prepared {
        socket,
        listener,
        owns_socket,
        config,
        local,
        node,
        backends: built,
        facts,
        access,
        state_dir,
        _lock: lock,
    })
}

/// Binds the API socket, or takes the one systemd passed. The flag says whether the
/// socket file is ours to remove at exit (not when systemd owns it).
fn bind(socket: &Path, config: &Config) -> Result<(std::os::unix::net::UnixListener, bool)> {
    if let Some(l) = systemd::activated_listener() {
        tracing::info!("using the socket passed by systemd");
        return Ok((l, false));
    }
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                bail!("another kilnd is already serving {}", socket.display());
            }
            std::fs::remove_file(socket)
                .with_context(|| format!("cannot remove the stale socket {}", socket.display()))?;
            tracing::info!(socket = %socket.display(), "removed a stale socket");
        }
        Ok(_) => bail!(
            "{} exists and is not a socket; refusing to replace it",
            socket.display()
        ),
        Err(_) => {}
    }
    let listener = std::os::unix::net::UnixListener::bind(socket)
        .with_context(|| format!("cannot bind {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("cannot chmod {}", socket.display()))?;
    if !config.access.group.is_empty()
        && let Ok(Some(g)) = nix::unistd::Group::from_name(&config.access.group)
        && let Err(e) = nix::unistd::chown(socket, None, Some(g.gid))
    {
        tracing::warn!(group = %config.access.group, error = %e, "cannot give the socket to the access group");
    }
    Ok((listener, true))
}

/// Runs the service until SIGTERM or SIGINT, then drains.
pub async fn serve(p: Prepared) -> Result<()> {
    p.listener
        .set_nonblocking(true)
        .context("cannot make the socket non-blocking")?;
    let listener =
        tokio::net::UnixListener::from_std(p.listener).context("cannot use the socket")?;
    let events = EventBus::new(1024);
    let drain = Duration::from_secs(p.config.server.shutdown_timeout_secs);
    let lanes =
        kiln_daemon::cluster::class::node_lanes(&p.backends.backends, &p.facts.gpu, &p.config);
    let clustered = p.config.cluster.enabled();
    let store = if clustered {
        // Joining needs the database; wait for it about as long as systemd waits for READY.
        let pg = kiln_daemon::cluster::join(&p.config, &p.node, &lanes, Duration::from_secs(60))
            .await
            .context("cannot join the cluster (cluster.database_url / KILN_DATABASE_URL)")?;
        Arc::new(Store::with_shared(p.local.clone(), pg))
    } else {
        Arc::new(Store::single(p.local.clone()))
    };
    // A gateway (cluster.evaluate = false) claims nothing; its lanes stay idle.
    let claim = if clustered && !p.config.cluster.evaluate {
        Vec::new()
    } else {
        kiln_daemon::cluster::class::claim_keys(&lanes)
    };
    let sched = Scheduler::new(
        store.clone(),
        events.clone(),
        p.backends.backends.clone(),
        claim,
        p.config.clone(),
    );
    let supervisor = kiln_daemon::search::Supervisor::new(
        store.clone(),
        events.clone(),
        p.config.clone(),
        p.socket.clone(),
        &p.state_dir,
    );
    let llm = Arc::new(kiln_daemon::llm::Gateway::from_config(&p.config.llm));
    let membership = Arc::new(kiln_daemon::cluster::Membership {
        sched: sched.clone(),
        supervisor: supervisor.clone(),
        events: events.clone(),
        config: p.config.clone(),
        lanes,
    });
    let state = AppState {
        store: store.clone(),
        sched: sched.clone(),
        supervisor: supervisor.clone(),
        llm,
        events,
        metrics: Arc::new(Metrics::default()),
        config: Arc::new(p.config.clone()),
        facts: Arc::new(p.facts),
        started: Instant::now(),
    };
    // Signal handlers go in before READY, so a stop right after start-up drains cleanly.
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let shutdown = CancellationToken::new();
    let sched_task = tokio::spawn(sched.clone().run(drain));
    let api_task = tokio::spawn(api::serve(
        listener,
        state,
        Arc::new(p.access),
        shutdown.clone(),
    ));

    let cluster_stop = CancellationToken::new();
    let cluster_task = tokio::spawn(membership.run(cluster_stop.clone()));
    if let Some(every) = systemd::watchdog_interval() {
        let store = store.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.cancelled() => break,
                }
                // Ping only while the store answers: a wedged daemon should be restarted.
                if store.job_counts().await.is_ok() {
                    systemd::watchdog_ping();
                }
            }
        });
    }
    supervisor.resume_all().await;
    let usable = sched.usable_backends();
    let status = format!(
        "serving {} (backends: {})",
        p.socket.display(),
        if usable.is_empty() {
            "none usable".to_string()
        } else {
            usable.join(", ")
        }
    );
    tracing::info!(socket = %p.socket.display(), backends = ?usable, "kilnd ready");
    systemd::ready(&status);

    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
    systemd::stopping();
    shutdown.cancel();
    sched.stop();
    supervisor.stop_all();
    let _ = api_task.await;
    // The drain is bounded by the drain timeout; what follows by a few seconds each, so a
    // database that answers nothing (or nonsense) never keeps kilnd from stopping.
    if tokio::time::timeout(drain + LEAVE_TIMEOUT, sched_task)
        .await
        .is_err()
    {
        tracing::warn!("the scheduler did not drain in time; stopping anyway (leases run out)");
    }
    // The drain released the leases it could; the heartbeat keeps the others until here.
    cluster_stop.cancel();
    if tokio::time::timeout(LEAVE_TIMEOUT, cluster_task)
        .await
        .is_err()
    {
        tracing::warn!("the cluster loops did not stop in time; stopping anyway");
    }
    if let Some(pg) = store.cluster() {
        match tokio::time::timeout(LEAVE_TIMEOUT, pg.deregister()).await {
            Ok(Ok(())) => tracing::info!("left the cluster"),
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot mark this node stopped"),
            Err(_) => tracing::warn!(
                "the database did not answer; this node is not marked stopped (its heartbeat runs out)"
            ),
        }
    }
    if p.owns_socket && std::fs::remove_file(&p.socket).is_ok() {
        tracing::debug!("removed the socket");
    }
    tracing::info!("kilnd stopped");
    Ok(())
}

//! The search supervisor: one plugin host process per running search.
//!
//! Starting a search mints a fresh token (only its hash is stored) and starts
//! `kiln-plugin-host` in kiln's jail (role `PluginHost`, see
//! `kiln_sandbox::plugin_host`): the plugin and the token are copied into the jail's
//! scratch, and kilnd's socket is the only path of the host's filesystem it can see. The
//! host runs the component and calls back into kilnd over the socket with that token.
//! The jail's layers are written to the search's log. The host reports how the plugin
//! ended with `POST …/finish`; if it ends without doing so, the search is failed with the
//! reason (its report line, exit code or signal). Cancelling the search or stopping
//! kilnd kills the jailed host. Searches still `running` when kilnd starts are resumed:
//! the plugin restores its last checkpoint, and candidates it submits again are answered
//! from the store, never evaluated twice. Each search's plugin log is bounded
//! ([`log_quota`]).

mod ending;
pub mod log_quota;
pub mod peers;
mod proposers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kiln_sandbox::SandboxConfig;
use kiln_sandbox::jail::Killer;
use kiln_sandbox::plugin_host::{self, PluginHostSpec};
use rand::RngCore;
use tokio::sync::oneshot;

pub use proposers::{find_proposer, proposer_dirs};

use crate::config::Config;
use crate::events::{Event, EventBus};
use crate::store::Store;

/// Hash under which a search token is stored.
pub fn token_hash(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

/// Runs plugin hosts.
pub struct Supervisor {
    store: Arc<Store>,
    events: EventBus,
    config: Config,
    socket: PathBuf,
    /// The jail's settings (helper, scratch root, hidden paths, namespaces, cgroup).
    sandbox: SandboxConfig,
    host_exe: Option<PathBuf>,
    running: Mutex<HashMap<String, Running>>,
    /// Bounds on each search's plugin log.
    pub log_quota: log_quota::LogQuota,
}

/// A search whose host is starting or running.
struct Running {
    /// Tells the search's task to stop (sent on cancel, dropped on shutdown).
    cancel: oneshot::Sender<()>,
    /// Kills the jailed host; set once it has started.
    killer: Option<Killer>,
}

/// How a run of a search's plugin host ended.
enum RunEnd {
    /// Finished through `/finish`, cancelled, or stopped with kilnd (resumed later).
    Ended,
    /// The search fails with this reason.
    Failed(String),
    /// Another node hosts the search now (or it ended elsewhere): nothing to record here.
    Lost(String),
}

/// Kills the jailed host if the task owning it is dropped (the runtime shutting down).
struct KillOnDrop(Option<Killer>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(k) = &self.0 {
            k.kill();
        }
    }
}

impl Supervisor {
    /// A supervisor whose plugin hosts call back on `socket`.
    pub fn new(
        store: Arc<Store>,
        events: EventBus,
        config: Config,
        socket: PathBuf,
        state_dir: &std::path::Path,
    ) -> Arc<Self> {
        let host_exe = if config.search.plugin_host.is_empty() {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("kiln-plugin-host")))
                .filter(|p| p.is_file())
        } else {
            Some(PathBuf::from(&config.search.plugin_host))
        };
        let sandbox = crate::backends::start::sandbox_config(&config, state_dir);
        let stale = plugin_host::remove_stale(&sandbox);
        if stale > 0 {
            tracing::info!(
                count = stale,
                "removed plugin host folders left by a previous run"
            );
        }
        let log_quota =
            log_quota::LogQuota::new(config.search.log_max_rows, config.search.log_max_bytes);
        Arc::new(Supervisor {
            store,
            events,
            log_quota,
            config,
            socket,
            sandbox,
            host_exe,
            running: Mutex::new(HashMap::new()),
        })
    }

    /// Whether searches can run here, and why not.
    pub fn status(&self) -> (bool, String) {
        let helper = &self.sandbox.worker_exe;
        match &self.host_exe {
            Some(_) if !helper.is_file() => (
                false,
                format!(
                    "the jail helper {} was not found (plugin hosts run jailed)",
                    helper.display()
                ),
            ),
            Some(p) => (
                true,
                format!(
                    "plugin host {}, jailed by {}",
                    p.display(),
                    helper.display()
                ),
            ),
            None => (
                false,
                "kiln-plugin-host was not found beside kilnd (set search.plugin_host)".into(),
            ),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this node may run plugin hosts: always on one host; in a cluster when
    /// `cluster.run_searches` is on.
    fn hosts_searches(&self) -> bool {
        self.store.cluster().is_none() || self.config.cluster.run_searches
    }

    /// Resumes every search left `running` that this node should host: on one host all
    /// of them (after a restart); in a cluster its own and those whose host's lease ran
    /// out (or that never had a host: started on a gateway). Called at start and by the
    /// cluster's search reaper.
    pub async fn resume_all(self: &Arc<Self>) {
        if !self.hosts_searches() || !self.status().0 {
            return;
        }
        let ids = match self.store.cluster() {
            Some(pg) => pg.searches_to_host().await,
            None => self
                .store
                .list_searches(Some("running"))
                .await
                .map(|l| l.into_iter().map(|s| s.id).collect()),
        };
        match ids {
            Ok(ids) => {
                for id in ids {
                    if !self.lock().contains_key(&id) {
                        tracing::info!(search = %id, "resuming search");
                        self.start(&id);
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot list searches to resume"),
        }
    }

    /// Whether this node runs the plugin host of search `id` now.
    pub fn hosts(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// The searches whose plugin hosts run here (started: past taking the search).
    pub fn hosted_started(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, r)| r.killer.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Starts (or restarts) the plugin host of a running search, if this node hosts
    /// searches (in a cluster another node may take it).
    pub fn start(self: &Arc<Self>, id: &str) {
        if !self.hosts_searches() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut map = self.lock();
            if map.contains_key(id) {
                return;
            }
            map.insert(
                id.to_string(),
                Running {
                    cancel: tx,
                    killer: None,
                },
            );
        }
        let me = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let outcome = me.run(&id, rx).await;
            me.lock().remove(&id);
            if matches!(outcome, RunEnd::Lost(_)) {
                // Another node hosts the search now: its log is no longer this node's to write.
                me.log_quota.forget(&id);
            } else if let Err(e) = me.log_quota.close(&me.store, &id).await {
                tracing::warn!(search = %id, error = %e, "cannot record the dropped log lines");
            }
            match outcome {
                RunEnd::Ended => {}
                RunEnd::Failed(reason) => {
                    tracing::warn!(search = %id, reason = %reason, "search failed");
                    if let Ok(true) = me
                        .store
                        .finish_search(&id, "failed", None, Some(&reason))
                        .await
                    {
                        let _ = me.store.search_log(&id, "error", &reason).await;
                    }
                }
                RunEnd::Lost(why) => {
                    tracing::warn!(search = %id, reason = %why, "this node no longer hosts the search");
                }
            }
            me.publish(&id).await;
        });
    }

    /// Stops the plugin host of a search this node lost (another node took its lease
    /// over, or it was cancelled elsewhere) without touching the search's record.
    pub fn abandon(&self, id: &str) {
        if let Some(r) = self.lock().remove(id) {
            tracing::warn!(search = %id, "another node hosts this search now; stopping its plugin host here");
            if let Some(k) = &r.killer {
                k.kill();
            }
            let _ = r.cancel.send(());
        }
    }

    /// Cancels a running search: stops its host and marks it cancelled.
    pub async fn cancel(&self, id: &str) -> bool {
        let stopped = self
            .store
            .finish_search(id, "cancelled", None, Some("cancelled by a user"))
            .await
            .unwrap_or(false);
        if let Some(r) = self.lock().remove(id) {
            if let Some(k) = &r.killer {
                k.kill();
            }
            let _ = r.cancel.send(());
        }
        if stopped {
            let _ = self
                .store
                .search_log(id, "info", "cancelled by a user")
                .await;
            self.publish(id).await;
        }
        stopped
    }

    /// Publishes the search's current progress on the event bus.
    pub async fn publish(&self, id: &str) {
        if let Ok(Some(s)) = self.store.get_search(id).await {
            self.events.publish(Event::Search {
                search_id: s.id,
                problem: s.problem,
                state: s.state,
                submitted: s.submitted,
                evaluated: s.evaluated,
                budget: s.budget_candidates,
                best_candidate: s.best.as_ref().map(|b| b.0.clone()),
                best_median_us: s.best.map(|b| b.1),
            });
        }
    }

    /// A store error while running a search: on one host it fails the search; in a
    /// cluster the search is left for a node that can reach the database (its lease
    /// runs out and it is resumed).
    fn store_trouble(&self, e: crate::store::StoreError) -> RunEnd {
        if self.store.cluster().is_some() {
            RunEnd::Lost(format!("store: {e}"))
        } else {
            RunEnd::Failed(format!("store: {e}"))
        }
    }

    /// Runs the host until it exits or the search is cancelled.
    async fn run(&self, id: &str, cancel: oneshot::Receiver<()>) -> RunEnd {
        let search = match self.store.get_search(id).await {
            Ok(Some(s)) => s,
            Ok(None) => return RunEnd::Failed("search vanished".into()),
            Err(e) => return self.store_trouble(e),
        };
        if search.state != "running" {
            return RunEnd::Ended;
        }
        let ms_left = search.time_limit_ms.saturating_sub(search.elapsed_ms);
        if ms_left == 0 {
            return RunEnd::Failed(format!(
                "time limit of {} s reached",
                search.time_limit_ms / 1000
            ));
        }
        let (usable, why) = self.status();
        let host = match &self.host_exe {
            Some(h) if usable => h.clone(),
            _ if self.store.cluster().is_some() => return RunEnd::Lost(why),
            _ => return RunEnd::Failed(why),
        };
        let wasm = match self.store.get_plugin(&search.plugin_hash).await {
            Ok(Some(w)) => w,
            Ok(None) => {
                return RunEnd::Failed("the search's plugin is missing from the store".into());
            }
            Err(e) => return self.store_trouble(e),
        };
        let mut raw = [0u8; 32];
        rand::rng().fill_bytes(&mut raw);
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let hash = token_hash(&token);
        match self.store.start_search(id, &hash).await {
            Ok(true) => {}
            Ok(false) => return RunEnd::Lost("another node hosts it".into()),
            Err(e) => return self.store_trouble(e),
        }
        let _ = self
            .store
            .search_log(
                id,
                "info",
                &format!("plugin host starting on node {}", self.store.node()),
            )
            .await;

        let started = Instant::now();
        let (sandbox, socket, search_id) =
            (self.sandbox.clone(), self.socket.clone(), id.to_string());
        let (memory_mb, wall_secs) = (self.config.search.plugin_memory_mb, ms_left.div_ceil(1000));
        let jailed = tokio::task::spawn_blocking(move || {
            plugin_host::start(
                &sandbox,
                &PluginHostSpec {
                    host_exe: &host,
                    socket: &socket,
                    search_id: &search_id,
                    wasm: &wasm,
                    token: &token,
                    memory_mb,
                    wall_secs,
                },
            )
        })
        .await;
        let jailed = match jailed {
            Ok(Ok(j)) => j,
            Ok(Err(e)) => {
                return RunEnd::Failed(format!("cannot start the plugin host in its jail: {e}"));
            }
            Err(e) => return RunEnd::Failed(format!("starting the plugin host: {e}")),
        };
        let killer = jailed.killer();
        let _kill_on_drop = KillOnDrop(killer.clone());
        // Its connections get the plugin routes only, for as long as it runs.
        let _listed = peers::register(i32::try_from(jailed.pid()).unwrap_or(i32::MAX));
        if let (Some(r), Some(k)) = (self.lock().get_mut(id), &killer) {
            r.killer = Some(k.clone());
        }
        let layers = plugin_host::describe_layers(jailed.layers());
        tracing::info!(search = %id, pid = jailed.pid(), jail = %layers, "plugin host started");
        let _ = self
            .store
            .search_log(id, "info", &format!("plugin host jail: {layers}"))
            .await;
        self.publish(id).await;

        // The wait blocks for the whole run: a thread of its own rather than one of the
        // runtime's blocking threads, so a long search never holds one.
        let (done_tx, mut done_rx) = oneshot::channel();
        if let Err(e) = std::thread::Builder::new()
            .name("kiln-search-host".into())
            .spawn(move || {
                let _ = done_tx.send(jailed.wait());
            })
        {
            return RunEnd::Failed(format!(
                "cannot start a thread to wait for the plugin host: {e}"
            ));
        }
        let ended = tokio::select! {
            end = &mut done_rx => Some(end),
            _ = cancel => None,
        };
        let ended = match ended {
            Some(Ok(end)) => end,
            Some(Err(_)) => {
                return RunEnd::Failed("the plugin host's waiting thread vanished".into());
            }
            None => {
                // Cancelled, lost to another node, or kilnd is stopping: kill the tree,
                // and wait for the waiting thread to reap it and remove its directory
                // (the token with it).
                if let Some(k) = &killer {
                    k.kill();
                }
                let _ = done_rx.await;
                if self
                    .store
                    .search_for_token(id, &hash)
                    .await
                    .unwrap_or(false)
                {
                    let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    let _ = self.store.add_search_elapsed(id, elapsed).await;
                }
                return RunEnd::Ended; // cancelled: already recorded; stopping: resumed later
            }
        };
        // A run that ends through /finish has its wall time counted there (before the
        // final event); the others (crashed, killed) are counted here.
        let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            search = %id,
            code = ?ended.code,
            signal = ?ended.signal,
            timed_out = ended.timed_out,
            "plugin host ended"
        );
        // Only the host whose token is still the search's may fail it: a host fenced out
        // (another node took the search over) ends without touching it.
        match self.store.search_for_token(id, &hash).await {
            Ok(true) => {
                let _ = self.store.add_search_elapsed(id, elapsed).await;
                RunEnd::Failed(ending::describe(&ended))
            }
            Ok(false) => RunEnd::Ended,
            Err(e) => self.store_trouble(e),
        }
    }

    /// Time budget left for a running search, counting the current run.
    pub async fn ms_left(&self, id: &str) -> Option<u64> {
        let s = self.store.get_search(id).await.ok().flatten()?;
        Some(s.time_limit_ms.saturating_sub(s.elapsed_ms))
    }

    /// Kills every jailed host (at shutdown). Their searches stay `running` and are
    /// resumed at the next start.
    pub fn stop_all(&self) {
        for (id, r) in self.lock().drain() {
            if let Some(k) = &r.killer {
                tracing::info!(search = %id, "stopping the plugin host");
                k.kill();
            }
        }
    }
}

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

    /// Resumes every search left `running` (after a restart).
    pub fn resume_all(self: &Arc<Self>) {
        match self.store.list_searches(Some("running")) {
            Ok(list) => {
                for s in list {
                    tracing::info!(search = %s.id, "resuming search");
                    self.start(&s.id);
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot list searches to resume"),
        }
    }

    /// Starts (or restarts) the plugin host of a running search.
    pub fn start(self: &Arc<Self>, id: &str) {
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
            if let Err(e) = me.log_quota.close(&me.store, &id) {
                tracing::warn!(search = %id, error = %e, "cannot record the dropped log lines");
            }
            if let Err(reason) = outcome {
                tracing::warn!(search = %id, reason = %reason, "search failed");
                if let Ok(true) = me.store.finish_search(&id, "failed", None, Some(&reason)) {
                    let _ = me.store.search_log(&id, "error", &reason);
                }
            }
            me.publish(&id);
        });
    }

    /// Cancels a running search: stops its host and marks it cancelled.
    pub fn cancel(&self, id: &str) -> bool {
        let stopped = self
            .store
            .finish_search(id, "cancelled", None, Some("cancelled by a user"))
            .unwrap_or(false);
        if let Some(r) = self.lock().remove(id) {
            if let Some(k) = &r.killer {
                k.kill();
            }
            let _ = r.cancel.send(());
        }
        if stopped {
            let _ = self.store.search_log(id, "info", "cancelled by a user");
            self.publish(id);
        }
        stopped
    }

    /// Publishes the search's current progress on the event bus.
    pub fn publish(&self, id: &str) {
        if let Ok(Some(s)) = self.store.get_search(id) {
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

    /// Runs the host until it exits or the search is cancelled; `Err` fails the search.
    async fn run(&self, id: &str, cancel: oneshot::Receiver<()>) -> Result<(), String> {
        let search = self
            .store
            .get_search(id)
            .map_err(|e| format!("store: {e}"))?
            .ok_or("search vanished")?;
        if search.state != "running" {
            return Ok(());
        }
        let ms_left = search.time_limit_ms.saturating_sub(search.elapsed_ms);
        if ms_left == 0 {
            return Err(format!(
                "time limit of {} s reached",
                search.time_limit_ms / 1000
            ));
        }
        let (usable, why) = self.status();
        let host = match &self.host_exe {
            Some(h) if usable => h.clone(),
            _ => return Err(why),
        };
        let wasm = self
            .store
            .get_plugin(&search.plugin_hash)
            .map_err(|e| format!("store: {e}"))?
            .ok_or("the search's plugin is missing from the store")?;
        let mut raw = [0u8; 32];
        rand::rng().fill_bytes(&mut raw);
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        self.store
            .start_search(id, &token_hash(&token))
            .map_err(|e| format!("store: {e}"))?;

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
        .await
        .map_err(|e| format!("starting the plugin host: {e}"))?
        .map_err(|e| format!("cannot start the plugin host in its jail: {e}"))?;
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
            .search_log(id, "info", &format!("plugin host jail: {layers}"));
        self.publish(id);

        // The wait blocks for the whole run: a thread of its own rather than one of the
        // runtime's blocking threads, so a long search never holds one.
        let (done_tx, mut done_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("kiln-search-host".into())
            .spawn(move || {
                let _ = done_tx.send(jailed.wait());
            })
            .map_err(|e| format!("cannot start a thread to wait for the plugin host: {e}"))?;
        let ended = tokio::select! {
            end = &mut done_rx => Some(end),
            _ = cancel => None,
        };
        let ended = match ended {
            Some(end) => {
                end.map_err(|_| "the plugin host's waiting thread vanished".to_string())?
            }
            None => {
                // Cancelled, or kilnd is stopping: kill the tree, and wait for the
                // waiting thread to reap it and remove its directory (the token with it).
                if let Some(k) = &killer {
                    k.kill();
                }
                let _ = done_rx.await;
                let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                let _ = self.store.add_search_elapsed(id, elapsed);
                return Ok(()); // cancelled: already recorded; stopping: resumed later
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
        let still_running = self
            .store
            .get_search(id)
            .ok()
            .flatten()
            .is_some_and(|s| s.state == "running");
        if still_running {
            let _ = self.store.add_search_elapsed(id, elapsed);
            return Err(ending::describe(&ended));
        }
        Ok(())
    }

    /// Time budget left for a running search, counting the current run.
    pub fn ms_left(&self, id: &str) -> Option<u64> {
        let s = self.store.get_search(id).ok().flatten()?;
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

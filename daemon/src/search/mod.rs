//! The search supervisor: one plugin host process per running search.
//!
//! Starting a search mints a fresh token (only its hash is stored), writes the plugin's
//! wasm and the token to the search's scratch folder, and starts `kiln-plugin-host`,
//! which runs the component and calls back into kilnd over the socket with that token.
//! The host reports how the plugin ended with `POST …/finish`; if the host process dies
//! without doing so, the search is failed with the reason. Searches still `running`
//! when kilnd starts are resumed: the plugin restores its last checkpoint, and
//! candidates it submits again are answered from the store, never evaluated twice.

mod proposers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rand::RngCore;
use tokio::process::Command;
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
    scratch: PathBuf,
    host_exe: Option<PathBuf>,
    cancels: Mutex<HashMap<String, oneshot::Sender<()>>>,
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
        Arc::new(Supervisor {
            store,
            events,
            config,
            socket,
            scratch: state_dir.join("searches"),
            host_exe,
            cancels: Mutex::new(HashMap::new()),
        })
    }

    /// Whether searches can run here, and why not.
    pub fn status(&self) -> (bool, String) {
        match &self.host_exe {
            Some(p) => (true, format!("plugin host {}", p.display())),
            None => (
                false,
                "kiln-plugin-host was not found beside kilnd (set search.plugin_host)".into(),
            ),
        }
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
            let mut map = self.cancels.lock().unwrap_or_else(|p| p.into_inner());
            if map.contains_key(id) {
                return;
            }
            map.insert(id.to_string(), tx);
        }
        let me = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let outcome = me.run(&id, rx).await;
            me.cancels
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
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
        if let Some(tx) = self
            .cancels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
        {
            let _ = tx.send(());
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
        let host = self.host_exe.clone().ok_or_else(|| self.status().1)?;
        let wasm = self
            .store
            .get_plugin(&search.plugin_hash)
            .map_err(|e| format!("store: {e}"))?
            .ok_or("the search's plugin is missing from the store")?;
        let dir = self.scratch.join(id);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let wasm_path = dir.join("plugin.wasm");
        std::fs::write(&wasm_path, &wasm).map_err(|e| format!("cannot write the plugin: {e}"))?;
        let mut raw = [0u8; 32];
        rand::rng().fill_bytes(&mut raw);
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let token_path = dir.join("token");
        write_private(&token_path, &token).map_err(|e| format!("cannot write the token: {e}"))?;
        self.store
            .start_search(id, &token_hash(&token))
            .map_err(|e| format!("store: {e}"))?;

        let mut cmd = Command::new(&host);
        cmd.arg("--socket")
            .arg(&self.socket)
            .arg("--search")
            .arg(id)
            .arg("--token-file")
            .arg(&token_path)
            .arg("--wasm")
            .arg(&wasm_path)
            .arg("--memory-mb")
            .arg(self.config.search.plugin_memory_mb.to_string())
            .arg("--wall-secs")
            .arg(ms_left.div_ceil(1000).to_string())
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", host.display()))?;
        tracing::info!(search = %id, pid = child.id(), "plugin host started");
        self.publish(id);
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let read_out = tokio::spawn(read_tail(stdout));
        let read_err = tokio::spawn(read_tail(stderr));
        let status = tokio::select! {
            s = child.wait() => Some(s),
            _ = cancel => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                None
            }
        };
        // A run that ends through /finish has its wall time counted there (before the
        // final event); the others (cancelled, crashed) are counted here.
        let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let _ = std::fs::remove_file(&token_path);
        let out = read_out.await.unwrap_or_default();
        let err = read_err.await.unwrap_or_default();
        let Some(status) = status else {
            let _ = self.store.add_search_elapsed(id, elapsed);
            return Ok(()); // cancelled: already recorded
        };
        let status = status.map_err(|e| format!("waiting for the plugin host: {e}"))?;
        let still_running = self
            .store
            .get_search(id)
            .ok()
            .flatten()
            .is_some_and(|s| s.state == "running");
        if still_running {
            // The host exited without reporting through /finish.
            let _ = self.store.add_search_elapsed(id, elapsed);
            let last = out.lines().last().unwrap_or("").to_string();
            let tail: String = err
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join(" | ");
            return Err(format!(
                "the plugin host exited ({status}) without finishing the search; last output: {last} {tail}"
            ));
        }
        Ok(())
    }

    /// Time budget left for a running search, counting the current run.
    pub fn ms_left(&self, id: &str) -> Option<u64> {
        let s = self.store.get_search(id).ok().flatten()?;
        Some(s.time_limit_ms.saturating_sub(s.elapsed_ms))
    }

    /// Drops every host (at shutdown, the hosts are killed with the daemon).
    pub fn stop_all(&self) {
        let mut map = self.cancels.lock().unwrap_or_else(|p| p.into_inner());
        map.clear();
    }
}

fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// Reads a child's stream to the end, keeping the last 16 KiB.
async fn read_tail<R: tokio::io::AsyncRead + Unpin>(r: Option<R>) -> String {
    use tokio::io::AsyncReadExt;
    let Some(mut r) = r else { return String::new() };
    let mut keep: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                keep.extend_from_slice(&buf[..n]);
                if keep.len() > 16 << 10 {
                    let cut = keep.len() - (16 << 10);
                    keep.drain(..cut);
                }
            }
        }
    }
    String::from_utf8_lossy(&keep).into_owned()
}

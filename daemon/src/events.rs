//! The event bus: job and search state changes, and search log lines, fanned out to SSE
//! clients.
//!
//! A bounded broadcast channel: a client that falls behind misses events (it is told so
//! with a `lagged` event) rather than slowing the daemon down.

use serde::Serialize;
use tokio::sync::broadcast;

/// One state change.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A job changed state or stage.
    Job {
        /// Job id.
        job_id: i64,
        /// Candidate id.
        candidate_id: String,
        /// Problem name.
        problem: String,
        /// `queued`, `compiling`, `compiled` (waiting for a lane), `running` (evaluating
        /// on a lane), `done` or `failed`.
        state: String,
        /// The lane evaluating it, from `running` on.
        #[serde(skip_serializing_if = "Option::is_none")]
        lane: Option<u32>,
        /// The node holding it (in a cluster, events of jobs other nodes finished are
        /// relayed too).
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// The verdict, once done.
        #[serde(skip_serializing_if = "Option::is_none")]
        verdict: Option<String>,
        /// Median time in µs, for `ok`.
        #[serde(skip_serializing_if = "Option::is_none")]
        median_us: Option<f64>,
        /// Why it failed, for `failed`.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A search made progress or changed state.
    Search {
        /// Search id.
        search_id: String,
        /// Problem name.
        problem: String,
        /// `running`, `done`, `failed`, `cancelled`.
        state: String,
        /// Distinct candidates submitted.
        submitted: u64,
        /// Of those, evaluated.
        evaluated: u64,
        /// Candidate budget.
        budget: u64,
        /// Best candidate so far.
        #[serde(skip_serializing_if = "Option::is_none")]
        best_candidate: Option<String>,
        /// Its median time, µs.
        #[serde(skip_serializing_if = "Option::is_none")]
        best_median_us: Option<f64>,
    },
    /// A line of a search's log.
    SearchLog {
        /// Search id.
        search_id: String,
        /// Level.
        level: String,
        /// Text.
        message: String,
    },
}

impl Event {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Job { .. } => "job",
            Event::Search { .. } => "search",
            Event::SearchLog { .. } => "search_log",
        }
    }
}

/// Waits for the next event `about` accepts, or a lag (after which anything may have been
/// missed, so the caller should look again). Waiters use it to re-read the store only for
/// events that concern them.
pub async fn wait_for(rx: &mut broadcast::Receiver<Event>, about: impl Fn(&Event) -> bool) {
    loop {
        match rx.recv().await {
            Ok(e) if about(&e) => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// Whether `e` is a job event of candidate `id`.
pub fn is_candidates(e: &Event, id: &str) -> bool {
    matches!(e, Event::Job { candidate_id, .. } if candidate_id == id)
}

/// Cloneable handle to the bus.
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
}

impl EventBus {
    /// A bus that buffers up to `capacity` events per slow subscriber.
    pub fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity);
        EventBus { tx }
    }

    /// Publishes an event; it is fine for nobody to be listening.
    pub fn publish(&self, event: Event) {
        tracing::debug!(?event, "event");
        let _ = self.tx.send(event);
    }

    /// A new subscription, starting from now.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}

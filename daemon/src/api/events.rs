//! `GET /v1/events`: Server-Sent Events of job (and later search) state changes.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::{Stream, StreamExt};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use super::AppState;

/// Streams every event from the moment of connection; a client that falls behind gets a
/// `lagged` event saying how many it missed.
pub async fn stream(
    State(s): State<AppState>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let rx = s.events.subscribe();
    let hello = futures_util::stream::once(async {
        Ok(SseEvent::default()
            .event("hello")
            .data(r#"{"type":"hello"}"#))
    });
    let events = BroadcastStream::new(rx).map(|item| {
        Ok(match item {
            Ok(ev) => {
                let data = serde_json::to_string(&ev).unwrap_or_else(|_| "{}".into());
                SseEvent::default().event(ev.name()).data(data)
            }
            Err(BroadcastStreamRecvError::Lagged(n)) => SseEvent::default()
                .event("lagged")
                .data(format!(r#"{{"type":"lagged","missed":{n}}}"#)),
        })
    });
    Sse::new(hello.chain(events)).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

//! systemd integration: readiness and status notifications, the watchdog, and socket
//! activation. Everything here is a no-op when not run under systemd.

use std::os::fd::{FromRawFd, RawFd};
use std::time::Duration;

use sd_notify::NotifyState;

/// Tells systemd the daemon is ready, with a status line.
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Updates the status line shown by `systemctl status`.
pub fn status(status: &str) {
    notify(&[NotifyState::Status(status)]);
}

/// Tells systemd the daemon is stopping.
pub fn stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}

fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// The watchdog interval systemd asked for, if any; ping at half of it.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().map(|d| d / 2)
}

/// Pings the watchdog once.
pub fn watchdog_ping() {
    notify(&[NotifyState::Watchdog]);
}

/// The listening socket passed by systemd socket activation, if any (the first fd).
pub fn activated_listener() -> Option<std::os::unix::net::UnixListener> {
    let fds: Vec<RawFd> = sd_notify::listen_fds().ok()?.collect();
    let fd = *fds.first()?;
    if fds.len() > 1 {
        tracing::warn!(
            count = fds.len(),
            "several sockets passed by systemd; using the first"
        );
    }
    // SAFETY: systemd passed this fd to us (LISTEN_PID matched our pid); nothing else in
    // the process owns it, so taking ownership here is sound.
    let listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
    Some(listener)
}

//! Which socket peers are plugin hosts: the process groups of the running jailed
//! `kiln-plugin-host` trees (the jail's helper leads its own group, and every process of
//! the jail stays in it). The API serves a peer in one of these groups the plugin routes
//! only — so a guest that escaped wasmtime, which would connect with kilnd's own uid (the
//! default allow-list admits it), still cannot register problems, read other searches or
//! submit outside its search's token.
//!
//! A group is listed from the moment `jail::spawn` returns, which is before the host has
//! compiled the plugin, so no guest code runs before its host is listed.

use std::collections::BTreeSet;
use std::sync::Mutex;

static GROUPS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn groups() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    GROUPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Lists a plugin host's process group (the helper's pid) while the guard lives.
pub fn register(pgid: i32) -> Registered {
    groups().insert(pgid);
    Registered(pgid)
}

/// Unlists its group when dropped.
#[derive(Debug)]
pub struct Registered(i32);

impl Drop for Registered {
    fn drop(&mut self) {
        groups().remove(&self.0);
    }
}

/// The process group of `pid`, from `/proc/PID/stat` (field 5).
fn process_group(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp …`; comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// True when the peer with this pid belongs to a running plugin host's jail.
pub fn is_plugin_host(pid: Option<i32>) -> bool {
    let Some(pid) = pid else {
        return false;
    };
    let listed = groups();
    if listed.is_empty() {
        return false;
    }
    process_group(pid).is_some_and(|g| listed.contains(&g))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_in_a_listed_group_is_a_plugin_host_until_unlisted() {
        let me = std::process::id() as i32;
        let own_group = process_group(me).expect("own process group");
        // SAFETY: getpgrp cannot fail.
        assert_eq!(own_group, unsafe { libc::getpgrp() });
        assert!(!is_plugin_host(Some(me)));
        let guard = register(own_group);
        assert!(is_plugin_host(Some(me)));
        assert!(!is_plugin_host(None));
        assert!(!is_plugin_host(Some(i32::MAX)), "no such process");
        drop(guard);
        assert!(!is_plugin_host(Some(me)));
    }
}

//! The peer allow-list: which uids and gids may use the socket.
//!
//! Resolved once at start from `[access]`: the daemon's own uid, root, a named group
//! (its gid and its listed members) and explicit uids and gids.

use std::collections::BTreeSet;

use nix::unistd::{Group, Uid, User};

use crate::config::AccessConfig;

/// The resolved allow-list.
#[derive(Debug, Clone, Default)]
pub struct Access {
    uids: BTreeSet<u32>,
    gids: BTreeSet<u32>,
    /// Members of the configured group, by name.
    members: BTreeSet<String>,
}

impl Access {
    /// Resolves the config against this machine's users and groups.
    pub fn resolve(cfg: &AccessConfig) -> Self {
        let mut a = Access::default();
        if cfg.allow_daemon_user {
            a.uids.insert(Uid::current().as_raw());
        }
        if cfg.allow_root {
            a.uids.insert(0);
        }
        a.uids.extend(cfg.allow_uids.iter().copied());
        a.gids.extend(cfg.allow_gids.iter().copied());
        if !cfg.group.is_empty() {
            match Group::from_name(&cfg.group) {
                Ok(Some(g)) => {
                    a.gids.insert(g.gid.as_raw());
                    a.members.extend(g.mem);
                }
                Ok(None) => tracing::warn!(
                    group = %cfg.group,
                    "access.group does not exist on this machine; ignoring it"
                ),
                Err(e) => {
                    tracing::warn!(group = %cfg.group, error = %e, "cannot look up access.group")
                }
            }
        }
        tracing::info!(uids = ?a.uids, gids = ?a.gids, members = ?a.members, "peer allow-list");
        a
    }

    /// True if and only if a caller with this uid and primary gid may connect.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        if self.uids.contains(&uid) || self.gids.contains(&gid) {
            return true;
        }
        if self.members.is_empty() {
            return false;
        }
        match User::from_uid(Uid::from_raw(uid)) {
            Ok(Some(u)) => self.members.contains(&u.name) || self.gids.contains(&u.gid.as_raw()),
            _ => false,
        }
    }

    /// An allow-list of exactly these ids (for tests).
    pub fn only(uids: &[u32], gids: &[u32]) -> Self {
        Access {
            uids: uids.iter().copied().collect(),
            gids: gids.iter().copied().collect(),
            members: BTreeSet::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_allow_self_and_root_only() {
        let cfg = AccessConfig {
            group: String::new(),
            ..AccessConfig::default()
        };
        let a = Access::resolve(&cfg);
        assert!(a.allows(0, 12345));
        assert!(a.allows(Uid::current().as_raw(), 12345));
        assert!(!a.allows(54321, 54321) || Uid::current().as_raw() == 54321);
    }

    #[test]
    fn nothing_allowed_when_everything_is_off() {
        let cfg = AccessConfig {
            allow_daemon_user: false,
            allow_root: false,
            group: String::new(),
            allow_uids: vec![],
            allow_gids: vec![],
        };
        let a = Access::resolve(&cfg);
        assert!(!a.allows(0, 0));
        assert!(!a.allows(
            Uid::current().as_raw(),
            nix::unistd::Gid::current().as_raw()
        ));
        assert!(Access::only(&[7], &[]).allows(7, 1));
        assert!(Access::only(&[], &[9]).allows(1, 9));
    }
}

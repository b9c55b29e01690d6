//! A throwaway PostgreSQL server for tests and `kiln bench cluster`: `initdb` into a
//! temporary directory, `postgres` on a free loopback port outside the kernel's ephemeral
//! range (so no client can connect to itself on it while it is down; its socket in that
//! directory), trust authentication for the `kiln` role, stopped and removed when
//! dropped. Uses the machine's PostgreSQL binaries (`/usr/lib/postgresql/*/bin`, else
//! `PATH`); as root, the server runs as the `postgres` system user (it refuses root).
//! Durability is relaxed (`fsync = off`): the server is only ever stopped cleanly or
//! killed with the test, never with the machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running scratch server.
pub struct ScratchDb {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    user: Option<(u32, u32)>,
    child: Option<Child>,
}

/// Where the PostgreSQL server binaries are, if installed.
pub fn find_binaries() -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| rd.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versions.retain(|p| p.join("postgres").is_file() && p.join("initdb").is_file());
    versions.sort();
    if let Some(p) = versions.pop() {
        return Some(p);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .find(|d| d.join("postgres").is_file() && d.join("initdb").is_file())
    })
}

/// The kernel's ephemeral port range (where it picks the local port of an outgoing
/// connection), from `/proc`, or Linux's default.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|w| w.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// A free loopback port outside the ephemeral range. A server on an ephemeral port can,
/// while it is down, have its port handed to a client connecting to it as the client's
/// own: the client connects to itself and the server cannot bind the port again.
fn free_port() -> Result<u16, String> {
    let (lo, hi) = ephemeral_range();
    // The largest stretch outside [lo, hi] at or above 1024.
    let (from, to) = if lo.saturating_sub(1024) >= 65535u16.saturating_sub(hi) {
        (1024u16, lo.saturating_sub(1))
    } else {
        (hi.saturating_add(1), 65535)
    };
    if to <= from {
        return Err(format!(
            "no ports outside the ephemeral range {lo}-{hi} for a scratch database"
        ));
    }
    let span = u32::from(to - from) + 1;
    let start = rand::random::<u32>() % span;
    for i in 0..span.min(2000) {
        let port = from + u16::try_from((start + i) % span).unwrap_or(0);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(format!("no free port in {from}-{to}"))
}

/// Whether a failed start says the port was taken.
fn port_taken(error: &str) -> bool {
    [
        "already in use",
        "could not bind",
        "could not create any TCP/IP sockets",
    ]
    .iter()
    .any(|m| error.contains(m))
}

impl ScratchDb {
    /// Creates and starts a server; an error says what is missing or what failed.
    pub fn start() -> Result<ScratchDb, String> {
        let bin = find_binaries().ok_or_else(|| {
            "PostgreSQL's server binaries (initdb, postgres) are not installed; \
             apt-get install postgresql"
                .to_string()
        })?;
        let dir = tempfile::Builder::new()
            .prefix("kiln-pg-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        let user = if nix::unistd::geteuid().is_root() {
            let pg = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .ok_or(
                    "running as root needs the `postgres` system user (the server refuses root)",
                )?;
            nix::unistd::chown(dir.path(), Some(pg.uid), Some(pg.gid))
                .map_err(|e| format!("chown {}: {e}", dir.path().display()))?;
            Some((pg.uid.as_raw(), pg.gid.as_raw()))
        } else {
            None
        };
        let mut db = ScratchDb {
            dir,
            bin,
            port: free_port()?,
            user,
            child: None,
        };
        let out = db
            .command("initdb")
            .arg("-D")
            .arg(db.data())
            .args([
                "-U",
                "kiln",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .output()
            .map_err(|e| format!("initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        // Another process may take the port between the check and the server's bind:
        // then the server says so and another port is tried.
        let mut tries = 0;
        loop {
            match db.spawn() {
                Ok(()) => return Ok(db),
                Err(e) if tries < 4 && port_taken(&e) => {
                    tries += 1;
                    db.port = free_port()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.user {
            use std::os::unix::process::CommandExt;
            c.uid(uid).gid(gid);
        }
        c.current_dir(self.dir.path());
        c
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("postgres.log"))
            .map_err(|e| format!("server log: {e}"))?;
        if let Some((uid, gid)) = self.user {
            let _ = nix::unistd::chown(
                &self.dir.path().join("postgres.log"),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            );
        }
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .arg("-k")
            .arg(self.dir.path())
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=300"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("postgres: {e}"))?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let ok = self
                .command("pg_isready")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "kiln",
                    "-q",
                ])
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(format!("postgres exited with {status}: {}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("postgres did not come up: {}", self.log()))
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// The URL of database `db` (create it with [`ScratchDb::create_database`]).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://kiln@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    /// Creates a database.
    pub fn create_database(&self, name: &str) -> Result<(), String> {
        let out = self
            .command("createdb")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "kiln",
                name,
            ])
            .output()
            .map_err(|e| format!("createdb: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "createdb {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Runs SQL with `psql` on database `db`; returns its unaligned output.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = self
            .command("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "kiln",
                "-d",
                db,
            ])
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .map_err(|e| format!("psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(format!(
                "psql: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// The server's TCP port (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's pid (its children are the server's other processes).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the server (fast shutdown: sessions are cut, committed work is kept); its
    /// port is free until [`ScratchDb::restart`].
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).unwrap_or(i32::MAX));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    _ if Instant::now() > deadline => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }

    /// Restarts the server on the same port and data (every client loses its sessions).
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.spawn()
    }

    /// The temporary directory (data, socket, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        self.stop();
    }
}

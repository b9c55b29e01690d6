//! File descriptors passed between kiln's processes (`SCM_RIGHTS` on a Unix socket): how
//! a GPU worker's exported device memory reaches the torch runner through kilnd.
//!
//! Descriptors travel beside the framed stream, never inside it: the sender writes a
//! message that says how many descriptors follow, then marker bytes carrying them as
//! ancillary data, at most [`MAX_FDS`] per marker (a problem with more tensors, a level-3
//! network's weights, takes several markers in a row). The receiver, having read that
//! message, reads exactly those marker bytes with `recvmsg` (a plain `read` would drop the
//! descriptors), so the stream stays framed. Readers of such a stream must not buffer past
//! a message.

use std::io;
use std::io::IoSlice;
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

/// The byte that carries the descriptors.
const MARKER: u8 = b'F';

/// Most descriptors one marker may carry.
pub const MAX_FDS: usize = 64;
/// Most descriptors one message may announce (over as many markers as they take).
pub const MAX_TOTAL_FDS: usize = 1024;

/// Sends `fds` (1 to [`MAX_TOTAL_FDS`]) on the Unix socket `sock`: one marker byte with
/// `SCM_RIGHTS` per [`MAX_FDS`] of them, in order. The descriptors stay open here; the
/// receiver gets its own duplicates.
pub fn send_fds(sock: &impl AsFd, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.is_empty() || fds.len() > MAX_TOTAL_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} descriptors: a message carries 1 to {MAX_TOTAL_FDS}",
                fds.len()
            ),
        ));
    }
    for chunk in fds.chunks(MAX_FDS) {
        send_marker(sock, chunk)?;
    }
    Ok(())
}

/// Receives exactly `want` descriptors sent by [`send_fds`] on `sock` (close-on-exec
/// set): its markers in order. Anything else is an error, and every descriptor that did
/// arrive is closed.
pub fn recv_fds(sock: &impl AsFd, want: usize) -> io::Result<Vec<OwnedFd>> {
    if want == 0 || want > MAX_TOTAL_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{want} descriptors: a message carries 1 to {MAX_TOTAL_FDS}"),
        ));
    }
    let mut got = Vec::with_capacity(want);
    while got.len() < want {
        got.extend(recv_marker(sock, (want - got.len()).min(MAX_FDS))?);
    }
    Ok(got)
}

/// One marker byte with `fds` (1 to [`MAX_FDS`]) as `SCM_RIGHTS`.
fn send_marker(sock: &impl AsFd, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.is_empty() || fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} descriptors: one marker carries 1 to {MAX_FDS}",
                fds.len()
            ),
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(&[MARKER])];
    loop {
        match sendmsg::<()>(
            sock.as_fd().as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(1) => return Ok(()),
            Ok(n) => {
                return Err(io::Error::other(format!(
                    "the descriptors' marker was sent as {n} bytes"
                )));
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from(e)),
        }
    }
}

/// Receives one marker carrying exactly `want` descriptors (1 to [`MAX_FDS`]). Anything
/// else — end of stream, another byte, fewer or more descriptors, a truncated control
/// message — is an error, and every descriptor that did arrive is closed.
fn recv_marker(sock: &impl AsFd, want: usize) -> io::Result<Vec<OwnedFd>> {
    if want == 0 || want > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{want} descriptors: one marker carries 1 to {MAX_FDS}"),
        ));
    }
    let mut byte = [0u8; 1];
    let mut cmsg_space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (bytes, truncated, got) = loop {
        let mut iov = [IoSliceMut::new(&mut byte)];
        match recvmsg::<()>(
            sock.as_fd().as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut got = Vec::new();
                for c in msg.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(fds) = c {
                        // SAFETY: the kernel just installed these descriptors in this
                        // process for us; nothing else owns them.
                        got.extend(
                            fds.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
                break (msg.bytes, truncated, got);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from(e)),
        }
    };
    if bytes == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if byte[0] != MARKER {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "expected the descriptors' marker, read byte {:#04x}",
                byte[0]
            ),
        ));
    }
    if truncated || got.len() != want {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "expected {want} descriptors, received {}{}",
                got.len(),
                if truncated { " (truncated)" } else { "" }
            ),
        ));
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::unix::net::UnixStream;

    fn memfd(text: &[u8]) -> std::fs::File {
        let fd =
            nix::sys::memfd::memfd_create(c"kiln-fds-test", nix::sys::memfd::MFdFlags::empty())
                .expect("memfd");
        let mut f = std::fs::File::from(fd);
        f.write_all(text).expect("write");
        f
    }

    /// Descriptors sent between two framed messages arrive whole, refer to the same
    /// files, and leave the stream framed for the next message.
    #[test]
    fn descriptors_travel_between_messages() {
        let (a, b) = UnixStream::pair().expect("pair");
        let files = [memfd(b"one"), memfd(b"two")];
        let mut w = &a;
        crate::write_message(&mut w, &serde_json::json!({"fds": 2}), &[]).expect("msg");
        send_fds(&a, &[files[0].as_fd(), files[1].as_fd()]).expect("send");
        crate::write_message(&mut w, &serde_json::json!("after"), &[b"x"]).expect("msg");
        let mut r = &b;
        let (first, _): (serde_json::Value, _) = crate::read_message(&mut r).expect("first");
        assert_eq!(first["fds"], 2);
        let got = recv_fds(&b, 2).expect("recv");
        for (fd, want) in got.into_iter().zip([&b"one"[..], b"two"]) {
            let mut f = std::fs::File::from(fd);
            f.rewind().expect("rewind");
            let mut s = Vec::new();
            f.read_to_end(&mut s).expect("read");
            assert_eq!(s, want);
        }
        let (after, blobs): (serde_json::Value, _) = crate::read_message(&mut r).expect("after");
        assert_eq!(after, "after");
        assert_eq!(blobs, vec![b"x".to_vec()]);
    }

    /// A receiver that expected descriptors refuses a plain byte, a wrong count and the
    /// end of the stream.
    #[test]
    fn the_wrong_thing_is_refused() {
        let (a, b) = UnixStream::pair().expect("pair");
        (&a).write_all(b"Z").expect("write");
        let e = recv_fds(&b, 1).expect_err("a plain byte");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let f = memfd(b"x");
        send_fds(&a, &[f.as_fd()]).expect("send");
        let e = recv_fds(&b, 2).expect_err("one of two");
        assert!(
            e.to_string().contains("expected 2 descriptors, received 1"),
            "{e}"
        );
        drop(a);
        let e = recv_fds(&b, 1).expect_err("end");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(send_fds(&b, &[]).is_err());
        assert!(recv_fds(&b, MAX_TOTAL_FDS + 1).is_err());
    }

    /// More descriptors than one marker carries (a level-3 network's 104 tensors) travel
    /// as several markers, in order, and the stream stays framed.
    #[test]
    fn more_than_one_markers_worth_travels_in_order() {
        let (a, b) = UnixStream::pair().expect("pair");
        let n = 2 * MAX_FDS + 8;
        let files: Vec<std::fs::File> = (0..n).map(|i| memfd(format!("{i}").as_bytes())).collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(AsFd::as_fd).collect();
        send_fds(&a, &fds).expect("send");
        crate::write_message(&mut &a, &serde_json::json!("after"), &[]).expect("msg");
        let got = recv_fds(&b, n).expect("recv");
        assert_eq!(got.len(), n);
        for (i, fd) in got.into_iter().enumerate() {
            let mut f = std::fs::File::from(fd);
            f.rewind().expect("rewind");
            let mut s = String::new();
            f.read_to_string(&mut s).expect("read");
            assert_eq!(s, i.to_string());
        }
        let (after, _): (serde_json::Value, _) = crate::read_message(&mut &b).expect("after");
        assert_eq!(after, "after");
    }
}

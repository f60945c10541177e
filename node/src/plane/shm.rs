//! Shared-memory links between peers on one host, as NCCL, Gloo and MPI do inside a node.
//!
//! A link is a single-producer single-consumer byte ring in a file under [`SHM_DIR`]
//! (tmpfs), created by the sender with owner-only permissions (0600, `O_EXCL`), its pages
//! reserved up front (`posix_fallocate`, so a full tmpfs is an error at creation, never a
//! `SIGBUS` later), mapped by both processes and unlinked by the receiver as soon as it has
//! mapped it. Its name travels over the QUIC connection the two peers' libp2p identities
//! have authenticated ([`super`]), so the ring is bound to that connection's proven peer; the
//! connection stays up as the link's liveness channel and carries the goodbye's close.
//!
//! Layout: a 4,096-byte control block (magic, version, capacity; the writer's and the
//! reader's byte counters, each on its own cache line, each with a futex word) and then
//! `capacity` bytes of ring. Each frame is written as a 4-byte little-endian length and the
//! frame itself (header and payload), in chunks of at most [`CHUNK`] bytes, each published
//! with a release store of the byte counter and a `FUTEX_WAKE`, so the reader copies one
//! chunk while the writer copies the next. A blocked side sleeps in `FUTEX_WAIT` for at most
//! [`POLL`] and then looks at the link's stop flag (set when the QUIC connection closes: a
//! dead or stopped peer is noticed by the connection's silence, as on QUIC links).
//!
//! Copies: the sender copies each frame once into the ring, the receiver once out of it into
//! the frame it delivers, a buffer sized by the length prefix after the prefix was checked
//! against the payload limit (a longer frame is skipped in place, refused, never allocated).
//! Nothing in the ring is trusted: a counter that claims more bytes than the ring holds
//! breaks the link ([`LinkBroken::Corrupt`]); frames are checked as on QUIC.
//!
//! Linux only (futexes); elsewhere every link is QUIC.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use memmap2::MmapRaw;

/// Where the rings live (tmpfs on Linux).
pub const SHM_DIR: &str = "/dev/shm";
/// Ring bytes of one link (4 MiB; with 8 peers on a ring topology, 16 links: 64 MiB).
pub const RING_BYTES: u64 = 4 << 20;
/// Bytes copied before they are published to the other side.
pub const CHUNK: usize = 256 << 10;
/// How long a blocked side sleeps before it looks at the link's stop flag again.
pub const POLL: Duration = Duration::from_millis(50);
/// Ring sizes a receiver accepts, bytes.
const CAPACITY_RANGE: std::ops::RangeInclusive<u64> = (64 << 10)..=(1 << 30);

const MAGIC: u64 = u64::from_le_bytes(*b"murmurSH");
const VERSION: u32 = 1;
/// Bytes of the control block before the ring.
const CONTROL: usize = 4096;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_CAPACITY: usize = 16;
/// Bytes written into the ring since creation (only the writer stores it).
const OFF_WRITTEN: usize = 64;
/// Bumped after every publication of the writer: the reader's futex word.
const OFF_DATA_SEQ: usize = 72;
/// Bytes consumed since creation (only the reader stores it).
const OFF_READ: usize = 128;
/// Bumped after every release of space by the reader: the writer's futex word.
const OFF_SPACE_SEQ: usize = 136;
/// Bytes of a frame's length prefix.
const PREFIX: usize = 4;

/// Why a shared-memory link cannot go on.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LinkBroken {
    /// The link was stopped from this side (its QUIC connection closed).
    #[error("the link was closed")]
    Stopped,
    /// The other side wrote counters no honest peer writes.
    #[error("corrupt shared-memory ring: {0}")]
    Corrupt(String),
}

/// One mapping of a ring file.
struct Segment {
    map: Arc<MmapRaw>,
    capacity: u64,
    /// Set when the link's connection is closed: blocked waits give up.
    stop: Arc<AtomicBool>,
}

// SAFETY: the mapping is shared memory; every access goes through atomics (the counters) or
// through byte copies of ring regions that the counters hand to one side at a time.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    fn map(file: &File, capacity: u64, stop: Arc<AtomicBool>) -> anyhow::Result<Self> {
        let map = MmapRaw::map_raw(file).context("mapping the ring")?;
        anyhow::ensure!(
            map.len() as u64 == CONTROL as u64 + capacity,
            "ring size changed"
        );
        Ok(Segment {
            map: Arc::new(map),
            capacity,
            stop,
        })
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the 8-aligned control offsets inside the page-aligned map.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as `u64_at`, 4-aligned.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU32) }
    }

    fn ring(&self) -> *mut u8 {
        // SAFETY: CONTROL < map.len().
        unsafe { self.map.as_mut_ptr().add(CONTROL) }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Bytes in the ring between `read` and `written`, checked against the capacity.
    fn used(&self, written: u64, read: u64) -> Result<u64, LinkBroken> {
        let used = written.wrapping_sub(read);
        if used > self.capacity {
            return Err(LinkBroken::Corrupt(format!(
                "{used} bytes claimed in a {}-byte ring",
                self.capacity
            )));
        }
        Ok(used)
    }
}

/// The sending end of a ring.
pub struct Writer {
    seg: Segment,
    /// The ring's file name in [`SHM_DIR`], until the receiver has mapped it.
    path: Option<PathBuf>,
}

impl Writer {
    /// Creates a ring of `capacity` bytes in `dir` (owner-only, pages reserved) whose waits
    /// end when `stop` is set. Errors: the directory is missing or full.
    pub fn create(dir: &Path, capacity: u64, stop: Arc<AtomicBool>) -> anyhow::Result<Self> {
        anyhow::ensure!(
            CAPACITY_RANGE.contains(&capacity),
            "bad ring size {capacity}"
        );
        let name = format!(
            "murmur-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let len = CONTROL as u64 + capacity;
        // SAFETY: a valid open descriptor and a length.
        let rc =
            unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, len as i64) };
        if rc != 0 {
            let _ = std::fs::remove_file(&path);
            bail!(
                "reserving {len} bytes in {}: {}",
                dir.display(),
                std::io::Error::from_raw_os_error(rc)
            );
        }
        let seg = match Segment::map(&file, capacity, stop) {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        seg.u64_at(OFF_CAPACITY).store(capacity, Ordering::Relaxed);
        seg.u32_at(OFF_VERSION).store(VERSION, Ordering::Relaxed);
        seg.u64_at(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(Writer {
            seg,
            path: Some(path),
        })
    }

    /// The ring's file name (what the receiver is told).
    pub fn name(&self) -> String {
        self.path
            .as_deref()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Ring bytes.
    pub fn capacity(&self) -> u64 {
        self.seg.capacity
    }

    /// Removes the ring's name (the receiver has mapped it, or never will); the mappings live
    /// on.
    pub fn unlink(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Whether a frame of `len` bytes fits in the ring now (it then goes in without a wait:
    /// only this writer fills the ring).
    pub fn fits_now(&self, len: usize) -> bool {
        let s = &self.seg;
        let written = s.u64_at(OFF_WRITTEN).load(Ordering::Relaxed);
        let read = s.u64_at(OFF_READ).load(Ordering::Acquire);
        s.used(written, read)
            .is_ok_and(|used| s.capacity - used >= (PREFIX + len) as u64)
    }

    /// A handle that wakes this writer if it waits on a full ring ([`Wake`]).
    pub fn wake(&self) -> Wake {
        Wake {
            map: self.seg.map.clone(),
            word: OFF_SPACE_SEQ,
        }
    }

    /// Writes one frame (its length, then its bytes), waiting while the ring is full.
    /// Errors: the link was stopped, or the reader wrote an impossible counter.
    pub fn write_frame(&mut self, frame: &[u8]) -> Result<(), LinkBroken> {
        let len = u32::try_from(frame.len())
            .map_err(|_| LinkBroken::Corrupt(format!("a {}-byte frame", frame.len())))?;
        self.write_all(&len.to_le_bytes())?;
        self.write_all(frame)
    }

    fn write_all(&mut self, mut data: &[u8]) -> Result<(), LinkBroken> {
        let s = &self.seg;
        let cap = s.capacity;
        while !data.is_empty() {
            let written = s.u64_at(OFF_WRITTEN).load(Ordering::Relaxed);
            let seq = s.u32_at(OFF_SPACE_SEQ).load(Ordering::Acquire);
            let read = s.u64_at(OFF_READ).load(Ordering::Acquire);
            let free = cap - s.used(written, read)?;
            if free == 0 {
                if s.stopped() {
                    return Err(LinkBroken::Stopped);
                }
                futex_wait(s.u32_at(OFF_SPACE_SEQ), seq, POLL);
                continue;
            }
            let n = (free as usize).min(data.len()).min(CHUNK);
            let at = (written % cap) as usize;
            let first = n.min(cap as usize - at);
            // SAFETY: [at, at+first) and [0, n-first) lie in the ring and are free: the reader
            // does not touch bytes between `written` and `read + cap`.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), s.ring().add(at), first);
                std::ptr::copy_nonoverlapping(data.as_ptr().add(first), s.ring(), n - first);
            }
            s.u64_at(OFF_WRITTEN)
                .store(written + n as u64, Ordering::Release);
            s.u32_at(OFF_DATA_SEQ).fetch_add(1, Ordering::Release);
            futex_wake(s.u32_at(OFF_DATA_SEQ));
            data = &data[n..];
        }
        Ok(())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// What the reader found next in the ring.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// A whole frame (header and payload).
    Frame(Vec<u8>),
    /// A frame longer than the limit, skipped without allocation: its length in bytes.
    TooLong(usize),
}

/// The receiving end of a ring.
pub struct Reader {
    seg: Segment,
}

impl Reader {
    /// Maps the ring `name` of `capacity` bytes in `dir` that the peer at the other end of
    /// an authenticated connection created, and removes its name. Refused: a name that is
    /// not a ring's, a link, a file of another user or readable by others, a size or header
    /// that does not match.
    pub fn open(
        dir: &Path,
        name: &str,
        capacity: u64,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<Self> {
        let valid_name = name.starts_with("murmur-")
            && name.len() <= 64
            && name[7..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b'-');
        anyhow::ensure!(valid_name, "{name:?} is not a ring name");
        anyhow::ensure!(
            CAPACITY_RANGE.contains(&capacity),
            "bad ring size {capacity}"
        );
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let meta = file.metadata()?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        anyhow::ensure!(meta.is_file(), "{} is not a file", path.display());
        anyhow::ensure!(
            meta.uid() == me,
            "{} belongs to another user",
            path.display()
        );
        anyhow::ensure!(
            meta.mode() & 0o077 == 0,
            "{} is open to other users",
            path.display()
        );
        anyhow::ensure!(
            meta.len() == CONTROL as u64 + capacity,
            "{} has {} bytes, not {}",
            path.display(),
            meta.len(),
            CONTROL as u64 + capacity
        );
        let seg = Segment::map(&file, capacity, stop)?;
        let _ = std::fs::remove_file(&path);
        anyhow::ensure!(
            seg.u64_at(OFF_MAGIC).load(Ordering::Acquire) == MAGIC
                && seg.u32_at(OFF_VERSION).load(Ordering::Relaxed) == VERSION
                && seg.u64_at(OFF_CAPACITY).load(Ordering::Relaxed) == capacity,
            "{} is not a murmur ring of this version",
            path.display()
        );
        Ok(Reader { seg })
    }

    /// A handle that wakes this reader if it waits on an empty ring ([`Wake`]).
    pub fn wake(&self) -> Wake {
        Wake {
            map: self.seg.map.clone(),
            word: OFF_DATA_SEQ,
        }
    }

    /// The next frame, waiting for it; one longer than `limit` bytes is skipped in place.
    /// Errors: the link was stopped, or the writer wrote an impossible counter.
    pub fn read_frame(&mut self, limit: usize) -> Result<Incoming, LinkBroken> {
        self.read_frame_into(limit, |n| vec![0; n])
    }

    /// [`Reader::read_frame`], into the buffer `alloc(len)` gives for a frame of `len` bytes
    /// (a receive pool's: any contents, overwritten; resized to `len` if it is not).
    pub fn read_frame_into(
        &mut self,
        limit: usize,
        alloc: impl FnOnce(usize) -> Vec<u8>,
    ) -> Result<Incoming, LinkBroken> {
        let mut len = [0u8; PREFIX];
        self.consume(PREFIX, |chunk, at| {
            len[at..at + chunk.len()].copy_from_slice(chunk)
        })?;
        let len = u32::from_le_bytes(len) as usize;
        if len > limit {
            self.consume(len, |_, _| {})?;
            return Ok(Incoming::TooLong(len));
        }
        let mut frame = alloc(len);
        frame.resize(len, 0);
        self.consume(len, |chunk, at| {
            frame[at..at + chunk.len()].copy_from_slice(chunk)
        })?;
        Ok(Incoming::Frame(frame))
    }

    /// Takes the next `n` bytes out of the ring, chunk by chunk, handing each to `sink`
    /// with its offset, and releases each chunk's space at once.
    fn consume(&mut self, n: usize, mut sink: impl FnMut(&[u8], usize)) -> Result<(), LinkBroken> {
        let s = &self.seg;
        let cap = s.capacity;
        let mut done = 0;
        while done < n {
            let read = s.u64_at(OFF_READ).load(Ordering::Relaxed);
            let seq = s.u32_at(OFF_DATA_SEQ).load(Ordering::Acquire);
            let written = s.u64_at(OFF_WRITTEN).load(Ordering::Acquire);
            let available = s.used(written, read)?;
            if available == 0 {
                if s.stopped() {
                    return Err(LinkBroken::Stopped);
                }
                futex_wait(s.u32_at(OFF_DATA_SEQ), seq, POLL);
                continue;
            }
            let k = (available as usize).min(n - done).min(CHUNK);
            let at = (read % cap) as usize;
            let first = k.min(cap as usize - at);
            // SAFETY: [read, read+k) was published by the writer and is ours until we store
            // the new `read`.
            unsafe {
                sink(std::slice::from_raw_parts(s.ring().add(at), first), done);
                sink(
                    std::slice::from_raw_parts(s.ring(), k - first),
                    done + first,
                );
            }
            s.u64_at(OFF_READ).store(read + k as u64, Ordering::Release);
            s.u32_at(OFF_SPACE_SEQ).fetch_add(1, Ordering::Release);
            futex_wake(s.u32_at(OFF_SPACE_SEQ));
            done += k;
        }
        Ok(())
    }
}

/// Wakes one end of a ring ([`Reader::wake`], [`Writer::wake`]) if it waits (the reader on
/// an empty ring, the writer on a full one), so that it sees its stop flag at once rather
/// than after up to [`POLL`]: the link's close holds it.
pub struct Wake {
    map: Arc<MmapRaw>,
    /// The control offset of the futex word that end waits on.
    word: usize,
}

// SAFETY: as `Segment`'s: only the futex word is touched, through an atomic.
unsafe impl Send for Wake {}
unsafe impl Sync for Wake {}

impl Wake {
    /// Bumps the end's futex word and wakes it: an end about to wait sees the word changed
    /// and does not sleep; one asleep returns. Either then looks at its stop flag.
    pub fn wake(&self) {
        // SAFETY: `word` is one of the 4-aligned control offsets inside the page-aligned map.
        let word = unsafe { &*(self.map.as_mut_ptr().add(self.word) as *const AtomicU32) };
        word.fetch_add(1, Ordering::Release);
        futex_wake(word);
    }
}

/// Sleeps while `word` holds `expected`, at most `timeout` (shared, not private: the other
/// process wakes it).
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 in shared memory; a spurious or early return is
    // handled by the callers' loops.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes the other side's wait on `word`, if any.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: as `futex_wait`.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path, capacity: u64) -> (Writer, Reader, Arc<AtomicBool>) {
        let stop = Arc::new(AtomicBool::new(false));
        let mut w = Writer::create(dir, capacity, stop.clone()).unwrap();
        let r = Reader::open(dir, &w.name(), capacity, stop.clone()).unwrap();
        w.unlink();
        (w, r, stop)
    }

    /// Frames larger than the ring, of many sizes, cross it intact and in order while both
    /// sides run at once.
    #[test]
    fn frames_cross_a_small_ring_intact_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, mut r, _stop) = pair(dir.path(), 64 << 10);
        let sizes = [0usize, 1, 3, 4095, 4096, 65_535, 65_536, 200_001, 1 << 20];
        let frames: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (j * 31 + i * 7) as u8).collect())
            .collect();
        let expected = frames.clone();
        let writer = std::thread::spawn(move || {
            for f in &frames {
                w.write_frame(f).unwrap();
            }
            w
        });
        for f in &expected {
            assert_eq!(r.read_frame(2 << 20).unwrap(), Incoming::Frame(f.clone()));
        }
        writer.join().unwrap();
    }

    /// A frame over the limit is skipped without allocating and the next one still arrives.
    #[test]
    fn an_over_long_frame_is_skipped_and_the_stream_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, mut r, _stop) = pair(dir.path(), 64 << 10);
        w.write_frame(&[7; 1000]).unwrap();
        w.write_frame(&[9; 10]).unwrap();
        assert_eq!(r.read_frame(100).unwrap(), Incoming::TooLong(1000));
        assert_eq!(r.read_frame(100).unwrap(), Incoming::Frame(vec![9; 10]));
    }

    /// A blocked reader or writer gives up when the link is stopped.
    #[test]
    fn stopping_the_link_ends_blocked_waits() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, mut r, stop) = pair(dir.path(), 64 << 10);
        let reader = std::thread::spawn(move || r.read_frame(100));
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::Release);
        assert_eq!(reader.join().unwrap(), Err(LinkBroken::Stopped));
        // The ring fills (nobody reads), then the writer sees the stop.
        assert_eq!(w.write_frame(&[0; 100 << 10]), Err(LinkBroken::Stopped));
    }

    /// A writer that claims more bytes than the ring holds breaks the link.
    #[test]
    fn an_impossible_counter_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let (w, mut r, _stop) = pair(dir.path(), 64 << 10);
        w.seg.u64_at(OFF_WRITTEN).store(1 << 40, Ordering::Release);
        assert!(matches!(r.read_frame(100), Err(LinkBroken::Corrupt(_))));
    }

    /// The receiver refuses names that are not rings, files open to others, and sizes that
    /// differ from the file's; the file's name is gone once it is mapped.
    #[test]
    fn the_receiver_refuses_what_is_not_a_private_ring() {
        let dir = tempfile::tempdir().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        for bad in ["../etc/passwd", "passwd", "murmur-../../x"] {
            assert!(Reader::open(dir.path(), bad, 64 << 10, stop.clone()).is_err());
        }
        let w = Writer::create(dir.path(), 64 << 10, stop.clone()).unwrap();
        assert!(Reader::open(dir.path(), &w.name(), 128 << 10, stop.clone()).is_err());
        let path = dir.path().join(w.name());
        let mode = std::fs::metadata(&path).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let err = Reader::open(dir.path(), &w.name(), 64 << 10, stop.clone());
        assert!(format!("{:#}", err.err().unwrap()).contains("open to other users"));
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        Reader::open(dir.path(), &w.name(), 64 << 10, stop).unwrap();
        assert!(!path.exists());
    }
}

//! Signals: the launcher's handler for SIGINT and SIGTERM, passing signals to peers, and
//! peers dying with the launcher.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};

/// The last SIGINT/SIGTERM received (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    RECEIVED.store(signal, Ordering::SeqCst);
}

/// Installs the handler for SIGINT and SIGTERM (the launcher then stops its peers and
/// exits by itself).
pub(super) fn install() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a handler that only stores to an atomic; the
        // pointers passed are valid for the call.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// The signal received since [`install`], if any.
pub(super) fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Sends `signal` to `child` (nothing if it has exited and been reaped).
pub(super) fn send(child: &Child, signal: i32) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on a pid this process spawned and has not reaped.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// Whether `child` is stopped (state `T` or `t` in /proc/<pid>/stat).
pub(super) fn is_stopped(child: &Child) -> bool {
    crate::plane::process::is_stopped(child.id())
}

/// Makes the process `cmd` starts get SIGTERM when the launcher dies, even by SIGKILL
/// (Linux `PR_SET_PDEATHSIG`; elsewhere nothing).
pub(super) fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and
        // exec.
        let parent = unsafe { libc::getpid() };
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher died before prctl took effect.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

//! Child processes for the sanity suite: forked children that share this
//! process's memory image, re-executed helpers, and how a child ended.

use std::{
    io::Write,
    process::Child,
    thread,
    time::{Duration, Instant},
};

use rustix::process::{kill_process, waitpid, Pid, Signal, WaitOptions};

/// How a child process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Exited(i32),
    /// A signal killed it.
    Signaled(i32),
    /// It was still running at the deadline and was killed then.
    Hung,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Exited(code) => write!(f, "exited with status {code}"),
            Ended::Signaled(sig) => write!(f, "was killed by {}", signal_name(*sig)),
            Ended::Hung => f.write_str("hung and was killed"),
        }
    }
}

/// `SIGSEGV` and friends by name.
pub fn signal_name(sig: i32) -> String {
    match sig {
        6 => "SIGABRT".into(),
        7 => "SIGBUS".into(),
        9 => "SIGKILL".into(),
        11 => "SIGSEGV".into(),
        15 => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// Number of threads of this process, from `/proc/self/status`.
fn thread_count() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

/// Forks. The child runs `f` and exits with the status it returns; the
/// parent gets the child's pid. Refuses (with a message) unless this process
/// has a single thread, which is what makes running ordinary code in the
/// child sound.
#[allow(unsafe_code)]
pub fn fork_run(f: impl FnOnce() -> i32) -> Result<Pid, String> {
    match thread_count() {
        Some(1) => {}
        Some(n) => return Err(format!("cannot fork safely: the process has {n} threads")),
        None => return Err("cannot count this process's threads in /proc/self/status".into()),
    }
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: The process has one thread (checked above), so no lock can be
    // held by a thread that the child lacks, and the child may allocate and
    // run ordinary code. The child never returns from this function: it
    // exits with `f`'s status.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let code = f();
            let _ = std::io::stdout().flush();
            std::process::exit(code)
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            Pid::from_raw(child.as_raw()).ok_or_else(|| "fork returned pid 0".to_string())
        }
        Err(e) => Err(format!("fork failed: {e}")),
    }
}

/// Waits up to `timeout` for the forked child `pid`; kills it if it is still
/// running then.
pub fn wait_pid(pid: Pid, timeout: Duration) -> Ended {
    let deadline = Instant::now() + timeout;
    loop {
        match waitpid(Some(pid), WaitOptions::NOHANG) {
            Ok(Some((_, status))) => {
                if let Some(sig) = status.terminating_signal() {
                    return Ended::Signaled(sig);
                }
                return Ended::Exited(status.exit_status().unwrap_or(-1));
            }
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return Ended::Exited(-1),
        }
        if Instant::now() >= deadline {
            let _ = kill_process(pid, Signal::KILL);
            let _ = waitpid(Some(pid), WaitOptions::empty());
            return Ended::Hung;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Waits up to `timeout` for a spawned child; kills it if it is still
/// running then.
pub fn wait_child(child: &mut Child, timeout: Duration) -> Ended {
    use std::os::unix::process::ExitStatusExt;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                if let Some(sig) = status.signal() {
                    return Ended::Signaled(sig);
                }
                return Ended::Exited(status.code().unwrap_or(-1));
            }
            Ok(None) => {}
            Err(_) => return Ended::Exited(-1),
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ended::Hung;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_read_well() {
        assert_eq!(Ended::Signaled(11).to_string(), "was killed by SIGSEGV");
        assert_eq!(Ended::Exited(3).to_string(), "exited with status 3");
        assert_eq!(signal_name(7), "SIGBUS");
    }

    #[test]
    fn spawned_children_are_reaped_or_killed() {
        let mut c = std::process::Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .unwrap();
        assert_eq!(
            wait_child(&mut c, Duration::from_secs(10)),
            Ended::Exited(7)
        );
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert_eq!(wait_child(&mut c, Duration::from_millis(50)), Ended::Hung);
    }

    #[test]
    fn fork_refuses_a_threaded_process() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let other = thread::spawn(move || rx.recv());
        let e = fork_run(|| 0).unwrap_err();
        assert!(e.contains("threads"), "{e}");
        drop(tx);
        let _ = other.join();
    }
}

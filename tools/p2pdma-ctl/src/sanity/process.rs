//! Who may use the module's fd and memory: a forked child, the owner after
//! closing the fd, a process that receives the fd, a process without
//! privileges, and a process killed in the middle of its I/O.

use std::{io::IoSlice, os::fd::AsFd, process::Stdio, thread, time::Duration};

use p2pdma::{
    sys::{self, HostBuffer, Sharing},
    Module,
};
use p2pdma_abi as abi;
use rustix::{
    io::Errno,
    net::{
        sendmsg, socketpair, AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
        SocketFlags, SocketType,
    },
    process::{getuid, kill_process, Pid, Signal},
};

use super::{
    all, all_or_skip, line_reader, skip, verify, want_errno, write_verify, Ctx, ExpectP2p, Why,
    KIB, MIB, PAGE, R, SIGKILL, SIGSEGV,
};
use crate::{
    child::{self, parse_kv, NOBODY},
    proc::{self, Ended},
    util::errno_name,
};

impl Ctx {
    pub(super) fn fork_child_segv(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let map = a.map()?;
        write_verify(&map, 31)?;
        let pid = proc::fork_run(|| {
            let mut b = [0u8; 8];
            let _ = map.read_at(0, &mut b);
            0
        })?;
        match proc::wait_pid(pid, Duration::from_secs(30)) {
            Ended::Signaled(SIGSEGV) => {}
            other => fail!("a forked child touching the parent's mapping {other}; expected SIGSEGV (VM_DONTCOPY)"),
        }
        verify(&map, 31, "parent's data after the child died")
    }

    /// Forks a child that runs `f` (returning an errno as [`child::code`]
    /// does) and checks that it reported `want`.
    fn fork_expect(&self, what: &str, want: Errno, f: impl FnOnce() -> i32) -> R {
        let pid = proc::fork_run(f)?;
        match proc::wait_pid(pid, Duration::from_secs(30)) {
            Ended::Exited(c) if c == want.raw_os_error() => Ok(()),
            Ended::Exited(0) => fail!(
                "{what} succeeded in a forked child, expected {}",
                errno_name(want)
            ),
            Ended::Exited(c) => fail!(
                "{what} in a forked child gave {}, expected {}",
                errno_name(Errno::from_raw_os_error(c)),
                errno_name(want)
            ),
            other => fail!("the forked child {other}"),
        }
    }

    pub(super) fn fork_child_mmap(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let map = a.map()?;
        write_verify(&map, 32)?;
        let (len, off) = (a.size() as usize, a.mmap_offset());
        self.fork_expect("mmap of the inherited fd", Errno::PERM, || {
            child::code(&self.map_raw(len, off, Sharing::Shared))
        })?;
        verify(&map, 32, "parent's data after the child's mmap")
    }

    pub(super) fn fork_child_alloc(&self) -> R {
        self.fork_expect("ALLOC on the inherited fd", Errno::PERM, || {
            let mut arg = self.good_alloc();
            child::code(&sys::alloc(&self.module, &mut arg))
        })
    }

    pub(super) fn fork_child_free(&self) -> R {
        let a = self.module.alloc(self.dev, PAGE, 0)?;
        let handle = a.handle();
        self.fork_expect(
            "FREE of the parent's handle on the inherited fd",
            Errno::PERM,
            || {
                child::code(&self.free_arg(abi::P2pdmaFree {
                    handle,
                    ..Default::default()
                }))
            },
        )?;
        a.free()
            .map_err(|e| Why::Fail(format!("the parent's FREE after the child's attempt: {e}")))
    }

    pub(super) fn fork_child_unmap(&self) -> R {
        let buf = HostBuffer::new(64 * KIB as usize).map_err(|e| format!("host buffer: {e}"))?;
        let m = self
            .module
            .pin_user(buf.addr(), 64 * KIB, self.host_peer())?;
        let map_handle = m.map_handle();
        let in_child = self.fork_expect(
            "UNMAP of the parent's mapping on the inherited fd",
            Errno::PERM,
            || {
                child::code(&self.unmap_arg(abi::P2pdmaUnmap {
                    map_handle,
                    ..Default::default()
                }))
            },
        );
        let parent = self
            .module
            .unmap(m)
            .map_err(|e| Why::Fail(format!("the parent's UNMAP after the child's attempt: {e}")));
        all(vec![in_child, parent])
    }

    pub(super) fn close_before_munmap(&self) -> R {
        let before = self.available()?;
        let m2 = Module::open_path(&self.node)?;
        let a = m2.alloc(self.dev, MIB, 0)?;
        let map = a.map()?;
        write_verify(&map, 41)?;
        let _ = a.into_handle();
        drop(m2);
        verify(&map, 41, "after closing the fd")?;
        write_verify(&map, 42)?;
        let during = self.available()?;
        ensure!(
            before.saturating_sub(during) >= MIB,
            "with the fd closed but the memory mapped, p2pmem/available is {during} (was {before}): the memory went back while mapped"
        );
        drop(map);
        self.leak_check()
    }

    pub(super) fn scm_rights(&self) -> R {
        let a = self.module.alloc(self.dev, 64 * KIB, 0)?;
        let map = a.map()?;
        write_verify(&map, 51)?;
        let (mine, theirs) = socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| format!("socketpair: {e}"))?;
        let child = self.spawn_child(
            &[
                "recv-fd".into(),
                "--dev".into(),
                self.dev.to_string(),
                "--size".into(),
                a.size().to_string(),
                "--offset".into(),
                a.mmap_offset().to_string(),
            ],
            Stdio::from(theirs),
        )?;
        let fds = [self.module.as_fd()];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(&fds));
        let sent = sendmsg(
            &mine,
            &[IoSlice::new(b"f")],
            &mut control,
            SendFlags::empty(),
        );
        let (ended, out) = self.finish_child(child, Duration::from_secs(30));
        sent.map_err(|e| format!("sendmsg with SCM_RIGHTS: {e}"))?;
        ensure!(
            ended == Ended::Exited(0),
            "the receiving process {ended}: {}",
            out.trim()
        );
        let kv = parse_kv(&out);
        let errno = |k: &str| -> Result<Errno, Why> {
            let v = kv
                .get(k)
                .ok_or_else(|| Why::Fail(format!("no {k}= in {:?}", out.trim())))?;
            v.parse::<i32>()
                .map(Errno::from_raw_os_error)
                .map_err(|_| Why::Fail(format!("bad {k}={v}")))
        };
        let res = |e: Errno| {
            if e.raw_os_error() == 0 {
                Ok(())
            } else {
                Err(e)
            }
        };
        all(vec![
            want_errno("mmap of a received fd", res(errno("mmap")?), Errno::PERM),
            want_errno("ALLOC on a received fd", res(errno("alloc")?), Errno::PERM),
            verify(&map, 51, "sender's data afterwards"),
        ])
    }

    pub(super) fn unprivileged(&self) -> R {
        if !getuid().is_root() {
            return skip("needs root, to drop privileges");
        }
        let (kv, out) =
            self.run_helper(&self.helper_args("unprivileged"), Duration::from_secs(30))?;
        let get = |k: &str| {
            kv.get(k)
                .cloned()
                .ok_or_else(|| Why::Fail(format!("no {k}= in {:?}", out.trim())))
        };
        ensure!(
            get("uid")? == NOBODY.to_string() && get("euid")? == NOBODY.to_string(),
            "the helper did not drop to uid {NOBODY}: {}",
            out.trim()
        );
        let check = |k: &str| -> R {
            let v = get(k)?;
            if v == "skip" {
                return skip(format!(
                    "{k} was not tried: the helper had nothing to try it on"
                ));
            }
            let e: i32 = v.parse().map_err(|_| Why::Fail(format!("bad {k}={v}")))?;
            let r = if e == 0 {
                Ok(())
            } else {
                Err(Errno::from_raw_os_error(e))
            };
            want_errno(&format!("{k} as uid {NOBODY}"), r, Errno::PERM)
        };
        all_or_skip(vec![
            check("dma_map"),
            check("pin_user"),
            check("dmabuf_import"),
        ])
    }

    pub(super) fn killed_mid_io(&self) -> R {
        self.nvme()?;
        let mut child = self.spawn_child(
            &[
                "io-loop".into(),
                "--dev".into(),
                self.dev.to_string(),
                "--nvme".into(),
                self.nvme_path.clone(),
            ],
            Stdio::null(),
        )?;
        let lines = line_reader(child.stdout.take().ok_or("no stdout pipe")?);
        let first = match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(e) => {
                let ended = proc::wait_child(&mut child, Duration::ZERO);
                fail!("the I/O loop reported nothing ({e}); it {ended}");
            }
        };
        thread::sleep(Duration::from_millis(300));
        let pid = Pid::from_child(&child);
        let still = matches!(child.try_wait(), Ok(None));
        let _ = kill_process(pid, Signal::KILL);
        let ended = proc::wait_child(&mut child, Duration::from_secs(30));
        let kv = parse_kv(&first);
        if let Some(e) = kv.get("error") {
            fail!("the I/O loop failed: {e}");
        }
        ensure!(
            still,
            "the I/O loop ended by itself ({ended}) after {first:?}"
        );
        ensure!(
            ended == Ended::Signaled(SIGKILL),
            "the I/O loop {ended}, expected SIGKILL"
        );
        let read_ok = kv.get("first").map(String::as_str) == Some("ok");
        let matched = kv.get("match").map(String::as_str) == Some("1");
        match self.expect {
            Some(ExpectP2p::Supported) => {
                ensure!(read_ok && matched, "O_DIRECT read into P2P memory: {first}")
            }
            Some(ExpectP2p::Unsupported) => ensure!(
                !read_ok,
                "O_DIRECT read into P2P memory worked although P2P is unsupported: {first}"
            ),
            None => ensure!(
                !read_ok || matched,
                "the P2P read's data differs from a host read: {first}"
            ),
        }
        self.leak_check()
    }
}

//! The tool's behaviour on a machine without the module, and the plumbing
//! of the sanity suite's helper processes.

use std::{
    io::IoSlice,
    mem::MaybeUninit,
    os::fd::AsFd,
    process::{Command, Stdio},
};

use rustix::{
    fs::{ftruncate, memfd_create, MemfdFlags},
    net::{
        sendmsg, socketpair, AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
        SocketFlags, SocketType,
    },
};

const CTL: &str = env!("CARGO_BIN_EXE_p2pdma-ctl");

#[test]
fn sanity_without_the_module_fails_setup_and_summarises() {
    let out = Command::new(CTL)
        .args(["--node", "/nonexistent/p2pdma", "sanity"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(!out.status.success());
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].starts_with("FAIL setup: cannot open /nonexistent/p2pdma"),
        "{stdout}"
    );
    assert_eq!(lines[1], "sanity: 0 passed, 1 failed, 0 skipped");
}

#[test]
fn ioctl_commands_report_a_missing_module() {
    let out = Command::new(CTL)
        .args(["--node", "/nonexistent/p2pdma", "alloc", "--size", "4K"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot open /nonexistent/p2pdma"), "{err}");
}

#[test]
fn peers_are_required_and_exclusive() {
    for args in [
        &["p2p-query"][..],
        &[
            "p2p-query",
            "--peer-fd",
            "/dev/null",
            "--peer-pci",
            "0000:00:01.0",
        ],
        &["dma-map", "--peer-pci", "0000:00:01.0x"],
    ] {
        let out = Command::new(CTL).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?} was accepted");
    }
}

#[test]
fn recv_fd_helper_gets_the_descriptor_over_scm_rights() {
    // A memfd stands in for /dev/p2pdma: mapping it works, and ALLOC on it
    // is an unknown ioctl.
    let memfd = memfd_create("ctl-test", MemfdFlags::CLOEXEC).unwrap();
    ftruncate(&memfd, 8192).unwrap();
    let (mine, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let child = Command::new(CTL)
        .args([
            "__child", "recv-fd", "--dev", "0", "--size", "4096", "--offset", "4096",
        ])
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let fds = [memfd.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    sendmsg(
        &mine,
        &[IoSlice::new(b"f")],
        &mut control,
        SendFlags::empty(),
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "mmap=0 alloc=25"
    );
}

//! Many submitters against a model controller: a thread that fetches
//! entries in order from the tail doorbell, does each READ (filling the
//! data pages its PRPs name with bytes derived from the block address),
//! and posts completions in random order, never into a full completion
//! queue. It checks that no command id is reused while in flight.
use super::*;
use proptest::prelude::*;
use std::{collections::HashSet, sync::atomic::AtomicBool};

/// Runs test `name` of this binary in a child process with `env` set
/// and its standard error a pipe closed at once; how the child ended.
fn in_child_without_stderr(name: &str, env: &str) -> std::process::ExitStatus {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(env, "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    child.wait().unwrap()
}

/// A controller that failed and that nothing stops: `CSTS.RDY` stays 1,
/// and there is no device to reset.
fn unstoppable() -> Health {
    let bar = Arc::new(Bar::anonymous(0x2000));
    bar.write32(crate::nvme::spec::reg::CSTS, 1).unwrap();
    let h = Health::new(Stopper {
        bar,
        ready_timeout: Duration::from_millis(10),
        device: None,
    });
    h.fail("a test".into());
    assert!(!h.stopped());
    h
}

#[test]
fn an_unstoppable_controller_ends_the_process_even_with_standard_error_gone() {
    use std::os::unix::process::ExitStatusExt;
    if std::env::var_os("P2PDMA_TEST_ABORT_CHILD").is_some() {
        // The pipe's reader is gone before this runs.
        std::thread::sleep(Duration::from_millis(50));
        unstoppable().release_or_abort("a test");
        return;
    }
    let status = in_child_without_stderr(
        "queues::qpair::tests::an_unstoppable_controller_ends_the_process_even_with_standard_error_gone",
        "P2PDMA_TEST_ABORT_CHILD",
    );
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status}");
}

#[test]
fn a_panic_under_abort_on_unwind_ends_the_process() {
    use std::os::unix::process::ExitStatusExt;
    if std::env::var_os("P2PDMA_TEST_UNWIND_CHILD").is_some() {
        let _guard = AbortOnUnwind("a test");
        panic!("unwinding through the guard");
    }
    let status = in_child_without_stderr(
        "queues::qpair::tests::a_panic_under_abort_on_unwind_ends_the_process",
        "P2PDMA_TEST_UNWIND_CHILD",
    );
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status}");
    // Without a panic, it does nothing.
    drop(AbortOnUnwind("a test"));
}

const BLOCK: usize = 512;

fn byte(slba: u64, i: usize) -> u8 {
    (slba.wrapping_mul(31) as usize + i * 7 + (i >> 9)) as u8
}

/// Statuses the model answers with: LBA Out of Range for every block
/// address that is 5 modulo 13.
fn status_for(slba: u64) -> u16 {
    if slba % 13 == 5 {
        0x80
    } else {
        0
    }
}

/// The data pages of a command, from its PRPs.
fn pages(prp1: u64, prp2: u64, len: usize) -> Vec<(u64, usize)> {
    let first = (PAGE - (prp1 as usize % PAGE)).min(len);
    let mut out = vec![(prp1, first)];
    let rest = len - first;
    let n = rest.div_ceil(PAGE);
    for k in 0..n {
        let a = if n == 1 {
            prp2
        } else {
            // SAFETY: The list page the submitter wrote, `n` entries.
            unsafe { ptr::read_volatile((prp2 as *const u64).add(k)) }
        };
        out.push((a, PAGE.min(rest - k * PAGE)));
    }
    out
}

/// With `irq`, the model signals it after posting completions, as an
/// MSI-X vector does, sometimes only after posting more.
#[allow(clippy::too_many_arguments)]
fn model(
    bar: &Bar,
    sq: *mut u8,
    cq: *mut u8,
    entries: u32,
    stop: &AtomicBool,
    seed: u64,
    irq: Option<&OwnedFd>,
) -> Result<u64, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut owed = false;
    let (mut head, mut cq_tail, mut phase) = (0u32, 0u32, true);
    let mut fetched: Vec<(u16, u16)> = Vec::new();
    let mut in_flight = HashSet::new();
    let mut done = 0u64;
    loop {
        let tail = bar.read32(nvme::doorbell(1, false, 4))?;
        if tail >= entries {
            return Err(format!("tail doorbell {tail} of {entries} entries"));
        }
        while head != tail {
            let mut e = [0u8; 64];
            for (i, b) in e.iter_mut().enumerate() {
                // SAFETY: Inside the submission queue.
                *b = unsafe { ptr::read_volatile(sq.add(64 * head as usize + i)) };
            }
            let dw = |i: usize| u32::from_le_bytes(e[4 * i..4 * i + 4].try_into().unwrap());
            let cid = (dw(0) >> 16) as u16;
            if !in_flight.insert(cid) {
                return Err(format!("command id {cid} submitted while in flight"));
            }
            let prp1 = u64::from(dw(6)) | u64::from(dw(7)) << 32;
            let prp2 = u64::from(dw(8)) | u64::from(dw(9)) << 32;
            let slba = u64::from(dw(10)) | u64::from(dw(11)) << 32;
            let len = (dw(12) as usize + 1) * BLOCK;
            let mut i = 0;
            for (a, n) in pages(prp1, prp2, len) {
                for k in 0..n {
                    // SAFETY: The submitter's buffer, which it keeps
                    // until the completion.
                    unsafe { ptr::write_volatile((a as *mut u8).add(k), byte(slba, i + k)) };
                }
                i += n;
            }
            fetched.push((cid, status_for(slba)));
            head = (head + 1) % entries;
        }
        if !fetched.is_empty() && !rng.u64(..).is_multiple_of(3) {
            let cq_head = bar.read32(nvme::doorbell(1, true, 4))?;
            if (cq_tail + 1) % entries != cq_head {
                let i = (rng.u64(..) % fetched.len() as u64) as usize;
                let (cid, status) = fetched.swap_remove(i);
                in_flight.remove(&cid);
                let at = cq.wrapping_add(16 * cq_tail as usize).cast::<u32>();
                let dw3 = u32::from(cid) | u32::from(phase) << 16 | u32::from(status) << 17;
                // SAFETY: Entry `cq_tail` of the completion queue,
                // which the poller does not own until its phase flips.
                unsafe {
                    ptr::write_volatile(at, 0);
                    ptr::write_volatile(at.add(2), head | 1 << 16);
                    fence(Ordering::SeqCst);
                    ptr::write_volatile(at.add(3), dw3);
                }
                cq_tail += 1;
                if cq_tail == entries {
                    cq_tail = 0;
                    phase = !phase;
                }
                done += 1;
                owed = true;
            }
        }
        if let Some(fd) = irq {
            if owed && (fetched.is_empty() || rng.u64(..).is_multiple_of(2)) {
                rustix::io::write(fd, &1u64.to_ne_bytes()).map_err(|e| e.to_string())?;
                owed = false;
            }
        }
        if stop.load(Ordering::SeqCst) && fetched.is_empty() {
            return Ok(done);
        }
        std::hint::spin_loop();
    }
}

/// `threads` submitters share one queue against the model, each with up
/// to `batch` commands in flight (written without a doorbell when
/// `seed` says so, rung by the next wait). With `irq`, waiters sleep on
/// the model's interrupt, with no time limit on a sleep: a wake-up lost
/// is a hang, which the two-second wait turns into a failure.
fn run(entries: u16, threads: usize, per_thread: usize, batch: usize, seed: u64, irq: bool) {
    let e = usize::from(entries);
    let bar = Arc::new(Bar::anonymous(0x2000));
    let mem = vec![0u64; (64 * e + 16 * e + (e - 1) * PAGE + PAGE) / 8 + PAGE / 8];
    let base = (mem.as_ptr() as usize).next_multiple_of(PAGE) as *mut u8;
    let place = |off: usize| Place {
        cpu: base.wrapping_add(off),
        bus: base as u64 + off as u64,
    };
    let (sq, cq) = (place(0), place(64 * e));
    let lists = place((64 * e + 16 * e).next_multiple_of(PAGE));
    let health = Arc::new(Health::new(Stopper {
        bar: bar.clone(),
        ready_timeout: Duration::from_secs(1),
        device: None,
    }));
    let efd = irq.then(|| {
        Arc::new(rustix::event::eventfd(0, rustix::event::EventfdFlags::empty()).unwrap())
    });
    let mut q = QueuePair::new(
        1,
        entries,
        (sq, cq, lists),
        bar.clone(),
        4,
        health,
        efd.clone(),
    );
    q.sleep_max = Duration::from_secs(3600);
    let stop = AtomicBool::new(false);
    let (sq_cpu, cq_cpu) = (sq.cpu as usize, cq.cpu as usize);
    thread::scope(|s| {
        let m = s.spawn(|| {
            model(
                &bar,
                sq_cpu as *mut u8,
                cq_cpu as *mut u8,
                u32::from(entries),
                &stop,
                seed,
                efd.as_deref(),
            )
        });
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let q = &q;
                s.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(seed ^ ((t as u64 + 1) * 0x9e37_79b9));
                    let mut left = per_thread;
                    while left > 0 {
                        let n = batch.min(left);
                        // Up to `n` in flight; on a full queue, the
                        // oldest of this thread's commands first.
                        let mut flight = std::collections::VecDeque::new();
                        let check =
                            |(t, slba, blocks, skew, buf): (Ticket, u64, usize, usize, Vec<u8>)| {
                                let far = Instant::now() + Duration::from_secs(2);
                                let c = q.wait(&t, far).unwrap();
                                assert_eq!(
                                    c.status,
                                    status_for(slba),
                                    "status of the read at {slba}"
                                );
                                if c.status == 0 {
                                    for i in 0..blocks * BLOCK {
                                        assert_eq!(
                                            buf[skew + i],
                                            byte(slba, i),
                                            "byte {i} of the read at {slba}"
                                        );
                                    }
                                }
                            };
                        for _ in 0..n {
                            let blocks = 1 + (rng.u64(..) % 24) as usize;
                            let slba = rng.u64(..) % 100_000;
                            let skew = 4 * (rng.u64(..) % 64) as usize;
                            let buf = vec![0u8; blocks * BLOCK + skew + PAGE];
                            let at = buf.as_ptr() as u64 + skew as u64;
                            let d = nvme::data_ptr(
                                |o| Some((at + o as u64, blocks * BLOCK - o)),
                                0,
                                blocks * BLOCK,
                            )
                            .unwrap();
                            let cmd = Command {
                                opcode: nvme::io::READ,
                                nsid: 1,
                                cdw: [slba as u32, 0, blocks as u32 - 1, 0, 0, 0],
                                ..Default::default()
                            };
                            let t = loop {
                                match q.submit(
                                    &cmd,
                                    Some(&d),
                                    (None, 0),
                                    !rng.u64(..).is_multiple_of(3),
                                ) {
                                    Ok(t) => break t,
                                    Err(WaitError::Full) => match flight.pop_front() {
                                        Some(f) => check(f),
                                        None => thread::yield_now(),
                                    },
                                    Err(e) => panic!("submit: {e:?}"),
                                }
                            };
                            flight.push_back((t, slba, blocks, skew, buf));
                        }
                        for f in flight {
                            check(f);
                        }
                        left -= n;
                    }
                })
            })
            .collect();
        let joined: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        stop.store(true, Ordering::SeqCst);
        for j in joined {
            j.unwrap();
        }
        let done = m.join().unwrap().unwrap();
        assert_eq!(done, (threads * per_thread) as u64);
    });
    let (d, s) = (
        q.doorbells.load(Ordering::Relaxed),
        q.submitted.load(Ordering::Relaxed),
    );
    assert_eq!(s, (threads * per_thread) as u64);
    let unwoken = q.sleeps_unwoken.load(Ordering::Relaxed);
    assert_eq!(
        unwoken, 0,
        "{unwoken} sleeps lasted until the waiter's deadline"
    );
    assert!(d >= 1 && d <= s, "{d} doorbells for {s} commands");
    drop(mem);
}

/// A queue pair over anonymous memory whose controller registers say
/// `csts`, with one command submitted in scope 7 and never completed.
fn stuck(csts: u32) -> (Arc<Bar>, Vec<u64>, QueuePair, Ticket) {
    let bar = Arc::new(Bar::anonymous(0x2000));
    bar.write32(nvme::reg::CC, 1).unwrap();
    bar.write32(nvme::reg::CSTS, csts).unwrap();
    let mut mem = vec![0u64; 4 * PAGE / 8];
    let base = (mem.as_mut_ptr() as usize).next_multiple_of(PAGE) as *mut u8;
    let place = |off: usize| Place {
        cpu: base.wrapping_add(off),
        bus: base as u64 + off as u64,
    };
    let health = Arc::new(Health::new(Stopper {
        bar: bar.clone(),
        ready_timeout: Duration::from_millis(30),
        device: None,
    }));
    let q = QueuePair::new(
        1,
        4,
        (place(0), place(PAGE), place(2 * PAGE)),
        bar.clone(),
        4,
        health,
        None,
    );
    let cmd = Command {
        opcode: nvme::io::FLUSH,
        nsid: 1,
        ..Default::default()
    };
    let t = q.submit(&cmd, None, (None, 7), true).unwrap();
    (bar, mem, q, t)
}

#[test]
fn a_drain_refuses_new_commands_and_waits_for_those_the_controller_has() {
    let (_bar, mem, q, t) = stuck(0);
    let cmd = Command {
        opcode: nvme::io::FLUSH,
        nsid: 1,
        ..Default::default()
    };
    // The command is at the controller: the drain gives up at its limit.
    assert!(!q.health.drain("revoked: a test", Duration::from_millis(50)));
    match q.submit(&cmd, None, (None, 7), true) {
        Err(WaitError::Failed(why)) => assert!(why.contains("revoked: a test"), "{why}"),
        r => panic!("a submission during a drain gave {:?}", r.map(|t| t.cid)),
    }
    // The controller completes it (entry 0 of the completion queue,
    // phase 1): the drain is over once its waiter took it.
    let cq = (mem.as_ptr() as usize).next_multiple_of(PAGE) + PAGE;
    // SAFETY: The completion queue's first entry, in `mem`.
    unsafe {
        let e = cq as *mut u32;
        ptr::write_volatile(e.add(2), 1 | 1 << 16);
        ptr::write_volatile(e.add(3), u32::from(t.cid) | 1 << 16);
    }
    let done = thread::scope(|s| {
        let drain = s.spawn(|| q.health.drain("revoked: a test", Duration::from_secs(5)));
        thread::sleep(Duration::from_millis(20));
        q.wait(&t, Instant::now() + Duration::from_secs(1)).unwrap();
        drain.join().unwrap()
    });
    assert!(done, "the drain did not see the command complete");
    assert!(
        q.health.failure().is_none(),
        "a drain does not fail the controller"
    );
}

#[test]
fn a_controller_that_cannot_be_stopped_keeps_its_command_ids() {
    // CSTS.RDY stays set: disabling fails, and there is no VFIO device
    // to turn bus mastering off or reset.
    let (_bar, _mem, q, t) = stuck(1);
    q.health.fail("a test".into());
    assert!(!q.health.stopped());
    let why = q.health.failure().unwrap();
    assert!(why.contains("no other way to stop it"), "{why}");
    let far = Instant::now() + Duration::from_secs(1);
    assert!(matches!(q.wait(&t, far), Err(WaitError::Failed(_))));
    // The id, and so the command's memory, stays taken for good.
    assert_eq!(q.unconsumed(7).len(), 1);
    q.forget(t);
    assert_eq!(q.unconsumed(7).len(), 1);

    // A controller that disables: its ids are freed.
    let (_bar, _mem, q, t) = stuck(0);
    q.health.fail("a test".into());
    assert!(q.health.stopped());
    assert!(matches!(q.wait(&t, far), Err(WaitError::Failed(_))));
    assert!(q.unconsumed(7).is_empty());
}

#[test]
fn a_controller_becoming_ready_is_not_disabled_before_it_is() {
    // CC.EN = 1, CSTS.RDY = 0: the controller is still enabling. The
    // model makes it ready after a while, and clears RDY once EN is
    // cleared; EN must not be cleared before RDY was set.
    let bar = Arc::new(Bar::anonymous(0x2000));
    bar.write32(nvme::reg::CC, 1).unwrap();
    bar.write32(nvme::reg::CSTS, 0).unwrap();
    let early = thread::scope(|s| {
        let m = s.spawn(|| {
            let t0 = Instant::now();
            let mut early = false;
            while t0.elapsed() < Duration::from_millis(50) {
                early |= bar.read32(nvme::reg::CC).unwrap() & 1 == 0;
                std::hint::spin_loop();
            }
            bar.write32(nvme::reg::CSTS, 1).unwrap();
            while bar.read32(nvme::reg::CC).unwrap() & 1 != 0 {
                std::hint::spin_loop();
            }
            bar.write32(nvme::reg::CSTS, 0).unwrap();
            early
        });
        registers::disable(&bar, Duration::from_secs(2)).unwrap();
        m.join().unwrap()
    });
    assert!(!early, "CC.EN was cleared while CSTS.RDY was still 0");
}

#[test]
fn memory_given_to_a_controller_goes_back_only_once_it_is_stopped() {
    struct Given<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Given<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    for stoppable in [true, false] {
        // A controller enabled and ready; one that stops clears RDY
        // once EN is cleared, one that does not keeps it set.
        let bar = Arc::new(Bar::anonymous(0x2000));
        bar.write32(nvme::reg::CC, 1).unwrap();
        bar.write32(nvme::reg::CSTS, 1).unwrap();
        let health = Health::new(Stopper {
            bar: bar.clone(),
            ready_timeout: Duration::from_millis(100),
            device: None,
        });
        let dropped = std::sync::atomic::AtomicBool::new(false);
        let released = thread::scope(|s| {
            let model = s.spawn(|| {
                while bar.read32(nvme::reg::CC).unwrap() & 1 != 0 {
                    std::hint::spin_loop();
                }
                if stoppable {
                    bar.write32(nvme::reg::CSTS, 0).unwrap();
                }
                dropped.load(Ordering::SeqCst)
            });
            let released = health.release_when_stopped(Given(&dropped), drop);
            let dropped_before_en_cleared = model.join().unwrap();
            assert!(!dropped_before_en_cleared);
            released
        });
        assert_eq!(released, stoppable);
        assert_eq!(dropped.load(Ordering::SeqCst), stoppable);
    }
}

#[test]
fn a_full_queue_of_one_thread() {
    run(4, 1, 200, 3, 7, false);
    run(4, 1, 200, 3, 7, true);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn many_submitters_share_one_queue(
        entries in 2u16..40,
        threads in 1usize..8,
        batch in 1usize..12,
        seed in any::<u64>(),
        irq in any::<bool>(),
    ) {
        run(entries, threads, 60, batch, seed, irq);
    }
}

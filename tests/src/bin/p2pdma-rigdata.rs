//! Host side of the VM rig: makes the NVMe image and checks what landed in
//! the accelerator's backing file.

use std::{
    fs::File,
    io::{BufWriter, Read, Seek, SeekFrom, Write},
    process::ExitCode,
};

use clap::{Parser, Subcommand};
use p2pdma_tests::{
    fill_image, fnv1a,
    mdlayout::{Layout, Level},
};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write a rig image of `mib` MiB with non-repeating content: the rig
    /// content from byte `pattern_offset` (a multiple of 1 MiB) on, so that
    /// two images can differ everywhere.
    MakeImage {
        path: String,
        mib: u64,
        #[arg(long, default_value_t = 0)]
        pattern_offset: u64,
    },
    /// Check that `len` bytes of `file` at `offset` equal the rig image's
    /// bytes at `pattern_offset`.
    ComparePattern {
        #[arg(long)]
        file: String,
        #[arg(long)]
        offset: u64,
        #[arg(long)]
        pattern_offset: u64,
        #[arg(long)]
        len: u64,
    },
    /// Compare `len` bytes of `actual` at `actual_offset` with `expected` at
    /// `expected_offset`; print the first difference.
    Compare {
        #[arg(long)]
        expected: String,
        #[arg(long)]
        expected_offset: u64,
        #[arg(long)]
        actual: String,
        #[arg(long)]
        actual_offset: u64,
        #[arg(long)]
        len: u64,
    },
    /// Check `len` bytes of `actual` at `actual_offset` against the bytes
    /// at `array_offset` of an md array, read from its members' images in
    /// `dir` where the array's layout (`--layout`, see `mdlayout`) puts
    /// them.
    ArrayCompare {
        #[arg(long)]
        dir: String,
        #[arg(long)]
        layout: String,
        #[arg(long)]
        array_offset: u64,
        #[arg(long)]
        actual: String,
        #[arg(long)]
        actual_offset: u64,
        #[arg(long)]
        len: u64,
    },
    /// Check that every copy of the `len` bytes at `array_offset` of an md
    /// array, in its members' images in `dir`, is the rig image's bytes at
    /// `pattern_offset`: each leg of a mirror is read back.
    ArrayPattern {
        #[arg(long)]
        dir: String,
        #[arg(long)]
        layout: String,
        #[arg(long)]
        array_offset: u64,
        #[arg(long)]
        pattern_offset: u64,
        #[arg(long)]
        len: u64,
    },
}

/// The rig image's `len` bytes at `pattern_offset` (any alignment).
fn pattern(pattern_offset: u64, len: u64) -> Vec<u8> {
    let head = (pattern_offset % 8) as usize;
    let mut e = vec![0u8; len as usize + head];
    fill_image(pattern_offset - head as u64, &mut e);
    e.drain(..head);
    e
}

/// Compares the array's bytes at `array_offset` (every copy when `all`,
/// else the first) with `expected(array_offset - start, len)`; prints what
/// matched or the first difference, naming the member.
fn check_array(
    dir: &str,
    layout: &str,
    start: u64,
    len: u64,
    all: bool,
    expected: &dyn Fn(u64, u64) -> Result<Vec<u8>, String>,
) -> Result<bool, String> {
    let layout = Layout::parse(layout)?;
    let pieces = layout.pieces(start, len);
    let mut legs = std::collections::BTreeSet::new();
    let mut first = Vec::with_capacity(len as usize);
    for p in pieces.iter().filter(|p| all || p.copy == 0) {
        let (img, _) = &layout.members[p.member];
        let path = format!("{dir}/{img}");
        let got = read_at(&path, p.member_offset, p.len).map_err(|e| format!("{path}: {e}"))?;
        let want = expected(p.array_offset - start, p.len)?;
        if let Some(i) = want.iter().zip(&got).position(|(x, y)| x != y) {
            println!(
                "MISMATCH in {img} (slot {}, copy {}) at its offset {}, array offset {}: expected {:02x?}, got {:02x?}",
                p.member,
                p.copy,
                p.member_offset + i as u64,
                p.array_offset + i as u64,
                &want[i..(i + 16).min(want.len())],
                &got[i..(i + 16).min(got.len())]
            );
            return Ok(false);
        }
        if p.copy == 0 {
            first.extend_from_slice(&got);
        }
        legs.insert(img.as_str());
    }
    println!(
        "match: {len} bytes, fnv1a {:016x}, {} in {} ({} cop{} checked)",
        fnv1a(&first),
        match layout.level {
            Level::Raid0 => "striped",
            Level::Raid1 => "mirrored",
            Level::Raid10 { .. } => "striped and mirrored",
        },
        legs.into_iter().collect::<Vec<_>>().join(" "),
        if all { layout.copies() } else { 1 },
        if all && layout.copies() > 1 {
            "ies"
        } else {
            "y"
        },
    );
    Ok(true)
}

fn read_at(path: &str, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf)?;
    Ok(buf)
}

fn run(cli: Cli) -> Result<bool, String> {
    match cli.cmd {
        Cmd::MakeImage {
            path,
            mib,
            pattern_offset,
        } => {
            if pattern_offset % (1 << 20) != 0 {
                return Err(format!(
                    "--pattern-offset {pattern_offset} is not whole MiB"
                ));
            }
            let f = File::create(&path).map_err(|e| format!("{path}: {e}"))?;
            let mut w = BufWriter::new(f);
            let mut buf = vec![0u8; 1 << 20];
            for i in 0..mib {
                fill_image(pattern_offset + (i << 20), &mut buf);
                w.write_all(&buf).map_err(|e| format!("{path}: {e}"))?;
            }
            w.flush().map_err(|e| format!("{path}: {e}"))?;
            Ok(true)
        }
        Cmd::ComparePattern {
            file,
            offset,
            pattern_offset,
            len,
        } => {
            let a = read_at(&file, offset, len).map_err(|e| format!("{file}: {e}"))?;
            let head = (pattern_offset % 8) as usize;
            let mut e = vec![0u8; len as usize + head];
            fill_image(pattern_offset - head as u64, &mut e);
            let e = &e[head..];
            match e.iter().zip(&a).position(|(x, y)| x != y) {
                None => {
                    println!("match: {len} bytes, fnv1a {:016x}", fnv1a(&a));
                    Ok(true)
                }
                Some(i) => {
                    println!(
                        "MISMATCH at byte {i} (file offset {}): expected {:02x?}, got {:02x?}",
                        offset + i as u64,
                        &e[i..(i + 16).min(e.len())],
                        &a[i..(i + 16).min(a.len())]
                    );
                    Ok(false)
                }
            }
        }
        Cmd::ArrayCompare {
            dir,
            layout,
            array_offset,
            actual,
            actual_offset,
            len,
        } => check_array(&dir, &layout, array_offset, len, false, &|at, n| {
            read_at(&actual, actual_offset + at, n).map_err(|e| format!("{actual}: {e}"))
        }),
        Cmd::ArrayPattern {
            dir,
            layout,
            array_offset,
            pattern_offset,
            len,
        } => check_array(&dir, &layout, array_offset, len, true, &|at, n| {
            Ok(pattern(pattern_offset + at, n))
        }),
        Cmd::Compare {
            expected,
            expected_offset,
            actual,
            actual_offset,
            len,
        } => {
            let e =
                read_at(&expected, expected_offset, len).map_err(|e| format!("{expected}: {e}"))?;
            let a = read_at(&actual, actual_offset, len).map_err(|e| format!("{actual}: {e}"))?;
            match e.iter().zip(&a).position(|(x, y)| x != y) {
                None => {
                    println!("match: {len} bytes, fnv1a {:016x}", fnv1a(&a));
                    Ok(true)
                }
                Some(i) => {
                    let bad = e.iter().zip(&a).filter(|(x, y)| x != y).count();
                    println!(
                        "MISMATCH at byte {i} (expected offset {}, actual offset {}): expected {:02x?}, got {:02x?}; {bad} of {len} bytes differ",
                        expected_offset + i as u64,
                        actual_offset + i as u64,
                        &e[i..(i + 16).min(e.len())],
                        &a[i..(i + 16).min(a.len())]
                    );
                    Ok(false)
                }
            }
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("p2pdma-rigdata: {e}");
            ExitCode::from(2)
        }
    }
}

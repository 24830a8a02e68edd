//! Prints where the CUDA emulator library is, for shell scripts and the
//! Python tests: `cuda-emu-path` gives the library (`.../libcuda.so.1`),
//! `cuda-emu-path --dir` its directory, to put first on `LD_LIBRARY_PATH`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let path = match (args.next().as_deref(), args.next()) {
        (None, _) => cuda_emu::library(),
        (Some("--dir"), None) => cuda_emu::library_dir(),
        _ => {
            eprintln!("usage: cuda-emu-path [--dir]");
            return ExitCode::from(2);
        }
    };
    println!("{}", path.display());
    ExitCode::SUCCESS
}

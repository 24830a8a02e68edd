//! The committed `include/p2pdma.h` must be what cbindgen generates from the
//! source now (`build.rs` writes that to `$OUT_DIR/p2pdma.h`), and it must
//! compile as C and as C++.
//!
//! After changing the API, refresh the committed header with
//! `P2PDMA_UPDATE_HEADER=1 cargo test -p p2pdma-capi --test header`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

const GENERATED: &str = include_str!(concat!(env!("OUT_DIR"), "/p2pdma.h"));

fn committed_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include/p2pdma.h")
}

/// A file in the target directory whose name ends in `-NAME`, removed when
/// the returned path is dropped.
fn scratch(name: &str) -> tempfile::TempPath {
    tempfile::Builder::new()
        .prefix("capi-header-")
        .suffix(&format!("-{name}"))
        .tempfile_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
        .into_temp_path()
}

/// A unified diff from `diff -u`, or the first differing line where there is
/// no `diff`.
fn diff(committed: &str, generated: &str) -> String {
    let fresh = scratch("p2pdma.h.generated");
    std::fs::write(&fresh, generated).unwrap();
    if let Ok(out) = Command::new("diff")
        .arg("-u")
        .arg(committed_path())
        .arg(&fresh)
        .output()
    {
        return String::from_utf8_lossy(&out.stdout).into_owned();
    }
    let line = committed
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
    format!(
        "first difference at line {}:\n- {}\n+ {}",
        line + 1,
        committed.lines().nth(line).unwrap_or("<end>"),
        generated.lines().nth(line).unwrap_or("<end>")
    )
}

#[test]
fn committed_header_is_up_to_date() {
    let path = committed_path();
    if std::env::var_os("P2PDMA_UPDATE_HEADER").is_some_and(|v| v == "1") {
        std::fs::write(&path, GENERATED).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == GENERATED,
        "{} is stale: regenerate it with `P2PDMA_UPDATE_HEADER=1 cargo test -p p2pdma-capi --test \
         header`.\n{}",
        path.display(),
        diff(&committed, GENERATED)
    );
}

#[test]
fn header_documents_every_function() {
    // Each prototype starts a line and follows the end of its doc comment.
    let lines: Vec<&str> = GENERATED.lines().collect();
    let mut functions = 0;
    for (i, line) in lines.iter().enumerate() {
        let starts_code = line.starts_with(|c: char| c.is_ascii_alphabetic());
        let is_prototype = starts_code
            && !line.starts_with("typedef")
            && line.contains("p2pdma_")
            && line.contains('(');
        if is_prototype {
            functions += 1;
            assert_eq!(lines[i - 1].trim(), "*/", "{line} has no doc comment");
        }
    }
    // Every source file of the crate, as cbindgen reads them all.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let exported = std::fs::read_dir(&src)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .map(|path| {
            std::fs::read_to_string(&path)
                .unwrap()
                .matches("#[no_mangle]")
                .count()
        })
        .sum::<usize>();
    assert_eq!(
        functions, exported,
        "the header declares {functions} of {exported} functions"
    );
}

/// Compiles a file that includes the header twice (the include guard) and
/// uses its types, with `compiler` and `flags`.
fn compile(compiler: &str, flags: &[&str], ext: &str) {
    let src = scratch(&format!("use.{ext}"));
    std::fs::write(
        &src,
        "#include \"p2pdma.h\"\n#include \"p2pdma.h\"\n\
         int use(struct p2pdma_engine *e, p2pdma_file *f, p2pdma_mem *m) {\n\
         \tstruct p2pdma_report r;\n\
         \tp2pdma_path_stats s;\n\
         \tint path = p2pdma_path_choice(e, f, m, 0, 0);\n\
         \treturn path == P2PDMA_PATH_P2P || path == P2PDMA_ERR_INTERNAL ||\n\
         \t       p2pdma_read(e, f, 0, m, 0, 1, &r) || p2pdma_stats(e, P2PDMA_PATH_BOUNCE, &s);\n\
         }\n",
    )
    .unwrap();
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let out = Command::new(compiler)
        .args(flags)
        .args(["-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I"])
        .arg(&include)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {flags:?} rejects the header:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn header_compiles_as_c() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    compile(&cc, &["-std=c99", "-pedantic"], "c");
    compile(&cc, &["-std=c11", "-pedantic"], "c");
}

#[test]
fn header_compiles_as_cpp() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        eprintln!("no C++ compiler ({cxx}): the header's C++ check is skipped");
        return;
    }
    compile(&cxx, &["-std=c++11", "-pedantic"], "cpp");
}

//! The library's layering, checked from its source: every module imports
//! only from the layers below its own, no module imports from the module
//! that contains it (a folder's `mod.rs` is a face that names and re-exports,
//! it holds nothing its children use), and no files import each other in a
//! circle.
//!
//! `cargo test -p libp2pdma --test layers -- --nocapture` prints the
//! import graph between modules, the layer of each, and what breaks the rules.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

/// The layers from the bottom: a module belongs to the longest prefix that
/// names it, and may import only from layers with a lower or equal number
/// (equal: its own layer, where circles between files are still refused).
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("nvme", 1),
    ("sys", 2),
    ("discovery", 3),
    ("memory", 4),
    ("queues", 5),
    ("transfer", 6),
    ("transfer::plan", 6),
    ("transfer::stats", 7),
    ("transfer::tuning", 7),
    ("transfer::exec", 8),
    ("transfer::storage", 9),
    ("transfer::xfer", 10),
    ("transfer::paths", 11),
    ("transfer::calibrate", 11),
    ("transfer::core", 12),
    ("transfer::strided", 13),
    ("transfer::route", 14),
    ("transfer::asyncio", 14),
    ("transfer::engine", 15),
    ("store", 16),
    ("doctor", 16),
    ("", 17),
];

/// One source file: its module path and the text left once comments,
/// strings and test modules are taken out.
struct Source {
    module: String,
    code: String,
}

fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts.join("::")
}

/// The code without comments, string and char literals, and without the
/// `#[cfg(test)]` items (they may use what they test from any layer).
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            j += 1;
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i += 3;
            out.push_str("' '");
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            i += 2;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    without_test_items(&out)
}

/// The code without each item marked `#[cfg(test)]`: from the attribute to
/// the `;` or the brace that closes the item.
fn without_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0;
        let mut end = item.len();
        for (i, c) in item.char_indices().skip("#[cfg(test)]".len()) {
            match c {
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str) -> Vec<Vec<String>> {
    fn go(prefix: &[String], s: &str, out: &mut Vec<Vec<String>>) {
        let s = s.trim();
        if s.is_empty() {
            return;
        }
        if let Some(open) = s.find('{') {
            let head: Vec<String> = s[..open]
                .split("::")
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect();
            let close = s.rfind('}').unwrap_or(s.len());
            let inner = &s[open + 1..close];
            let mut base = prefix.to_vec();
            base.extend(head);
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&base, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            go(&base, &inner[start..], out);
        } else {
            let s = s.split(" as ").next().unwrap_or(s);
            let mut p = prefix.to_vec();
            p.extend(
                s.split("::")
                    .map(str::trim)
                    .filter(|x| !x.is_empty())
                    .map(String::from),
            );
            out.push(p);
        }
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

fn ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path a file names: its `use` trees and the `crate::`, `super::` and
/// `self::` paths written in its code.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        let after = &rest[at + 4..];
        if before.is_none_or(|c| !ident(c)) {
            if let Some(end) = after.find(';') {
                out.extend(expand(&after[..end]));
            }
        }
        rest = after;
    }
    for root in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(root) {
            let start = from + at;
            from = start + root.len();
            if code[..start]
                .chars()
                .last()
                .is_some_and(|c| ident(c) || c == ':')
            {
                continue;
            }
            let tail: String = code[start..]
                .chars()
                .take_while(|&c| ident(c) || c == ':')
                .collect();
            if tail.ends_with("::") {
                // The head of a `use` tree (`crate::a::{...}`), expanded above.
                continue;
            }
            let p: Vec<String> = tail
                .split("::")
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect();
            if p.len() > 1 {
                out.push(p);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn parent(m: &str) -> String {
    m.rsplit_once("::")
        .map(|(p, _)| p.to_string())
        .unwrap_or_default()
}

fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_string()
    } else {
        format!("{a}::{b}")
    }
}

/// What each module re-exports (`pub use`): the name it is known by there and
/// the path it comes from, and the module that path is written in.
type Reexports = BTreeMap<(String, String), (String, Vec<String>)>;

/// The module a path from `from` lands in, if it is one of the crate's,
/// following re-exports to the module that defines the name.
fn resolve_through(
    from: &str,
    path: &[String],
    modules: &BTreeSet<String>,
    re: &Reexports,
) -> Option<String> {
    let mut from = from.to_string();
    let mut path = path.to_vec();
    for _ in 0..8 {
        let (at, used) = resolve_len(&from, &path, modules)?;
        let Some(name) = path.get(used) else {
            return Some(at);
        };
        match re.get(&(at.clone(), name.clone())) {
            Some((written_in, target)) => {
                let mut next = target.clone();
                next.extend(path[used + 1..].iter().cloned());
                from = written_in.clone();
                path = next;
            }
            None => return Some(at),
        }
    }
    None
}

/// The module a path from `from` lands in, if it is one of the crate's.
#[cfg(test)]
fn resolve(from: &str, path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    resolve_len(from, path, modules).map(|(m, _)| m)
}

/// The module a path lands in and how many of its segments that took.
fn resolve_len(from: &str, path: &[String], modules: &BTreeSet<String>) -> Option<(String, usize)> {
    let mut base = from.to_string();
    let mut used = 0;
    match path.first()?.as_str() {
        "crate" => {
            base.clear();
            used = 1;
        }
        "self" => used = 1,
        "super" => {
            while path.get(used).map(String::as_str) == Some("super") {
                base = parent(&base);
                used += 1;
            }
        }
        first if modules.contains(&join(from, first)) => {}
        _ => return None,
    }
    let mut cur = base;
    while let Some(s) = path.get(used) {
        let next = join(&cur, s);
        if !modules.contains(&next) {
            break;
        }
        cur = next;
        used += 1;
    }
    Some((cur, used))
}

/// Every module's `pub use` and `pub(crate) use` items.
fn reexports(files: &[Source]) -> Reexports {
    let mut re = Reexports::new();
    for f in files {
        for vis in ["pub use ", "pub(crate) use ", "pub(super) use "] {
            let mut rest = f.code.as_str();
            while let Some(at) = rest.find(vis) {
                let after = &rest[at + vis.len()..];
                if let Some(end) = after.find(';') {
                    for (p, alias) in expand_named(&after[..end]) {
                        if p.last().is_some_and(|l| l != "*") {
                            re.insert((f.module.clone(), alias), (f.module.clone(), p));
                        }
                    }
                }
                rest = after;
            }
        }
    }
    re
}

/// Like [`expand`], with the name each path is known by (its alias or its
/// last segment).
fn expand_named(tree: &str) -> Vec<(Vec<String>, String)> {
    let renamed = tree.replace(" as ", " as:");
    expand(&renamed.replace(" as:", "@"))
        .into_iter()
        .map(|mut p| {
            let last = p.pop().unwrap_or_default();
            let (name, alias) = match last.split_once('@') {
                Some((n, a)) => (n.trim().to_string(), a.trim().to_string()),
                None => (last.clone(), last),
            };
            p.push(name);
            (p, alias)
        })
        .collect()
}

fn rank(module: &str) -> (u32, &'static str) {
    LAYERS
        .iter()
        .filter(|(p, _)| p.is_empty() || module == *p || module.starts_with(&format!("{p}::")))
        .max_by_key(|(p, _)| p.len())
        .map(|(p, r)| (*r, *p))
        .unwrap()
}

fn is_ancestor(a: &str, of: &str) -> bool {
    a.is_empty() || of.starts_with(&format!("{a}::"))
}

/// Files that reach each other through imports (Tarjan's strongly connected
/// components, kept where more than one file takes part).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        if let Some(next) = s.edges.get(v) {
            for w in next {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if s.on.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn sources(src: &Path) -> Vec<Source> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs")
                && p.file_name().is_some_and(|n| n != "tests.rs")
            {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    files.sort();
    files
        .iter()
        .map(|f| Source {
            module: module_of(src, f),
            code: strip(&fs::read_to_string(f).unwrap()),
        })
        .collect()
}

/// The edges between the crate's modules (file level), self-edges and
/// edges into a module's own children left out.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = sources(src);
    let modules: BTreeSet<String> = files.iter().map(|s| s.module.clone()).collect();
    let re = reexports(&files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let e = edges.entry(f.module.clone()).or_default();
        for p in paths(&f.code) {
            if let Some(to) = resolve_through(&f.module, &p, &modules, &re) {
                if to != f.module && !is_ancestor(&f.module, &to) {
                    e.insert(to);
                }
            }
        }
    }
    edges
}

#[test]
fn every_module_imports_only_from_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = graph(&src);
    let mut broken = Vec::new();
    println!("module (layer) -> the modules it imports");
    for (from, tos) in &edges {
        let (r, layer) = rank(from);
        let list: Vec<String> = tos.iter().map(|t| format!("{t} ({})", rank(t).0)).collect();
        println!("{from} ({r} {layer}) -> {}", list.join(", "));
        for to in tos {
            if is_ancestor(to, from) {
                broken.push(format!(
                    "{from} imports from {to}, the module that contains it"
                ));
            } else if rank(to).0 > r {
                broken.push(format!(
                    "{from} (layer {r}) imports {to} (layer {})",
                    rank(to).0
                ));
            }
        }
    }
    for c in circles(&edges) {
        broken.push(format!("a circle: {}", c.join(", ")));
    }
    for b in &broken {
        println!("BROKEN {b}");
    }
    assert!(
        broken.is_empty(),
        "{} import(s) break the layering:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_checker_sees_each_kind_of_import() {
    let code = strip(
        "use crate::{a::{B, c::D}, e};\nuse super::f::G;\nfn x() { crate::h::i(); crate::{}; \"crate::no\"; }\n// use crate::no;\n#[cfg(test)]\nmod tests { use crate::no; }",
    );
    let mut got: Vec<String> = paths(&code).iter().map(|p| p.join("::")).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "crate::a::B",
            "crate::a::c::D",
            "crate::e",
            "crate::h::i",
            "super::f::G"
        ]
    );
    let modules: BTreeSet<String> = ["a", "a::c", "e", "h", "p", "p::f"]
        .into_iter()
        .map(String::from)
        .collect();
    let r = |from: &str, p: &str| {
        resolve(
            from,
            &p.split("::").map(String::from).collect::<Vec<_>>(),
            &modules,
        )
    };
    assert_eq!(r("p::q", "super::f::G").as_deref(), Some("p::f"));
    assert_eq!(r("x", "crate::a::c::D").as_deref(), Some("a::c"));
    assert_eq!(r("p", "f::G").as_deref(), Some("p::f"));
    assert_eq!(r("x", "std::fs").as_deref(), None);
    let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    e.entry("a".into()).or_default().insert("b".into());
    e.entry("b".into()).or_default().insert("a".into());
    e.entry("c".into()).or_default().insert("a".into());
    assert_eq!(circles(&e), vec![vec!["a".to_string(), "b".to_string()]]);
    assert_eq!(rank("transfer::paths::bounce").1, "transfer::paths");
    assert_eq!(rank("lib").0, 17);
}

//! Strided shapes on the command line: `base=4096,run=512,dims=8Kx64,1Mx4`.
//!
//! Comma-separated `key=value` items: `run` (bytes per run, required),
//! `base` (the first run's offset, default 0) and `dims` (up to three
//! dimensions `STRIDExCOUNT`, innermost first, separated by commas; items
//! without `=` after `dims=` are its further dimensions). Sizes take the
//! usual suffixes (`4096`, `0x1000`, `8K`, `1M`); counts are decimal.

use p2pdma::transfer::{strided::MAX_DIMS, Layout, Shape, StridedMode};

use crate::util::parse_size;

/// The shape `spec` describes, or why it describes none.
pub fn parse_shape(spec: &str) -> Result<Shape, String> {
    let bad = |why: String| Err(format!("bad --shape {spec:?}: {why}"));
    let (mut base, mut run, mut dims) = (None, None, None::<Vec<(u64, u64)>>);
    let mut in_dims = false;
    for item in spec.split(',').map(str::trim) {
        if item.is_empty() {
            return bad("an empty item (two commas, or a comma at an end)".into());
        }
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None if in_dims => ("dims", item),
            None => return bad(format!("{item:?} is not key=value (keys: base, run, dims)")),
        };
        let size = |v: &str| parse_size(v).map_err(|e| format!("{key}: {e}"));
        match key {
            "base" | "run" => {
                in_dims = false;
                let slot = if key == "base" { &mut base } else { &mut run };
                if slot.is_some() {
                    return bad(format!("{key} is given twice"));
                }
                match size(value) {
                    Ok(v) => *slot = Some(v),
                    Err(e) => return bad(e),
                }
            }
            "dims" => {
                if item.contains('=') {
                    if dims.is_some() {
                        return bad("dims is given twice".into());
                    }
                    dims = Some(Vec::new());
                    in_dims = true;
                }
                let Some((stride, count)) = value.rsplit_once(['x', 'X']) else {
                    return bad(format!(
                        "dimension {value:?} is not STRIDExCOUNT (e.g. 8Kx64)"
                    ));
                };
                let stride = match size(stride.trim()) {
                    Ok(s) => s,
                    Err(e) => return bad(e),
                };
                let Ok(count) = count.trim().parse::<u64>() else {
                    return bad(format!(
                        "dimension {value:?}: the count {count:?} is not a number"
                    ));
                };
                let list = dims.get_or_insert_with(Vec::new);
                if list.len() == MAX_DIMS {
                    return bad(format!("more than {MAX_DIMS} dimensions"));
                }
                list.push((stride, count));
            }
            other => return bad(format!("unknown key {other:?} (keys: base, run, dims)")),
        }
    }
    let Some(run) = run else {
        return bad("run=BYTES is missing".into());
    };
    Shape::new(base.unwrap_or(0), run, &dims.unwrap_or_default())
        .map_err(|e| format!("bad --shape {spec:?}: {e}"))
}

/// The shape as `parse_shape` reads it.
pub fn format_shape(s: &Shape) -> String {
    let mut out = format!("base={},run={}", s.base(), s.run_len());
    for (i, d) in s.dims().iter().enumerate() {
        out.push_str(if i == 0 { ",dims=" } else { "," });
        out.push_str(&format!("{}x{}", d.stride, d.count));
    }
    out
}

/// A `--layout` value.
pub fn parse_layout(s: &str) -> Result<Layout, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "packed" => Ok(Layout::Packed),
        "strided" => Ok(Layout::Strided),
        other => Err(format!("unknown layout {other:?} (packed, strided)")),
    }
}

/// A `--mode` value.
pub fn parse_mode(s: &str) -> Result<StridedMode, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(StridedMode::Auto),
        "rc" => Ok(StridedMode::Rc),
        "sc" => Ok(StridedMode::Sc),
        "tat" => Ok(StridedMode::Tat),
        other => Err(format!("unknown mode {other:?} (auto, rc, sc, tat)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse() {
        let s = parse_shape("base=4096,run=512,dims=8Kx64,1048576x4").unwrap();
        assert_eq!(
            s,
            Shape::new(4096, 512, &[(8192, 64), (1 << 20, 4)]).unwrap()
        );
        assert_eq!(format_shape(&s), "base=4096,run=512,dims=8192x64,1048576x4");
        assert_eq!(parse_shape(&format_shape(&s)).unwrap(), s);
        // Keys in any order, spaces, hex, no dims, three dims.
        let s = parse_shape(" dims = 0x1000x3 , run=100 ").unwrap();
        assert_eq!(s, Shape::new(0, 100, &[(4096, 3)]).unwrap());
        assert_eq!(parse_shape("run=1M").unwrap().runs(), 1);
        let s = parse_shape("run=2,dims=3x2,10x2,100X2,base=7").unwrap();
        assert_eq!(s, Shape::new(7, 2, &[(3, 2), (10, 2), (100, 2)]).unwrap());
    }

    #[test]
    fn bad_shapes_say_why() {
        for (spec, why) in [
            ("", "empty item"),
            ("run=512,", "empty item"),
            ("run=512,,dims=1x1", "empty item"),
            ("base=0", "run=BYTES is missing"),
            ("run=0", "run length is 0"),
            ("run=x", "run:"),
            ("run=4,run=4", "twice"),
            ("run=4,dims=8x2,dims=8x2", "twice"),
            ("run=4,size=9", "unknown key"),
            ("512", "not key=value"),
            ("run=4,base=1,8x2", "not key=value"),
            ("run=4,dims=8", "not STRIDExCOUNT"),
            ("run=4,dims=8xlots", "not a number"),
            ("run=4,dims=8x-1", "not a number"),
            ("run=4,dims=1x1,1x1,1x1,1x1", "more than 3"),
            ("run=8,dims=4x2", "would overlap"),
            ("run=4,dims=8x0", "count of 0"),
            ("run=4,dims=99999999999999999999x2", "run=4"),
            ("base=18446744073709551615,run=4", "overflows"),
            ("run=4,dims=18446744073709551615x3", "overflows"),
        ] {
            match parse_shape(spec) {
                Err(e) => assert!(
                    e.contains(why) && e.starts_with("bad --shape"),
                    "{spec}: {e}"
                ),
                Ok(s) => panic!("{spec}: parsed as {s:?}"),
            }
        }
        assert!(parse_layout("sideways").is_err());
        assert_eq!(parse_layout("Packed"), Ok(Layout::Packed));
        assert!(parse_mode("fast").is_err());
        assert_eq!(parse_mode("TaT"), Ok(StridedMode::Tat));
    }
}

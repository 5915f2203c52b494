//! A gateway that renders a nested JSON tree, redacting secrets. Its
//! replacer (called for every node) also walks the node's whole subtree to
//! decide whether to redact, so a leaf 7 levels deep is checked 8 times:
//! `replacer` dominates `top`, and a request costs about 3–4× what it
//! should. With `--features fixed` the replacer looks at the node alone.

use core::fmt::Write as _;

use edgeprof_guest_sdk::{Request, Response, handler};

/// What marks a key or a string value as a secret (ASCII, any case).
const SECRET_MARKERS: [&str; 5] = ["secret", "token", "password", "bearer", "apikey"];

/// Does `s` contain one of [`SECRET_MARKERS`], ignoring ASCII case?
fn looks_secret(s: &str) -> bool {
    SECRET_MARKERS.iter().any(|m| {
        s.as_bytes()
            .windows(m.len())
            .any(|w| w.eq_ignore_ascii_case(m.as_bytes()))
    })
}

enum Value {
    Num(i64),
    Str(String),
    Obj(Vec<(String, Value)>),
}

fn build(depth: u32, fanout: u32, seed: &mut i64) -> Value {
    if depth == 0 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let n = (*seed >> 16).rem_euclid(100_000);
        return if n % 4 == 0 {
            Value::Num(n)
        } else {
            Value::Str(format!("user-{n:05}-region-{}", n % 7))
        };
    }
    Value::Obj(
        (0..fanout)
            .map(|i| (format!("k{i}"), build(depth - 1, fanout, seed)))
            .collect(),
    )
}

/// Should this node be redacted? The bug: it inspects the whole subtree.
#[inline(never)]
fn replacer(v: &Value) -> bool {
    match v {
        Value::Str(s) => looks_secret(s),
        Value::Num(_) => false,
        Value::Obj(fields) => {
            for (k, c) in fields {
                if looks_secret(k) {
                    return true;
                }
                #[cfg(not(feature = "fixed"))]
                if replacer(c) {
                    return true;
                }
                #[cfg(feature = "fixed")]
                let _ = c;
            }
            false
        }
    }
}

#[inline(never)]
fn serialize(v: &Value, out: &mut String) {
    if replacer(v) {
        out.push_str("\"[redacted]\"");
        return;
    }
    match v {
        Value::Num(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Str(s) => {
            out.push('"');
            out.push_str(s);
            out.push('"');
        }
        Value::Obj(fields) => {
            out.push('{');
            for (i, (k, c)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push('"');
                out.push_str(k);
                out.push_str("\":");
                serialize(c, out);
            }
            out.push('}');
        }
    }
}

thread_local! {
    /// The upstream document, fetched (here: generated) once per isolate.
    static TREE: Value = build(7, 4, &mut 7);
}

fn handle(req: Request) -> Response {
    let mut out = String::with_capacity(512 << 10);
    TREE.with(|tree| serialize(tree, &mut out));
    out.push_str(&req.path);
    Response::new(200, out)
}

handler!(handle);

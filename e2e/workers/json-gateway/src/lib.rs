//! A gateway that renders a nested JSON tree. Its replacer (called for every
//! node) also walks the node's whole subtree to decide whether to redact, so
//! a node 5 levels deep is processed 5 times: `replacer` dominates `top`.
//! With `--features fixed` the replacer looks at the node alone.

use edgeprof_guest_sdk::{Request, Response, handler};

enum Value {
    Num(i64),
    Str(String),
    Obj(Vec<(String, Value)>),
}

fn build(depth: u32, fanout: u32, seed: &mut i64) -> Value {
    if depth == 0 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        return if *seed % 3 == 0 {
            Value::Str(format!("v{}", *seed % 1000))
        } else {
            Value::Num(*seed % 10_000)
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
        Value::Str(s) => s.starts_with("secret"),
        Value::Num(_) => false,
        Value::Obj(fields) => {
            for (k, c) in fields {
                if k == "password" {
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
        Value::Num(n) => out.push_str(&n.to_string()),
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
    static TREE: Value = build(6, 6, &mut 7);
}

fn handle(req: Request) -> Response {
    let mut out = String::with_capacity(1 << 20);
    TREE.with(|tree| serialize(tree, &mut out));
    out.push_str(&req.path);
    Response::new(200, out)
}

handler!(handle);

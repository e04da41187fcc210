//! The Trace environment's `__DBG_` print injection.
//!
//! The transform itself is Python (`inject.py`): the environment defines it
//! in terms of Python's own `ast` and `random.Random(seed)`, and only those
//! reproduce its programs byte for byte. It parses untrusted source, so it
//! runs inside the sandbox like any other program, once a program for all
//! of its variants.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::reward::python_strip;
use crate::sandbox::{Executor, Limits, Outcome, Request, Status};

/// The injection script, run as a sandboxed program.
pub const INJECT_PY: &str = include_str!("inject.py");

/// Difficulty features of a program, computed from its AST.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    pub lines: u32,
    pub loop_depth: u32,
    pub functions: u32,
    pub recursive_functions: u32,
    pub classes: u32,
    pub branches: u32,
    pub try_blocks: u32,
    pub comprehensions: u32,
}

/// One transformed program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variant {
    pub seed: u64,
    pub code: String,
    /// Prints injected (0..=max_injections).
    pub injections: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transformed {
    /// The source as `ast.unparse` re-emits it (comments gone).
    pub normalized: String,
    pub features: Features,
    pub variants: Vec<Variant>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum TransformError {
    /// The program is not valid Python; it is counted, not transformed.
    #[error("does not parse: {0}")]
    DoesNotParse(String),
    /// The sandboxed transform did not finish (a sandbox problem, or a
    /// pathological program that exhausted its limits).
    #[error("transform failed ({status}): {detail}")]
    Failed {
        status: &'static str,
        detail: String,
    },
}

#[derive(Deserialize)]
struct Reply {
    ok: bool,
    error: Option<String>,
    normalized: Option<String>,
    features: Option<Features>,
    #[serde(default)]
    variants: Vec<Variant>,
}

/// The environment's fence stripping, with Python's `strip()`: what
/// `inject.py` does to a source before it parses it.
pub fn strip_fence(source: &str) -> &str {
    let mut text = python_strip(source);
    if text.starts_with("```") {
        if let Some(nl) = text.find('\n') {
            text = python_strip(&text[nl..]);
        }
        if let Some(t) = text.strip_suffix("```") {
            text = python_strip(t);
        }
    }
    text
}

/// The sandbox request that transforms `source` once per seed.
pub fn request(source: &str, seeds: &[u64], max_injections: usize, limits: Limits) -> Request {
    let stdin = serde_json::json!({
        "source": source,
        "seeds": seeds,
        "max_injections": max_injections,
    });
    Request {
        program: INJECT_PY.as_bytes().to_vec(),
        stdin: stdin.to_string().into_bytes(),
        limits,
    }
}

/// Reads the transform's reply out of its run.
pub fn parse_outcome(out: &Outcome) -> Result<Transformed, TransformError> {
    if out.status != Status::Ok {
        return Err(TransformError::Failed {
            status: out.status.as_str(),
            detail: out
                .detail
                .clone()
                .unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        });
    }
    let reply: Reply = serde_json::from_slice(&out.stdout).map_err(|e| TransformError::Failed {
        status: "bad_reply",
        detail: e.to_string(),
    })?;
    if !reply.ok {
        return Err(TransformError::DoesNotParse(
            reply.error.unwrap_or_default(),
        ));
    }
    match (reply.normalized, reply.features) {
        (Some(normalized), Some(features)) => Ok(Transformed {
            normalized,
            features,
            variants: reply.variants,
        }),
        _ => Err(TransformError::Failed {
            status: "bad_reply",
            detail: "reply without program".into(),
        }),
    }
}

/// Transforms `source` once per seed on `exec`.
pub fn transform(
    exec: &Executor,
    source: &str,
    seeds: &[u64],
    max_injections: usize,
) -> Result<Transformed, TransformError> {
    let limits = Limits {
        wall_ms: 20_000,
        ..Limits::default()
    };
    parse_outcome(&exec.run(&request(source, seeds, max_injections, limits)))
}

static INJECTED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^\s*print\('__DBG_(\d+)__'(?:, repr\(([A-Za-z_][A-Za-z0-9_]*)\) if isinstance\(([A-Za-z_][A-Za-z0-9_]*), \(int, float, str, bool, type\(None\)\)\) else type\(([A-Za-z_][A-Za-z0-9_]*)\)\.__name__)+\)$",
    )
    .unwrap()
});

static ONE_ARG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"repr\(([A-Za-z_][A-Za-z0-9_]*)\) if isinstance\(([A-Za-z_][A-Za-z0-9_]*), \(int, float, str, bool, type\(None\)\)\) else type\(([A-Za-z_][A-Za-z0-9_]*)\)\.__name__",
    )
    .unwrap()
});

/// Whether a source line is one of the injected prints, in exactly the
/// allowed shape: the tag, then 1 to 3 names each shown as
/// `repr(v) if isinstance(v, (int, float, str, bool, type(None))) else type(v).__name__`.
pub fn is_injected_print(line: &str) -> bool {
    let Some(c) = INJECTED.captures(line) else {
        return false;
    };
    let tag: u32 = c[1].parse().unwrap_or(u32::MAX);
    let args: Vec<_> = ONE_ARG.captures_iter(line).collect();
    tag < 100 && (1..=3).contains(&args.len()) && args.iter().all(|a| a[1] == a[2] && a[2] == a[3])
}

/// Lines that mention the tag prefix at all (to catch malformed injections).
pub fn mentions_tag(line: &str) -> bool {
    line.contains("'__DBG_")
}

/// The program with every injected print line removed.
pub fn strip_injected(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    for line in code.lines() {
        if !is_injected_print(line) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_allowed_print_shape() {
        let one = "    print('__DBG_0__', repr(x) if isinstance(x, (int, float, str, bool, type(None))) else type(x).__name__)";
        assert!(is_injected_print(one));
        let three = "print('__DBG_5__', repr(a) if isinstance(a, (int, float, str, bool, type(None))) else type(a).__name__, repr(b) if isinstance(b, (int, float, str, bool, type(None))) else type(b).__name__, repr(c) if isinstance(c, (int, float, str, bool, type(None))) else type(c).__name__)";
        assert!(is_injected_print(three));
        // Mismatched names, bare values and other prints are not injections.
        assert!(!is_injected_print(
            &one.replace("isinstance(x", "isinstance(y")
        ));
        assert!(!is_injected_print("print('__DBG_0__', x)"));
        assert!(!is_injected_print("print(x)"));
        assert_eq!(
            strip_injected(&format!("a = 1\n{one}\nprint(a)\n")),
            "a = 1\nprint(a)\n"
        );
    }
}

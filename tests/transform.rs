//! The print injection, checked over the whole built-in corpus, plus golden
//! files that show any change to the transform.

mod common;

use trace_train::dataset::builtin;
use trace_train::sandbox::{Request, Status};
use trace_train::transform::{self, is_injected_print, mentions_tag, strip_injected};

const SEEDS: [u64; 3] = [0, 1, 123_457];

#[test]
fn transformed_programs_keep_their_meaning() {
    let exec = common::exec();
    let corpus = builtin::programs();
    let mut checked = 0;
    let mut all_code = Vec::new();
    let mut stripped_runs = Vec::new();
    for row in &corpus {
        let t = transform::transform(exec, &row.program, &SEEDS, 6)
            .unwrap_or_else(|e| panic!("{}: {e}", row.name));
        assert_eq!(t.variants.len(), SEEDS.len());
        for v in &t.variants {
            // Only allowed print shapes, tagged 0.. in order, one line each.
            let tagged: Vec<&str> = v.code.lines().filter(|l| mentions_tag(l)).collect();
            for line in &tagged {
                assert!(
                    is_injected_print(line),
                    "{} seed {}: bad print {line}",
                    row.name,
                    v.seed
                );
            }
            assert_eq!(
                tagged.len() as u32,
                v.injections,
                "{} seed {}",
                row.name,
                v.seed
            );
            assert!(v.injections <= 6);
            for (n, line) in tagged.iter().enumerate() {
                assert!(
                    line.contains(&format!("'__DBG_{n}__'")),
                    "{} seed {}: tag order",
                    row.name,
                    v.seed
                );
            }
            // Removing the injected lines gives back the normalized program
            // (as a syntax tree: a print after an `elif` turns it into
            // `else: if`, the same tree in other words); checked below.
            let stripped = strip_injected(&v.code);
            all_code.push(serde_json::json!([
                v.code,
                stripped,
                t.normalized,
                format!("{} seed {}", row.name, v.seed)
            ]));
            stripped_runs.push((row, Request::new(stripped, row.inputs.as_bytes())));
            checked += 1;
        }
    }
    assert!(checked >= 450, "{checked}");

    // ... which prints exactly the original output.
    let reqs: Vec<Request> = stripped_runs.iter().map(|(_, r)| r.clone()).collect();
    let outs = exec.run_all(&reqs);
    for ((row, _), out) in stripped_runs.iter().zip(&outs) {
        assert_eq!(out.status, Status::Ok, "{}", row.name);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            row.output.clone().unwrap(),
            "{}: stripped program's output differs",
            row.name
        );
    }

    // Every transformed program parses, and without its prints is the
    // original program's syntax tree (checked by Python itself).
    let check = "import ast, json, sys\nfor code, stripped, normalized, name in json.load(sys.stdin):\n    ast.parse(code)\n    if ast.dump(ast.parse(stripped)) != ast.dump(ast.parse(normalized)):\n        print('differs:', name)\nprint('checked')\n";
    let out = exec.run(&Request::new(check, serde_json::to_vec(&all_code).unwrap()));
    assert_eq!(
        out.status,
        Status::Ok,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "checked\n");
}

#[test]
fn seeds_reproduce_and_differ() {
    let exec = common::exec();
    let corpus = builtin::programs();
    let mut differing = 0;
    for row in corpus.iter().take(40) {
        let a = transform::transform(exec, &row.program, &[7, 8], 6).unwrap();
        let b = transform::transform(exec, &row.program, &[7, 8], 6).unwrap();
        assert_eq!(a, b, "{}: same seeds, different programs", row.name);
        if a.variants[0].code != a.variants[1].code {
            differing += 1;
        }
    }
    assert!(
        differing >= 30,
        "only {differing} of 40 programs vary with the seed"
    );
}

#[test]
fn unparsable_source_is_reported_not_transformed() {
    let e = transform::transform(common::exec(), "def f(:\n  pass", &[1], 6).unwrap_err();
    assert!(
        matches!(e, transform::TransformError::DoesNotParse(_)),
        "{e}"
    );
}

/// Golden transformed programs: `tests/golden/<program>__seed<S>.py`. Each
/// was read against the injection rules when committed (see the README
/// there). Set UPDATE_GOLDEN=1 to rewrite them after a deliberate change.
#[test]
fn golden_transforms() {
    let dir = common::repo().join("tests/golden");
    let corpus = builtin::programs();
    let mut n = 0;
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "py"))
    {
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let (name, seed) = stem.rsplit_once("__seed").expect("name__seedN.py");
        let seed: u64 = seed.parse().unwrap();
        let row = corpus
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no program {name}"));
        let t = transform::transform(common::exec(), &row.program, &[seed], 6).unwrap();
        let got = format!("{}\n", t.variants[0].code);
        if update {
            std::fs::write(path, &got).unwrap();
        }
        assert_eq!(
            got,
            std::fs::read_to_string(path).unwrap(),
            "{stem} changed"
        );
        n += 1;
    }
    assert!(n >= 5, "only {n} golden files");
}

//! `sandbox check` with and without root. As root it reports full
//! isolation. As uid 65534 (nobody) it names the rootless mode, lists every
//! protection that holds and says that a host uid per slot needs root.
//! Where the kernel refuses user namespaces, it refuses, naming why.
//!
//! The hostile programs themselves run rootless in `sandbox_hostile.rs`.

use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

const NOBODY: u32 = 65534;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `trace-train sandbox check`, run in the project tree as `uid` (the
/// current user when `None`).
fn sandbox_check(uid: Option<u32>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trace-train"));
    c.args(["sandbox", "check"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin");
    if let Some(uid) = uid {
        c.uid(uid).gid(uid).env("HOME", "/nonexistent");
    }
    c.output().expect("run trace-train sandbox check")
}

/// Whether `uid` may have a user namespace here; `Err` says why not.
fn user_namespaces_for(uid: u32) -> Result<(), String> {
    let mut c = Command::new("unshare");
    c.args([
        "--user",
        "--map-root-user",
        "--mount",
        "--pid",
        "--net",
        "--fork",
        "true",
    ]);
    if is_root() {
        c.uid(uid).gid(uid);
    }
    match c.output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(text(&o.stderr).trim().to_owned()),
        // No unshare(1) to ask: let the sandbox itself answer.
        Err(_) => Ok(()),
    }
}

/// Asserts the report of a `sandbox check` that ran in `mode`.
#[track_caller]
fn assert_report(out: &Output, mode: &str, host_uid: u32) {
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "sandbox check failed\nstdout:\n{}\nstderr:\n{stderr}",
        text(&out.stdout)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(report["mode"], mode, "{report}");
    assert!(
        stderr.contains(&format!("mode: {mode}")),
        "the mode is not named: {stderr}"
    );
    let protections = report["protections"].as_array().expect("protections");
    assert_eq!(protections.len(), 15, "{report}");
    for p in protections {
        let name = p["name"].as_str().unwrap();
        let held = p["in_force"].as_bool().unwrap();
        if mode == "rootless" && name == "own host uid per slot" {
            assert!(!held, "claimed rootless: {p}");
            assert_eq!(p["needs_root"], true, "{p}");
            let evidence = p["evidence"].as_str().unwrap();
            assert!(evidence.contains(&format!("host uid {host_uid}")), "{p}");
            assert!(
                stderr.contains("own host uid per slot  no (needs root)"),
                "{stderr}"
            );
        } else {
            assert!(held, "{name} does not hold in {mode} mode: {p}");
        }
    }
    let by_name = |n: &str| {
        protections
            .iter()
            .find(|p| p["name"] == n)
            .unwrap_or_else(|| panic!("no {n} in {report}"))
    };
    // The program holds no capability at all, in either mode.
    let caps = by_name("no capabilities")["evidence"].as_str().unwrap();
    assert!(caps.contains("CapEff 0000000000000000"), "{caps}");
    if mode == "rootless" {
        // Nothing can come back through an exec either.
        assert!(caps.contains("CapBnd 0000000000000000"), "{caps}");
    }
}

#[test]
fn sandbox_check_names_its_mode_and_what_holds() {
    // SAFETY: geteuid(2) cannot fail.
    let me = unsafe { libc::geteuid() };
    if is_root() {
        assert_report(&sandbox_check(None), "root", 0);
    }
    let uid = if is_root() { NOBODY } else { me };
    if let Err(why) = user_namespaces_for(uid) {
        println!("SKIPPED rootless: the kernel refuses uid {uid} a user namespace here: {why}");
        return;
    }
    let out = sandbox_check(is_root().then_some(NOBODY));
    assert_report(&out, "rootless", uid);
    eprintln!("{}", text(&out.stderr));
}

/// A user namespace where no user namespace may be made
/// (`user.max_user_namespaces` is 0 in it), entered as uid 1000: the
/// sandbox refuses to start and says why, with the hint. Needs root to
/// map uid 1000 next to root.
#[test]
fn sandbox_refuses_clearly_where_user_namespaces_are_refused() {
    if !is_root() {
        println!(
            "SKIPPED: making a machine that refuses user namespaces takes root (this test maps uid 1000 and sets user.max_user_namespaces to 0 inside a namespace)"
        );
        return;
    }
    if let Err(why) = user_namespaces_for(NOBODY) {
        println!("SKIPPED: the kernel refuses user namespaces here already: {why}");
        return;
    }
    // The helper forks one process that stays outside to write the maps
    // (root may map several ids), then drops to uid 1000 inside and runs
    // the command.
    let helper = r#"import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(r, 1)
    for f in ('uid_map', 'gid_map'):
        with open('/proc/%d/%s' % (os.getppid(), f), 'w') as m:
            m.write('0 0 1\n1000 1000 1\n')
    os._exit(0)
if libc.unshare(0x10000000) != 0:
    sys.exit('unshare: %s' % os.strerror(ctypes.get_errno()))
os.write(w, b'x')
_, st = os.waitpid(pid, 0)
assert st == 0, st
with open('/proc/sys/user/max_user_namespaces', 'w') as f:
    f.write('0')
os.setgroups([])
os.setresgid(1000, 1000, 1000)
os.setresuid(1000, 1000, 1000)
os.execv(sys.argv[1], sys.argv[1:])
"#;
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            helper,
            env!("CARGO_BIN_EXE_trace-train"),
            "sandbox",
            "check",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .expect("run the helper");
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "sandbox check started: {stderr}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    for part in [
        "the sandbox cannot isolate programs",
        "not running as root (uid 1000)",
        "the kernel refused to create a user namespace",
        "user.max_user_namespaces is 0",
        "hint: run as root",
        "kernel.unprivileged_userns_clone=1",
        "--unsafe_no_sandbox",
    ] {
        assert!(stderr.contains(part), "`{part}` missing from: {stderr}");
    }
}

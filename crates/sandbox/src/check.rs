//! `sandbox check`: which protections are actually in force here.
//!
//! Nothing is assumed from configuration: a probe program runs inside the
//! sandbox and reports what it can see and do, and each protection is judged
//! from that evidence.

use serde::Serialize;

use crate::executor::Executor;
use crate::request::{Isolation, Request, Status};

/// One protection and whether the probe found it in force.
#[derive(Debug, Clone, Serialize)]
pub struct Protection {
    pub name: &'static str,
    pub in_force: bool,
    /// Only root can give it: a rootless sandbox does without it.
    pub needs_root: bool,
    pub evidence: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProtectionReport {
    /// `root` (full isolation), `rootless` (user namespaces) or `unsafe`.
    pub mode: &'static str,
    pub python: String,
    pub workers: usize,
    pub protections: Vec<Protection>,
}

impl ProtectionReport {
    pub fn all_in_force(&self) -> bool {
        self.protections.iter().all(|p| p.in_force)
    }

    /// The protections this mode gives that are not in force: every one
    /// missing as root, those that do not need root when rootless.
    pub fn missing(&self) -> Vec<&Protection> {
        self.protections
            .iter()
            .filter(|p| {
                let excused = self.mode == "rootless" && p.needs_root;
                !(p.in_force || excused)
            })
            .collect()
    }
}

/// The mode an executor isolates programs in, as `sandbox check` names it.
pub fn mode_of(exec: &Executor) -> &'static str {
    match exec.isolation() {
        Isolation::Sandbox { .. } => "root",
        Isolation::Rootless { .. } => "rootless",
        Isolation::Unsafe => "unsafe",
    }
}

const PROBE: &str = r#"
import json, os, socket, resource
r = {}
def status_field(name):
    for line in open('/proc/self/status'):
        if line.startswith(name + ':'):
            return line.split(':', 1)[1].strip()
r['uid'] = os.getuid(); r['euid'] = os.geteuid(); r['groups'] = os.getgroups()
r['pid'] = os.getpid()
r['procs_visible'] = len([p for p in os.listdir('/proc') if p.isdigit()])
r['no_new_privs'] = status_field('NoNewPrivs')
r['seccomp'] = status_field('Seccomp')
r['caps'] = {k: status_field(k) for k in ['CapEff', 'CapPrm', 'CapInh', 'CapAmb', 'CapBnd']}
r['uid_map'] = ' '.join(open('/proc/self/uid_map').read().split())
r['hostname'] = os.uname().nodename
try:
    s = socket.create_connection(('10.0.0.1', 53), timeout=1); s.close(); r['net'] = 'connected'
except OSError as e:
    r['net'] = type(e).__name__ + ': ' + str(e)
try:
    open('/usr/trace_train_probe', 'w'); r['system_ro'] = 'writable'
except OSError as e:
    r['system_ro'] = e.strerror
try:
    os.listdir('/root'); r['root_hidden'] = str(len(os.listdir('/root'))) + ' entries'
except OSError as e:
    r['root_hidden'] = e.strerror
r['host_hidden'] = {d: (len(os.listdir(d)) if os.path.isdir(d) else None) for d in HIDDEN}
try:
    socket.socket(socket.AF_UNIX).close(); r['unix_socket'] = 'made'
except OSError as e:
    r['unix_socket'] = type(e).__name__
open('probe.txt', 'w').write('x'); r['cwd'] = os.getcwd()
r['tmp'] = [m.split()[2] + ' ' + m.split()[3].split(',')[0] for m in open('/proc/self/mounts') if m.split()[1] == '/tmp']
r['rlimits'] = {n: resource.getrlimit(getattr(resource, 'RLIMIT_' + n))[0] for n in ['CPU', 'AS', 'FSIZE', 'NOFILE', 'NPROC', 'CORE']}
r['env'] = sorted(os.environ)
print(json.dumps(r))
"#;

/// Each slot runs as a host uid of its own (as root); rootless, every slot
/// is the caller's uid.
const OWN_HOST_UID: &str = "own host uid per slot";

/// Runs the probe on `exec` and judges each protection.
pub fn check_protections(exec: &Executor) -> ProtectionReport {
    let hidden: Vec<String> = exec
        .hidden()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let probe = format!(
        "HIDDEN = {}\n{PROBE}",
        serde_json::to_string(&hidden).unwrap_or_else(|_| "[]".into())
    );
    let req = Request::new(probe.as_str(), "");
    let out = exec.run(&req);
    let mode = mode_of(exec);
    let mut protections = Vec::new();
    let mut add = |name: &'static str, in_force: bool, evidence: String| {
        protections.push(Protection {
            name,
            in_force,
            needs_root: name == OWN_HOST_UID,
            evidence,
        })
    };
    if out.status != Status::Ok {
        add(
            "probe ran",
            false,
            format!(
                "{}: {} {}",
                out.status.as_str(),
                out.detail.unwrap_or_default(),
                String::from_utf8_lossy(&out.stderr)
            ),
        );
        return ProtectionReport {
            mode,
            python: exec.python_version().to_owned(),
            workers: exec.workers(),
            protections,
        };
    }
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let s = |k: &str| r[k].to_string();
    let uid = r["uid"].as_u64().unwrap_or(0);
    add(
        "unprivileged uid",
        uid != 0 && r["euid"].as_u64() == Some(uid),
        format!("uid {} euid {} groups {}", uid, s("euid"), s("groups")),
    );
    // In the host's user namespace the map is the identity over every id:
    // the program's uid is a host uid, given to this slot alone.
    let uid_map = r["uid_map"].as_str().unwrap_or("");
    let host_ns = uid_map == "0 0 4294967295";
    add(
        OWN_HOST_UID,
        host_ns && uid != 0,
        if host_ns {
            format!("host uid {uid}, this slot's alone")
        } else {
            let host = uid_map.split(' ').nth(1).unwrap_or("?");
            format!(
                "uid {uid} in a user namespace is host uid {host}, as is every slot (uid_map `{uid_map}`; needs root)"
            )
        },
    );
    let caps = &r["caps"];
    let cap = |k: &str| caps[k].as_str().unwrap_or("?").to_owned();
    let zero = |k: &str| u64::from_str_radix(&cap(k), 16) == Ok(0);
    add(
        "no capabilities",
        ["CapEff", "CapPrm", "CapInh", "CapAmb"]
            .iter()
            .all(|k| zero(k)),
        format!(
            "CapEff {} CapPrm {} CapInh {} CapAmb {} CapBnd {}",
            cap("CapEff"),
            cap("CapPrm"),
            cap("CapInh"),
            cap("CapAmb"),
            cap("CapBnd")
        ),
    );
    add(
        "pid namespace",
        r["procs_visible"].as_u64().unwrap_or(99) <= 2,
        format!(
            "program is pid {} and sees {} processes: itself and its init",
            s("pid"),
            s("procs_visible")
        ),
    );
    add(
        "network namespace",
        r["net"].as_str().is_some_and(|n| n != "connected"),
        r["net"].as_str().unwrap_or("").to_owned(),
    );
    add(
        "uts namespace",
        r["hostname"].as_str() == Some("sandbox"),
        format!("hostname {}", s("hostname")),
    );
    add(
        "read-only system",
        r["system_ro"].as_str() != Some("writable"),
        format!("writing /usr: {}", s("system_ro")),
    );
    add(
        "home folders hidden",
        r["root_hidden"]
            .as_str()
            .is_some_and(|v| v.starts_with("0 ") || v.contains("denied")),
        format!("/root: {}", s("root_hidden")),
    );
    add(
        "host folders hidden",
        r["host_hidden"]
            .as_object()
            .is_some_and(|m| m.values().all(|v| v.as_u64() == Some(0) || v.is_null())),
        format!("entries seen in {}", s("host_hidden")),
    );
    add(
        "unix sockets refused",
        r["unix_socket"].as_str() == Some("PermissionError"),
        format!("socket(AF_UNIX): {}", s("unix_socket")),
    );
    add(
        "private /tmp",
        r["tmp"].as_array().is_some_and(|m| {
            m.iter()
                .any(|x| x.as_str().is_some_and(|x| x.starts_with("tmpfs rw")))
        }),
        format!("/tmp mounts {}", s("tmp")),
    );
    add(
        "no_new_privs",
        r["no_new_privs"].as_str() == Some("1"),
        format!("NoNewPrivs {}", s("no_new_privs")),
    );
    add(
        "seccomp filter",
        r["seccomp"].as_str() == Some("2"),
        format!("Seccomp mode {}", s("seccomp")),
    );
    let lim = &r["rlimits"];
    let finite = |k: &str| lim[k].as_i64().is_some_and(|v| v >= 0);
    add(
        "rlimits",
        ["CPU", "AS", "FSIZE", "NOFILE", "NPROC"]
            .iter()
            .all(|k| finite(k))
            && lim["CORE"].as_i64() == Some(0),
        lim.to_string(),
    );
    let env_ok = r["env"].as_array().is_some_and(|e| {
        e.iter()
            .all(|k| matches!(k.as_str(), Some("PATH" | "PYTHONHASHSEED" | "LC_CTYPE")))
    });
    add("cleared environment", env_ok, s("env"));
    ProtectionReport {
        mode,
        python: exec.python_version().to_owned(),
        workers: exec.workers(),
        protections,
    }
}

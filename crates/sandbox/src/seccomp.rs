//! The seccomp filters a sandboxed program runs under.
//!
//! Compiled here with `seccompiler` and handed to the zygote as raw BPF, which
//! installs them in the program's process after it dropped to its slot uid.
//! The policy is a deny list on top of the unprivileged uid and namespaces:
//! what an unprivileged process could still do that a program never needs
//! (new user namespaces, ptrace, kernel keyrings, BPF, perf, userfaultfd,
//! Unix-domain sockets: a socket a host service left in a visible folder
//! must not be reachable).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::request::SandboxError;

/// Namespace flags that `clone`/`unshare` may not carry.
const NS_FLAGS: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// Syscalls refused outright with EPERM.
const DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_kexec_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_syslog,
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_open_by_handle_at,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
];

/// The filters, in install order, as raw `sock_filter` bytes.
pub fn filters() -> Result<Vec<Vec<u8>>, SandboxError> {
    let arch: TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| SandboxError::Setup(format!("seccomp: unsupported architecture: {e}")))?;

    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    // clone(flags, ...): refuse any namespace flag; plain fork/thread clones pass.
    let clone_rules = NS_FLAGS
        .iter()
        .map(|&flag| {
            let cond = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )?;
            SeccompRule::new(vec![cond])
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SandboxError::Setup(format!("seccomp rule: {e}")))?;
    rules.insert(libc::SYS_clone, clone_rules);
    // socket(AF_UNIX, ...): no way to a host service's socket, wherever it
    // lies (socketpair, which makes a connected pair, stays allowed).
    let unix = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        libc::AF_UNIX as u64,
    )
    .and_then(|c| SeccompRule::new(vec![c]))
    .map_err(|e| SandboxError::Setup(format!("seccomp rule: {e}")))?;
    rules.insert(libc::SYS_socket, vec![unix]);
    let deny = build(rules, libc::EPERM, arch)?;

    // clone3 passes its flags in memory a filter cannot read: answer ENOSYS so
    // glibc falls back to clone(2), which the filter above can inspect.
    let mut rules3 = BTreeMap::new();
    rules3.insert(libc::SYS_clone3, Vec::new());
    let clone3 = build(rules3, libc::ENOSYS, arch)?;
    Ok(vec![deny, clone3])
}

fn build(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    errno: i32,
    arch: TargetArch,
) -> Result<Vec<u8>, SandboxError> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| SandboxError::Setup(format!("seccomp filter: {e}")))?;
    let prog: BpfProgram = filter
        .try_into()
        .map_err(|e| SandboxError::Setup(format!("seccomp compile: {e}")))?;
    let mut bytes = Vec::with_capacity(prog.len() * 8);
    for ins in &prog {
        bytes.extend_from_slice(&ins.code.to_ne_bytes());
        bytes.push(ins.jt);
        bytes.push(ins.jf);
        bytes.extend_from_slice(&ins.k.to_ne_bytes());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn filters_compile_to_whole_instructions() {
        let f = super::filters().unwrap();
        assert_eq!(f.len(), 2);
        for prog in f {
            assert!(!prog.is_empty());
            assert_eq!(prog.len() % 8, 0);
        }
    }
}

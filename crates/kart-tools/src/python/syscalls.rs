//! The syscall filter of the bubblewrap sandbox, a deny-list in the manner of Docker's and
//! Flatpak's default profiles: what an unprivileged process may still reach of the kernel's
//! attack surface (io_uring, BPF, perf events, user faults, keyrings, tracing) and every
//! namespace, mount and module operation, refused with `EPERM`; `clone3`, whose flags a filter
//! cannot read, refused with `ENOSYS` so the C library falls back to `clone`, whose namespace
//! flags are refused. Bubblewrap loads the programs (`--add-seccomp-fd`) after building the
//! sandbox, for the code and everything it starts.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};
use std::collections::BTreeMap;

/// System calls refused outright.
const DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
    libc::SYS_unshare,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_fanotify_init,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_syslog,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_vhangup,
];

/// `clone` flags that make namespaces.
const NAMESPACE_FLAGS: [libc::c_int; 7] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
];

/// The filters as bubblewrap reads them: raw `struct sock_filter` arrays, one per
/// `--add-seccomp-fd`.
pub(super) fn programs() -> Result<Vec<Vec<u8>>, seccompiler::Error> {
    let arch = std::env::consts::ARCH.try_into()?;
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    let flag_rules = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u64;
            SeccompRule::new(vec![SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )?])
        })
        .collect::<Result<_, _>>()?;
    denied.insert(libc::SYS_clone, flag_rules);
    let eperm =
        SeccompFilter::new(denied, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)?;
    let no_clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    [eperm, no_clone3].into_iter().map(|filter| Ok(bytes(&BpfProgram::try_from(filter)?))).collect()
}

fn bytes(program: &BpfProgram) -> Vec<u8> {
    let mut out = Vec::with_capacity(program.len() * 8);
    for instruction in program {
        out.extend_from_slice(&instruction.code.to_ne_bytes());
        out.push(instruction.jt);
        out.push(instruction.jf);
        out.extend_from_slice(&instruction.k.to_ne_bytes());
    }
    out
}

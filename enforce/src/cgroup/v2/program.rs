//! Code generation of the `BPF_PROG_TYPE_CGROUP_DEVICE` program that enforces an allow list on
//! cgroups v2. Pure and safe: the instructions are encoded here by hand and the tests run them in
//! the rbpf userspace interpreter.
//!
//! Facts relied on (include/uapi/linux/bpf.h, kernel/bpf/cgroup.c, Documentation/bpf/):
//! - The program's context is `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }`
//!   with `access_type = (BPF_DEVCG_ACC_* << 16) | BPF_DEVCG_DEV_*`, where the device types are
//!   `BPF_DEVCG_DEV_BLOCK` = 1 and `BPF_DEVCG_DEV_CHAR` = 2, and the access bits are those of
//!   [`Access`]. Returning 0 denies the access (the syscall fails with EPERM), 1 allows it.
//! - Instructions are `struct bpf_insn { u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm; }`
//!   in host byte order; a jump goes to `pc + 1 + off`.
//! - The verifier rejects a program with an unreachable instruction, so nothing is emitted after
//!   a rule that matches every request.
//!
//! The layout is the one runc, youki and Mesos (`cgroups2::devices::DeviceProgram`) use: load
//! the context once, then one block per rule that jumps to the next block on any mismatch and
//! returns "allow" when it falls through; after the last block, return "deny". Comparisons are
//! 32-bit (`BPF_JMP32`, Linux 5.1) so that numbers above `i32::MAX` compare correctly.

use mesos_gpu_node::rules::{Access, DeviceKind, DeviceRule, normalize};

/// `BPF_DEVCG_DEV_BLOCK`.
const DEV_BLOCK: u32 = 1;
/// `BPF_DEVCG_DEV_CHAR`.
const DEV_CHAR: u32 = 2;

// Opcodes: class | operation | source (include/uapi/linux/bpf_common.h and bpf.h).
/// `BPF_LDX | BPF_MEM | BPF_W`: `dst = *(u32 *)(src + off)`.
const LDX_W: u8 = 0x61;
/// `BPF_ALU | BPF_AND | BPF_K`: `dst32 &= imm`.
const AND32_IMM: u8 = 0x54;
/// `BPF_ALU | BPF_RSH | BPF_K`: `dst32 >>= imm`.
const RSH32_IMM: u8 = 0x74;
/// `BPF_ALU | BPF_MOV | BPF_X`: `dst32 = src32`.
const MOV32_REG: u8 = 0xbc;
/// `BPF_ALU64 | BPF_MOV | BPF_K`: `dst = imm`.
const MOV64_IMM: u8 = 0xb7;
/// `BPF_JMP32 | BPF_JNE | BPF_K`: `if dst32 != imm goto +off`.
const JNE32_IMM: u8 = 0x56;
/// `BPF_JMP32 | BPF_JNE | BPF_X`: `if dst32 != src32 goto +off`.
const JNE32_REG: u8 = 0x5e;
/// `BPF_JMP | BPF_EXIT`.
const EXIT: u8 = 0x95;

// Registers: r1 holds the context on entry and is scratch afterwards.
const R0: u8 = 0;
const R1: u8 = 1;
/// Device type.
const R_TYPE: u8 = 2;
/// Requested access bits.
const R_ACCESS: u8 = 3;
const R_MAJOR: u8 = 4;
const R_MINOR: u8 = 5;

/// One eBPF instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Insn {
    code: u8,
    dst: u8,
    src: u8,
    off: i16,
    imm: i32,
}

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            dst,
            src,
            off,
            imm,
        }
    }

    /// The 8 bytes of `struct bpf_insn` in host byte order.
    fn encode(self) -> [u8; 8] {
        // The register nibbles are a C bitfield: dst_reg is the low nibble on little-endian
        // hosts and the high nibble on big-endian ones.
        let regs = if cfg!(target_endian = "little") {
            self.dst | (self.src << 4)
        } else {
            (self.dst << 4) | self.src
        };
        let [o0, o1] = self.off.to_ne_bytes();
        let [i0, i1, i2, i3] = self.imm.to_ne_bytes();
        [self.code, regs, o0, o1, i0, i1, i2, i3]
    }

    /// True for a conditional or unconditional jump (not `exit`).
    fn jumps(self) -> bool {
        matches!(self.code, JNE32_IMM | JNE32_REG)
    }
}

/// A device-cgroup eBPF program generated from an allow list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProgram {
    insns: Vec<Insn>,
}

impl DeviceProgram {
    /// Builds the program that allows exactly what the allow list `rules` allows (default deny;
    /// see `mesos_gpu_node::rules::is_allowed`). The list is normalized first, as the v1
    /// kernel does.
    pub fn build(rules: &[DeviceRule]) -> DeviceProgram {
        let mut insns = vec![
            Insn::new(LDX_W, R_TYPE, R1, 0, 0),
            Insn::new(AND32_IMM, R_TYPE, 0, 0, 0xffff),
            Insn::new(LDX_W, R_ACCESS, R1, 0, 0),
            Insn::new(RSH32_IMM, R_ACCESS, 0, 0, 16),
            Insn::new(LDX_W, R_MAJOR, R1, 4, 0),
            Insn::new(LDX_W, R_MINOR, R1, 8, 0),
        ];
        for rule in normalize(rules) {
            let checks = rule_checks(&rule);
            let matches_everything = checks.is_empty();
            // Every check jumps past the rest of the block: the later checks, then `r0 = 1; exit`.
            let block_len = checks.iter().map(Vec::len).sum::<usize>() + 2;
            let mut emitted = 0;
            for check in checks {
                emitted += check.len();
                let skip =
                    i16::try_from(block_len - emitted).expect("a block has at most 8 instructions");
                insns.extend(check.into_iter().map(|i| {
                    if i.jumps() {
                        Insn { off: skip, ..i }
                    } else {
                        i
                    }
                }));
            }
            insns.push(Insn::new(MOV64_IMM, R0, 0, 0, 1));
            insns.push(Insn::new(EXIT, 0, 0, 0, 0));
            if matches_everything {
                // Anything after this block would be unreachable, which the verifier rejects.
                return DeviceProgram { insns };
            }
        }
        insns.push(Insn::new(MOV64_IMM, R0, 0, 0, 0));
        insns.push(Insn::new(EXIT, 0, 0, 0, 0));
        DeviceProgram { insns }
    }

    /// Number of instructions.
    pub fn len(&self) -> usize {
        self.insns.len()
    }

    /// Always false: even the empty allow list produces a program.
    pub fn is_empty(&self) -> bool {
        self.insns.is_empty()
    }

    /// The program as `BPF_PROG_LOAD` takes it: 8 bytes per instruction, host byte order.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.insns.iter().flat_map(|i| i.encode()).collect()
    }
}

/// The checks of one rule's block; each is a short sequence that ends in a jump (offset filled
/// in by the caller) taken when the request does not match.
fn rule_checks(rule: &DeviceRule) -> Vec<Vec<Insn>> {
    let mut checks = Vec::new();
    match rule.kind {
        DeviceKind::All => {}
        DeviceKind::Char => checks.push(vec![jne_imm(R_TYPE, DEV_CHAR)]),
        DeviceKind::Block => checks.push(vec![jne_imm(R_TYPE, DEV_BLOCK)]),
    }
    if !rule.access.contains(Access::RWM) {
        // Allowed only when `requested & granted == requested`.
        checks.push(vec![
            Insn::new(MOV32_REG, R1, R_ACCESS, 0, 0),
            Insn::new(AND32_IMM, R1, 0, 0, i32::from(rule.access.bits())),
            Insn::new(JNE32_REG, R1, R_ACCESS, 0, 0),
        ]);
    }
    if let Some(major) = rule.major {
        checks.push(vec![jne_imm(R_MAJOR, major)]);
    }
    if let Some(minor) = rule.minor {
        checks.push(vec![jne_imm(R_MINOR, minor)]);
    }
    checks
}

/// `if reg32 != value goto +0` (offset patched later); the immediate carries the u32's bits.
fn jne_imm(reg: u8, value: u32) -> Insn {
    Insn::new(JNE32_IMM, reg, 0, 0, value.cast_signed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesos_gpu_node::inventory::DevNum;
    use mesos_gpu_node::rules::arb::{arb_access, arb_rule};
    use mesos_gpu_node::rules::{default_whitelist, is_allowed, parse_list};
    use proptest::prelude::*;

    /// Runs `program` in rbpf on one request and returns its verdict.
    fn run(program: &DeviceProgram, kind: DeviceKind, dev: DevNum, access: Access) -> bool {
        let bytes = program.to_bytes();
        let vm = rbpf::EbpfVmRaw::new(Some(&bytes)).expect("rbpf accepts the program");
        let ty = match kind {
            DeviceKind::Char => DEV_CHAR,
            DeviceKind::Block => DEV_BLOCK,
            DeviceKind::All => unreachable!("requests are char or block"),
        };
        let mut ctx = Vec::with_capacity(12);
        ctx.extend_from_slice(&((u32::from(access.bits()) << 16) | ty).to_le_bytes());
        ctx.extend_from_slice(&dev.major.to_le_bytes());
        ctx.extend_from_slice(&dev.minor.to_le_bytes());
        match vm.execute_program(&mut ctx).expect("program runs") {
            0 => false,
            1 => true,
            other => panic!("program returned {other}, neither 0 nor 1"),
        }
    }

    /// Every instruction is reachable from the entry (the kernel verifier's `check_cfg`) and
    /// every path ends in `exit`.
    fn assert_all_reachable(program: &DeviceProgram) {
        let n = program.insns.len();
        let mut seen = vec![false; n];
        let mut todo = vec![0usize];
        while let Some(pc) = todo.pop() {
            assert!(pc < n, "control flow leaves the program at {pc}");
            if std::mem::replace(&mut seen[pc], true) {
                continue;
            }
            let insn = program.insns[pc];
            if insn.code == EXIT {
                continue;
            }
            todo.push(pc + 1);
            if insn.jumps() {
                let target = pc as i64 + 1 + i64::from(insn.off);
                todo.push(usize::try_from(target).expect("jump before the start"));
            }
        }
        let unreachable: Vec<usize> = (0..n).filter(|&i| !seen[i]).collect();
        assert!(
            unreachable.is_empty(),
            "unreachable instructions {unreachable:?}"
        );
    }

    const KINDS: [DeviceKind; 2] = [DeviceKind::Char, DeviceKind::Block];
    const NUMBERS: [u32; 6] = [0, 1, 3, 195, 255, u32::MAX];

    fn all_accesses() -> impl Iterator<Item = Access> {
        (1u8..=7).map(Access::from_bits_truncate)
    }

    /// Checks the program against the reference semantics on every combination of type, a set
    /// of majors and minors (those in the rules plus others), and access.
    fn assert_matrix(rules: &[DeviceRule]) {
        let program = DeviceProgram::build(rules);
        assert_all_reachable(&program);
        for kind in KINDS {
            for major in NUMBERS {
                for minor in NUMBERS {
                    for access in all_accesses() {
                        let dev = DevNum { major, minor };
                        let want = is_allowed(&normalize(rules), kind, dev, access);
                        assert_eq!(
                            run(&program, kind, dev, access),
                            want,
                            "{kind:?} {dev} {access} with rules {rules:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn empty_list_denies_everything() {
        let program = DeviceProgram::build(&[]);
        assert_eq!(program.len(), 8);
        assert_matrix(&[]);
        assert!(!run(
            &program,
            DeviceKind::Char,
            DevNum { major: 1, minor: 3 },
            Access::READ
        ));
    }

    #[test]
    fn allow_all_allows_everything_and_stops() {
        let rules = parse_list("a *:* rwm\nc 195:3 r\n").expect("valid");
        let program = DeviceProgram::build(&rules);
        assert_all_reachable(&program);
        for kind in KINDS {
            for access in all_accesses() {
                assert!(run(&program, kind, DevNum { major: 8, minor: 0 }, access));
            }
        }
        assert_matrix(&rules);
    }

    #[test]
    fn gpu_container_by_hand() {
        // Explicit expectations, independent of `is_allowed`.
        let mut rules = default_whitelist();
        rules.extend(parse_list("c 195:255 rwm\nc 195:1 rw\nc 195:3 rwm\n").expect("valid"));
        let program = DeviceProgram::build(&rules);
        let c = |major, minor| (DeviceKind::Char, DevNum { major, minor });
        let cases = [
            (c(195, 1), Access::RW, true),
            (c(195, 1), Access::MKNOD, true), // `c *:* m` from the whitelist
            (c(195, 1), Access::RWM, false),
            (c(195, 3), Access::RWM, true),
            (c(195, 255), Access::READ, true),
            (c(195, 0), Access::READ, false),
            (c(195, 2), Access::WRITE, false),
            (c(195, 2), Access::MKNOD, true),
            (c(1, 3), Access::RW, true),
            (c(136, 42), Access::RWM, true),
            (c(137, 42), Access::READ, false),
            (
                (
                    DeviceKind::Block,
                    DevNum {
                        major: 195,
                        minor: 1,
                    },
                ),
                Access::READ,
                false,
            ),
            (
                (DeviceKind::Block, DevNum { major: 8, minor: 0 }),
                Access::MKNOD,
                true,
            ),
            (
                (DeviceKind::Block, DevNum { major: 8, minor: 0 }),
                Access::RW,
                false,
            ),
        ];
        for ((kind, dev), access, want) in cases {
            assert_eq!(
                run(&program, kind, dev, access),
                want,
                "{kind:?} {dev} {access}"
            );
        }
        assert_matrix(&rules);
    }

    #[test]
    fn every_rule_shape_and_access() {
        let mut shapes = Vec::new();
        for kind in [DeviceKind::Char, DeviceKind::Block, DeviceKind::All] {
            for (major, minor) in [
                (None, None),
                (Some(195), None),
                (None, Some(3)),
                (Some(195), Some(3)),
            ] {
                if kind == DeviceKind::All && (major.is_some() || minor.is_some()) {
                    continue;
                }
                for access in all_accesses() {
                    shapes.push(DeviceRule {
                        kind,
                        major,
                        minor,
                        access,
                    });
                }
            }
        }
        for rule in &shapes {
            assert_matrix(std::slice::from_ref(rule));
        }
        // All of them together, and with a large number that must not be sign-extended.
        shapes.push(DeviceRule::char_device(
            DevNum {
                major: u32::MAX,
                minor: u32::MAX,
            },
            Access::READ,
        ));
        assert_matrix(&shapes);
    }

    #[test]
    fn encoding_is_struct_bpf_insn() {
        let insn = Insn::new(JNE32_IMM, R_MAJOR, 0, 3, 195);
        assert_eq!(insn.encode(), [0x56, 0x04, 3, 0, 195, 0, 0, 0]);
        let insn = Insn::new(JNE32_REG, R1, R_ACCESS, -1, 0);
        assert_eq!(insn.encode(), [0x5e, 0x31, 0xff, 0xff, 0, 0, 0, 0]);
        assert_eq!(DeviceProgram::build(&[]).to_bytes().len(), 8 * 8);
    }

    proptest! {
        #[test]
        fn program_agrees_with_reference(
            rules in proptest::collection::vec(arb_rule(), 0..10),
            block in any::<bool>(),
            major in prop_oneof![0u32..8, any::<u32>()],
            minor in prop_oneof![0u32..8, any::<u32>()],
            access in arb_access(),
        ) {
            let kind = if block { DeviceKind::Block } else { DeviceKind::Char };
            let dev = DevNum { major, minor };
            let program = DeviceProgram::build(&rules);
            assert_all_reachable(&program);
            prop_assert_eq!(run(&program, kind, dev, access), is_allowed(&normalize(&rules), kind, dev, access));
        }
    }
}

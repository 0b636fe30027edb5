//! The `flags` word of an ld.so.cache entry: library kind in the low byte, ABI/architecture in
//! the high byte.
//!
//! Values are glibc's `FLAG_*` constants from `sysdeps/generic/ldconfig.h`; the names printed
//! are those of glibc 2.36's `print_entry` (`elf/cache.c`), which prints the architecture byte as
//! a decimal number when it does not know it (LoongArch's 0x1100 and 0x1200 included).

use std::fmt;

/// `FLAG_TYPE_MASK`: the library-kind byte.
const TYPE_MASK: i32 = 0x00ff;
/// `FLAG_REQUIRED_MASK`: the architecture byte.
const ARCH_MASK: i32 = 0xff00;

/// The flags word of one cache entry, kept exactly as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct EntryFlags(pub i32);

/// What kind of library an entry is (`flags & FLAG_TYPE_MASK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibKind {
    /// `FLAG_LIBC4` (0): an a.out libc4 library.
    Libc4,
    /// `FLAG_ELF` (1): an ELF library that does not link a known libc.
    Elf,
    /// `FLAG_ELF_LIBC5` (2).
    Libc5,
    /// `FLAG_ELF_LIBC6` (3): an ELF library linked against glibc.
    Libc6,
    /// Any other value of the type byte.
    Unknown(u8),
}

/// The ABI an entry was built for (`flags & FLAG_REQUIRED_MASK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheArch {
    /// 0: no marker. i386 and every other "default" 32-bit ABI.
    Default,
    /// `FLAG_SPARC_LIB64` (0x0100).
    Sparc64,
    /// `FLAG_IA64_LIB64` (0x0200).
    Ia64,
    /// `FLAG_X8664_LIB64` (0x0300).
    X86_64,
    /// `FLAG_S390_LIB64` (0x0400).
    S390x,
    /// `FLAG_POWERPC_LIB64` (0x0500).
    PowerPc64,
    /// `FLAG_MIPS64_LIBN32` (0x0600).
    Mips64N32,
    /// `FLAG_MIPS64_LIBN64` (0x0700).
    Mips64N64,
    /// `FLAG_X8664_LIBX32` (0x0800).
    X32,
    /// `FLAG_ARM_LIBHF` (0x0900).
    ArmHardFloat,
    /// `FLAG_AARCH64_LIB64` (0x0a00).
    Aarch64,
    /// `FLAG_ARM_LIBSF` (0x0b00).
    ArmSoftFloat,
    /// `FLAG_MIPS_LIB32_NAN2008` (0x0c00).
    MipsNan2008,
    /// `FLAG_MIPS64_LIBN32_NAN2008` (0x0d00).
    Mips64N32Nan2008,
    /// `FLAG_MIPS64_LIBN64_NAN2008` (0x0e00).
    Mips64N64Nan2008,
    /// `FLAG_RISCV_FLOAT_ABI_SOFT` (0x0f00).
    RiscvSoftFloat,
    /// `FLAG_RISCV_FLOAT_ABI_DOUBLE` (0x1000).
    RiscvDoubleFloat,
    /// `FLAG_LARCH_FLOAT_ABI_SOFT` (0x1100).
    LoongArchSoftFloat,
    /// `FLAG_LARCH_FLOAT_ABI_DOUBLE` (0x1200).
    LoongArchDoubleFloat,
    /// Any other value of the architecture byte (already shifted into place, e.g. 0x1300).
    Other(u16),
}

impl EntryFlags {
    /// x86-64 glibc library (`FLAG_ELF_LIBC6 | FLAG_X8664_LIB64`).
    pub const X86_64_LIBC6: EntryFlags = EntryFlags(0x0303);
    /// i386 glibc library (`FLAG_ELF_LIBC6`).
    pub const I386_LIBC6: EntryFlags = EntryFlags(0x0003);

    /// The library kind.
    pub fn kind(self) -> LibKind {
        match self.0 & TYPE_MASK {
            0 => LibKind::Libc4,
            1 => LibKind::Elf,
            2 => LibKind::Libc5,
            3 => LibKind::Libc6,
            other => LibKind::Unknown(u8::try_from(other).unwrap_or(u8::MAX)),
        }
    }

    /// True for ELF libraries (bit `FLAG_ELF`), the only ones a dynamic loader can use.
    pub fn is_elf(self) -> bool {
        self.0 & 0x0001 != 0
    }

    /// The architecture byte.
    pub fn arch(self) -> CacheArch {
        let raw = u16::try_from((self.0 & ARCH_MASK) >> 8).unwrap_or(u16::MAX);
        match raw {
            0x00 => CacheArch::Default,
            0x01 => CacheArch::Sparc64,
            0x02 => CacheArch::Ia64,
            0x03 => CacheArch::X86_64,
            0x04 => CacheArch::S390x,
            0x05 => CacheArch::PowerPc64,
            0x06 => CacheArch::Mips64N32,
            0x07 => CacheArch::Mips64N64,
            0x08 => CacheArch::X32,
            0x09 => CacheArch::ArmHardFloat,
            0x0a => CacheArch::Aarch64,
            0x0b => CacheArch::ArmSoftFloat,
            0x0c => CacheArch::MipsNan2008,
            0x0d => CacheArch::Mips64N32Nan2008,
            0x0e => CacheArch::Mips64N64Nan2008,
            0x0f => CacheArch::RiscvSoftFloat,
            0x10 => CacheArch::RiscvDoubleFloat,
            0x11 => CacheArch::LoongArchSoftFloat,
            0x12 => CacheArch::LoongArchDoubleFloat,
            other => CacheArch::Other(other << 8),
        }
    }
}

impl CacheArch {
    /// The suffix glibc 2.36's `ldconfig -p` prints after the kind, without the comma; `None`
    /// for [`CacheArch::Default`]. Unknown values print as the masked number in decimal.
    fn ldconfig_suffix(self) -> Option<LdconfigArch> {
        let name = match self {
            CacheArch::Default => return None,
            CacheArch::Sparc64 | CacheArch::S390x | CacheArch::PowerPc64 | CacheArch::Mips64N64 => {
                "64bit"
            }
            CacheArch::Ia64 => "IA-64",
            CacheArch::X86_64 => "x86-64",
            CacheArch::Mips64N32 => "N32",
            CacheArch::X32 => "x32",
            CacheArch::ArmHardFloat => "hard-float",
            CacheArch::Aarch64 => "AArch64",
            CacheArch::ArmSoftFloat | CacheArch::RiscvSoftFloat => "soft-float",
            CacheArch::MipsNan2008 => "nan2008",
            CacheArch::Mips64N32Nan2008 => "N32,nan2008",
            CacheArch::Mips64N64Nan2008 => "64bit,nan2008",
            CacheArch::RiscvDoubleFloat => "double-float",
            // glibc 2.36's ldconfig has no case for LoongArch and prints the number.
            CacheArch::LoongArchSoftFloat => return Some(LdconfigArch::Number(0x1100)),
            CacheArch::LoongArchDoubleFloat => return Some(LdconfigArch::Number(0x1200)),
            CacheArch::Other(n) => return Some(LdconfigArch::Number(n)),
        };
        Some(LdconfigArch::Name(name))
    }
}

enum LdconfigArch {
    Name(&'static str),
    Number(u16),
}

/// Formats as `ldconfig -p` does between the parentheses, e.g. `libc6,x86-64`.
impl fmt::Display for EntryFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind() {
            LibKind::Libc4 => "libc4",
            LibKind::Elf => "ELF",
            LibKind::Libc5 => "libc5",
            LibKind::Libc6 => "libc6",
            LibKind::Unknown(_) => "unknown",
        };
        f.write_str(kind)?;
        match self.arch().ldconfig_suffix() {
            None => Ok(()),
            Some(LdconfigArch::Name(name)) => write!(f, ",{name}"),
            Some(LdconfigArch::Number(n)) => write!(f, ",{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_flags_print_like_ldconfig() {
        assert_eq!(EntryFlags::X86_64_LIBC6.to_string(), "libc6,x86-64");
        assert_eq!(EntryFlags::I386_LIBC6.to_string(), "libc6");
        assert_eq!(EntryFlags(0x0803).to_string(), "libc6,x32");
        assert_eq!(EntryFlags(0x0a03).to_string(), "libc6,AArch64");
        assert_eq!(EntryFlags(0x0001).to_string(), "ELF");
        assert_eq!(EntryFlags(0x0d02).to_string(), "libc5,N32,nan2008");
    }

    #[test]
    fn unknown_values_print_as_numbers() {
        assert_eq!(EntryFlags(-1).to_string(), "unknown,65280");
        assert_eq!(EntryFlags(0x1103).to_string(), "libc6,4352");
        assert_eq!(EntryFlags(0x1304).to_string(), "unknown,4864");
        assert_eq!(EntryFlags(-1).kind(), LibKind::Unknown(0xff));
        assert_eq!(EntryFlags(0x1304).arch(), CacheArch::Other(0x1300));
    }

    #[test]
    fn elf_bit() {
        assert!(EntryFlags::X86_64_LIBC6.is_elf());
        assert!(EntryFlags(0x0001).is_elf());
        assert!(!EntryFlags(0x0002).is_elf());
        assert!(!EntryFlags(0x0300).is_elf());
    }
}

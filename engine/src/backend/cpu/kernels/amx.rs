//! Intel AMX (Advanced Matrix Extensions) for the int8 products of
//! [`PackedQB`](super::qgemm::PackedQB): detection (CPUID, the tile state the OS saves in
//! XCR0, and the per-process permission Linux asks for), a tile configuration that releases
//! the tiles when dropped, and the tile operations of its micro-kernel as inline assembly
//! (Rust's AMX intrinsics are unstable). The micro-kernel keeps four 16 x 16 i32 accumulator
//! tiles (`tmm0..tmm3`, a 32 x 32 block), two A tiles of 16 rows x 64 bytes (`tmm4`, `tmm5`)
//! and two B tiles of 16 K groups x 16 columns x 4 bytes (`tmm6`, `tmm7`): one `tdpbusd`
//! multiplies 16 x 64 u8 by 64 x 16 i8, 16,384 multiply-adds.

use std::marker::PhantomData;
use std::sync::OnceLock;

/// Bytes of K one tile step covers (an A tile row, 16 groups of 4 in a B tile).
pub const K_STEP: usize = 64;

/// Rows of an A tile (and of an accumulator tile).
pub const TILE_ROWS: usize = 16;

/// Whether this process may run AMX int8 instructions: the CPU has AMX-TILE and AMX-INT8, the
/// OS saves tile state, Linux granted the tile data permission, and `VIGIL_AMX=0` is not set
/// (the switch for comparisons). Checked once per process.
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| std::env::var("VIGIL_AMX").map_or(true, |v| v != "0") && detect())
}

#[cfg(target_os = "linux")]
fn detect() -> bool {
    use std::arch::x86_64::{__cpuid_count, _xgetbv};
    // SAFETY: CPUID exists on every x86-64 CPU; XGETBV only runs once CPUID says the OS
    // enabled XSAVE (OSXSAVE).
    unsafe {
        if __cpuid_count(0, 0).eax < 0xd {
            return false;
        }
        let edx = __cpuid_count(7, 0).edx;
        let (tile, int8) = ((edx >> 24) & 1 == 1, (edx >> 25) & 1 == 1);
        let osxsave = (__cpuid_count(1, 0).ecx >> 27) & 1 == 1;
        if !(tile && int8 && osxsave) {
            return false;
        }
        // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves the tile state.
        if (_xgetbv(0) >> 17) & 3 != 3 {
            return false;
        }
    }
    // Linux hands out the 8 KiB of tile data state per process on request.
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permissions.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn detect() -> bool {
    false
}

/// The 64-byte tile configuration (palette 1): eight tiles of 16 rows x 64 bytes.
#[repr(C, align(64))]
struct Palette {
    id: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// This thread's tiles, configured as eight 16 x 64-byte tiles while the value lives and
/// released (back to the init state, so a context switch saves nothing) when it drops. Not
/// `Send`: the configuration belongs to the thread that loaded it.
pub struct Tiles {
    _thread: PhantomData<*const ()>,
}

impl Tiles {
    /// Loads the configuration (zeroing every tile).
    ///
    /// # Safety
    /// [`available`] returned true.
    pub unsafe fn configure() -> Tiles {
        let mut p = Palette {
            id: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            p.colsb[t] = K_STEP as u16;
            p.rows[t] = TILE_ROWS as u8;
        }
        std::arch::asm!("ldtilecfg [{0}]", in(reg) &p as *const Palette, options(nostack, readonly));
        Tiles {
            _thread: PhantomData,
        }
    }

    /// Zeroes the four accumulator tiles.
    #[inline(always)]
    pub fn zero(&self) {
        // SAFETY: the tiles are configured while `self` lives.
        unsafe {
            std::arch::asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            )
        }
    }

    /// One K step of the 32 x 32 block: `tmm0..3 += [A0; A1] x [B | B + 64]`, A0 and A1 16
    /// rows of 64 bytes at strides `lda0`, `lda1`, B 16 rows (K groups) of 64 bytes, the
    /// second 16 columns 64 bytes on, at stride `ldb`.
    ///
    /// # Safety
    /// Tiles configured; the 16 x 64 bytes of each A tile and 16 x 128 bytes of B readable.
    #[inline(always)]
    pub unsafe fn step_2x2(
        &self,
        (a0, lda0): (*const u8, usize),
        (a1, lda1): (*const u8, usize),
        b: *const i8,
        ldb: usize,
    ) {
        std::arch::asm!(
            "tileloadd tmm4, [{a0} + {lda0}*1]",
            "tileloadd tmm6, [{b0} + {ldb}*1]",
            "tileloadd tmm7, [{b1} + {ldb}*1]",
            "tdpbusd tmm0, tmm4, tmm6",
            "tileloadd tmm5, [{a1} + {lda1}*1]",
            "tdpbusd tmm1, tmm4, tmm7",
            "tdpbusd tmm2, tmm5, tmm6",
            "tdpbusd tmm3, tmm5, tmm7",
            a0 = in(reg) a0,
            lda0 = in(reg) lda0,
            a1 = in(reg) a1,
            lda1 = in(reg) lda1,
            b0 = in(reg) b,
            b1 = in(reg) b.add(K_STEP),
            ldb = in(reg) ldb,
            options(nostack, readonly)
        )
    }

    /// [`Self::step_2x2`] for a 16-column panel: `tmm0 += A0 x B`, `tmm2 += A1 x B`.
    ///
    /// # Safety
    /// As [`Self::step_2x2`], with 16 x 64 bytes of B.
    #[inline(always)]
    pub unsafe fn step_2x1(
        &self,
        (a0, lda0): (*const u8, usize),
        (a1, lda1): (*const u8, usize),
        b: *const i8,
        ldb: usize,
    ) {
        std::arch::asm!(
            "tileloadd tmm4, [{a0} + {lda0}*1]",
            "tileloadd tmm6, [{b0} + {ldb}*1]",
            "tdpbusd tmm0, tmm4, tmm6",
            "tileloadd tmm5, [{a1} + {lda1}*1]",
            "tdpbusd tmm2, tmm5, tmm6",
            a0 = in(reg) a0,
            lda0 = in(reg) lda0,
            a1 = in(reg) a1,
            lda1 = in(reg) lda1,
            b0 = in(reg) b,
            ldb = in(reg) ldb,
            options(nostack, readonly)
        )
    }

    /// Stores the block's accumulators into `c` (32 rows of 32 i32, row stride 128 bytes):
    /// `tmm0` top left, `tmm1` top right, `tmm2` bottom left, `tmm3` bottom right.
    #[inline(always)]
    pub fn store(&self, c: &mut Block) {
        let p = c.0.as_mut_ptr() as *mut i32;
        // SAFETY: tiles configured; each store writes 16 rows of 64 bytes inside `c`.
        unsafe {
            std::arch::asm!(
                "tilestored [{c0} + {ld}*1], tmm0",
                "tilestored [{c1} + {ld}*1], tmm1",
                "tilestored [{c2} + {ld}*1], tmm2",
                "tilestored [{c3} + {ld}*1], tmm3",
                c0 = in(reg) p,
                c1 = in(reg) p.add(16),
                c2 = in(reg) p.add(16 * 32),
                c3 = in(reg) p.add(16 * 32 + 16),
                ld = in(reg) 128usize,
                options(nostack)
            )
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `configure` on this thread.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) }
    }
}

/// A 32 x 32 block of i32 accumulators, as [`Tiles::store`] writes it.
#[repr(C, align(64))]
pub struct Block(pub [[i32; 32]; 32]);

/// Two A tiles staged for rows a tile cannot read in place (past the band's end, or the
/// last rows whose 64-byte reads would overrun the buffer): 16 rows x 64 bytes each, zeroed
/// past the valid rows and bytes.
#[repr(C, align(64))]
pub struct Stage(pub [[[u8; K_STEP]; TILE_ROWS]; 2]);

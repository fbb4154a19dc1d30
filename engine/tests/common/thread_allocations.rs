//! A global allocator that counts one thread's heap allocations while asked, keeping the stacks
//! of the first few: shared by the tests that check that a path allocates nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};

struct Counting;

thread_local! {
    /// Whether this thread's allocations are counted now, and how many there were.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// Where the first counted allocations came from.
    static FIRST: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Allocations whose stacks are kept, at most.
const TRACED: u64 = 3;

fn count() {
    // `try_with`: the thread-locals may be gone while a thread exits.
    let _ = COUNTING.try_with(|c| {
        if c.get() {
            let n = ALLOCS.try_with(|a| {
                a.set(a.get() + 1);
                a.get()
            });
            if n.is_ok_and(|n| n <= TRACED) {
                // Not counted while the stack is taken (that allocates too).
                c.set(false);
                let trace = std::backtrace::Backtrace::force_capture().to_string();
                let _ = FIRST.try_with(|f| f.borrow_mut().push(trace));
                c.set(true);
            }
        }
    });
}

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` with this thread's heap allocations counted (other threads' are not): its result,
/// how many there were, and the stacks of the first few.
pub fn counted<T>(f: impl FnOnce() -> T) -> (T, u64, String) {
    ALLOCS.with(|a| a.set(0));
    FIRST.with(|v| {
        let mut v = v.borrow_mut();
        v.clear();
        v.reserve(TRACED as usize);
    });
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    let stacks = FIRST.with(|v| v.borrow().join("\n----\n"));
    (out, ALLOCS.with(|a| a.get()), stacks)
}

//! The binary's allocator: the system's (glibc's `malloc`), with a small cache of
//! freed over-aligned blocks in front of it.
//!
//! tokio aligns each task and each socket registration to 128 bytes (cache-line
//! padding), so every new connection allocates two such blocks and frees them again.
//! glibc has no per-thread cache for aligned requests: `posix_memalign` carves the
//! block out of a larger chunk and frees the ends it cut off, ~550 instructions a
//! block against ~60 for a plain small `malloc` (docs/performance.md,
//! twenty-seventh round). Freed aligned blocks wait here, by layout, for the next
//! request of the same layout. Everything else goes straight to the system.
//!
//! The cache is shared by the process's threads behind a try-lock: a thread that
//! finds it taken uses the system allocator instead of waiting, so it adds no
//! waiting to any thread. It holds at most `CLASSES` x `DEPTH` blocks of up to
//! `MAX_SIZE` bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Layouts cached at once.
const CLASSES: usize = 4;
/// Blocks kept per layout.
const DEPTH: usize = 32;
/// The largest block kept.
const MAX_SIZE: usize = 1024;
/// The alignment `malloc` gives by itself (x86-64 and aarch64 glibc): anything
/// aligned to at most this goes to `malloc` directly.
const MALLOC_ALIGN: usize = 16;

/// The system allocator with a cache of freed over-aligned blocks.
pub struct CachingAlloc {
    locked: AtomicBool,
    cache: UnsafeCell<Cache>,
}

// SAFETY: `cache` is only reached through `with_cache`, which holds `locked` (taken
// with Acquire, released with Release) for the whole access, so no two threads touch
// it at once. The raw pointers in it are plain heap blocks, not tied to a thread.
unsafe impl Sync for CachingAlloc {}

impl CachingAlloc {
    pub const fn new() -> CachingAlloc {
        CachingAlloc {
            locked: AtomicBool::new(false),
            cache: UnsafeCell::new(Cache::new()),
        }
    }

    /// Runs `f` on the cache if no other thread holds it; None if one does.
    fn with_cache<R>(&self, f: impl FnOnce(&mut Cache) -> R) -> Option<R> {
        if self.locked.swap(true, Ordering::Acquire) {
            return None;
        }
        // SAFETY: the swap above took the lock (it was false), so this thread alone
        // reaches the cache until the store below; `f` allocates nothing (the cache
        // is fixed arrays), so it cannot re-enter this allocator.
        let r = f(unsafe { &mut *self.cache.get() });
        self.locked.store(false, Ordering::Release);
        Some(r)
    }
}

impl Default for CachingAlloc {
    fn default() -> CachingAlloc {
        CachingAlloc::new()
    }
}

impl Drop for CachingAlloc {
    /// Gives the kept blocks back (the process's allocator is never dropped; one made
    /// in a test is).
    fn drop(&mut self) {
        for c in &self.cache.get_mut().classes {
            for &b in &c.blocks[..c.len] {
                // SAFETY: each kept block came from `System` with this class's layout
                // (valid, as it was made from a `Layout`), and is freed once.
                unsafe { System.dealloc(b, Layout::from_size_align_unchecked(c.size, c.align)) }
            }
        }
    }
}

/// Whether blocks of this layout are cached.
fn cached(layout: Layout) -> bool {
    layout.align() > MALLOC_ALIGN && layout.size() <= MAX_SIZE
}

// SAFETY: every block handed out is either fresh from `System` for the same layout or
// a block of exactly that layout that was allocated by `System`, deallocated by the
// caller (so no longer in use) and kept in the cache since; every block given back to
// `System` is returned with the layout it was allocated with. So the contract of
// `GlobalAlloc` holds as it does for `System` itself.
unsafe impl GlobalAlloc for CachingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if cached(layout) {
            if let Some(Some(p)) = self.with_cache(|c| c.take(layout)) {
                return p;
            }
        }
        // SAFETY: the caller's contract (a non-zero size) is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !cached(layout) {
            // SAFETY: as in `alloc`; `calloc` stays in use for all but cached layouts.
            return unsafe { System.alloc_zeroed(layout) };
        }
        // SAFETY: as in `alloc`; a non-null result is a live block of
        // `layout.size()` bytes, this caller's.
        unsafe {
            let p = self.alloc(layout);
            if !p.is_null() {
                std::ptr::write_bytes(p, 0, layout.size());
            }
            p
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if cached(layout) && self.with_cache(|c| c.keep(ptr, layout)) == Some(true) {
            return;
        }
        // SAFETY: `ptr` came from `System` with this layout (cached blocks too).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            // SAFETY: the block is a `System` one of `layout`; `System::realloc` keeps
            // the alignment, which `malloc`'s own already satisfies.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: the caller's contract makes `new_layout` valid (same alignment, a
        // size that does not overflow when rounded); the copy stays within both
        // blocks, and the old one is freed with its own layout.
        unsafe {
            let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

/// Freed blocks by layout. Fixed arrays: nothing here allocates.
struct Cache {
    classes: [Class; CLASSES],
}

struct Class {
    size: usize,
    align: usize,
    len: usize,
    blocks: [*mut u8; DEPTH],
}

impl Cache {
    const fn new() -> Cache {
        const EMPTY: Class = Class {
            size: 0,
            align: 0,
            len: 0,
            blocks: [std::ptr::null_mut(); DEPTH],
        };
        Cache {
            classes: [EMPTY; CLASSES],
        }
    }

    /// A kept block of this layout, if any.
    fn take(&mut self, layout: Layout) -> Option<*mut u8> {
        let c = self
            .classes
            .iter_mut()
            .find(|c| c.len > 0 && c.size == layout.size() && c.align == layout.align())?;
        c.len -= 1;
        Some(c.blocks[c.len])
    }

    /// Keeps a freed block; false if its layout's room is full, or every class is
    /// taken by other layouts.
    fn keep(&mut self, ptr: *mut u8, layout: Layout) -> bool {
        let same = |c: &Class| c.size == layout.size() && c.align == layout.align();
        let i = match self.classes.iter().position(|c| c.len > 0 && same(c)) {
            Some(i) => i,
            // An empty class is anyone's.
            None => match self.classes.iter().position(|c| c.len == 0) {
                Some(i) => i,
                None => return false,
            },
        };
        let c = &mut self.classes[i];
        if c.len == DEPTH {
            return false;
        }
        c.size = layout.size();
        c.align = layout.align();
        c.blocks[c.len] = ptr;
        c.len += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_freed_aligned_block_is_handed_out_again_for_its_layout_only() {
        let a = CachingAlloc::new();
        let l = layout(256, 128);
        // SAFETY: each block is used within its layout and freed once, with it.
        unsafe {
            let p = a.alloc(l);
            assert!(!p.is_null());
            assert_eq!(p as usize % 128, 0);
            p.write_bytes(7, 256);
            a.dealloc(p, l);
            // Another layout does not get it.
            let q = a.alloc(layout(128, 128));
            assert_ne!(p, q);
            let r = a.alloc(l);
            assert_eq!(p, r, "the freed block is reused");
            a.dealloc(q, layout(128, 128));
            a.dealloc(r, l);
            let z = a.alloc_zeroed(l);
            assert_eq!(z, r);
            assert!(std::slice::from_raw_parts(z, 256).iter().all(|&b| b == 0));
            a.dealloc(z, l);
        }
    }

    #[test]
    fn plain_and_large_blocks_are_not_kept() {
        let a = CachingAlloc::new();
        // SAFETY: as above.
        unsafe {
            for l in [layout(64, 8), layout(4096, 128)] {
                let p = a.alloc(l);
                a.dealloc(p, l);
            }
        }
        // SAFETY: the cache is not shared with any other thread in this test.
        let c = unsafe { &*a.cache.get() };
        assert!(c.classes.iter().all(|c| c.len == 0));
    }

    #[test]
    fn the_cache_is_bounded_and_blocks_beyond_it_go_back() {
        let a = CachingAlloc::new();
        let mut blocks = Vec::new();
        // SAFETY: as above.
        unsafe {
            // More layouts than classes and more blocks than a class holds.
            for size in [64, 128, 192, 256, 320] {
                for _ in 0..DEPTH + 3 {
                    blocks.push((a.alloc(layout(size, 64)), layout(size, 64)));
                }
            }
            for (p, l) in blocks.drain(..) {
                assert!(!p.is_null());
                assert_eq!(p as usize % 64, 0);
                a.dealloc(p, l);
            }
        }
        // SAFETY: as above.
        let c = unsafe { &*a.cache.get() };
        assert!(c.classes.iter().all(|c| c.len == DEPTH));
        // The fifth layout found no class of its own.
        assert!(!c.classes.iter().any(|c| c.size == 320));
    }

    #[test]
    fn realloc_keeps_the_contents_and_the_alignment() {
        let a = CachingAlloc::new();
        // SAFETY: as above; the old block is not used after realloc.
        unsafe {
            let l = layout(100, 64);
            let p = a.alloc(l);
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            let q = a.realloc(p, l, 500);
            assert_eq!(q as usize % 64, 0);
            assert!((0..100).all(|i| *q.add(i) == i as u8));
            a.dealloc(q, layout(500, 64));
            let l = layout(40, 8);
            let p = a.alloc(l);
            p.write_bytes(3, 40);
            let q = a.realloc(p, l, 4000);
            assert!((0..40).all(|i| *q.add(i) == 3));
            a.dealloc(q, layout(4000, 8));
        }
    }

    #[test]
    fn threads_sharing_the_cache_never_get_the_same_block() {
        let a = CachingAlloc::new();
        let l = layout(256, 128);
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let a = &a;
                s.spawn(move || {
                    let mut held = Vec::with_capacity(8);
                    for i in 0..20_000usize {
                        // SAFETY: each block is written within its layout while this
                        // thread holds it, then freed once, with it.
                        unsafe {
                            let p = a.alloc(l);
                            assert!(!p.is_null());
                            p.write_bytes(t, 256);
                            held.push(p);
                            if held.len() == 8 || i % 3 == 0 {
                                for p in held.drain(..) {
                                    // Another thread writing a block this one holds
                                    // would show here.
                                    let b = std::slice::from_raw_parts(p, 256);
                                    assert!(b.iter().all(|&x| x == t));
                                    a.dealloc(p, l);
                                }
                            }
                        }
                    }
                    for p in held {
                        // SAFETY: as above.
                        unsafe { a.dealloc(p, l) };
                    }
                });
            }
        });
    }

    #[test]
    fn a_taken_lock_sends_requests_to_the_system() {
        let a = CachingAlloc::new();
        let l = layout(256, 128);
        // SAFETY: as above.
        unsafe {
            let p = a.alloc(l);
            a.locked.store(true, Ordering::Relaxed);
            // Freed while another thread would hold the cache: not kept.
            a.dealloc(p, l);
            a.locked.store(false, Ordering::Relaxed);
            let c = &*a.cache.get();
            assert!(c.classes.iter().all(|c| c.len == 0));
        }
    }
}

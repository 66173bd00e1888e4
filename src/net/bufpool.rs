//! Per-thread recycling of relay buffers: a transaction-pooled client gives its
//! buffers back when it releases its server, and the next one to read takes them,
//! so idle clients hold no buffer and busy ones do not allocate per transaction.

use std::cell::RefCell;

use bytes::BytesMut;

/// Size of one relay buffer.
pub const BUF_SIZE: usize = 16 * 1024;

/// Buffers kept per thread: enough for the clients one thread serves at once.
const KEEP: usize = 64;

thread_local! {
    static FREE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// A buffer with at least [`BUF_SIZE`] bytes of capacity.
pub fn take() -> BytesMut {
    // `try_with`: at thread exit the list may be gone already (then nothing is kept).
    FREE.try_with(|f| f.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| BytesMut::with_capacity(BUF_SIZE))
}

/// Whether `buf` can serve the next request as it is: empty, not shared, of a usual
/// size. A buffer whose front was split off (the prepared-statement rewriter does
/// that) gets its room back here, without copying or allocating, once nothing else
/// shares it: otherwise every transaction would allocate a fresh one.
pub fn reusable(buf: &mut BytesMut) -> bool {
    buf.is_empty() && buf.try_reclaim(BUF_SIZE) && buf.capacity() <= 4 * BUF_SIZE
}

/// Gives an empty buffer back; odd-sized, shared or non-empty ones are simply dropped.
pub fn give(mut buf: BytesMut) {
    if !reusable(&mut buf) {
        return;
    }
    // A relay dropped at thread exit (by another thread-local's destructor) may come
    // here after the list is gone: the buffer is simply freed.
    let _ = FREE.try_with(|f| {
        let mut f = f.borrow_mut();
        if f.len() < KEEP {
            f.push(buf);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;

    #[test]
    fn recycles_empty_buffers_only() {
        let b = take();
        assert!(b.capacity() >= BUF_SIZE);
        let ptr = b.as_ptr();
        give(b);
        assert_eq!(take().as_ptr(), ptr);
        let mut full = take();
        full.extend_from_slice(b"x");
        give(full);
        let small = BytesMut::with_capacity(10);
        give(small);
        assert!(take().capacity() >= BUF_SIZE);
    }

    #[test]
    fn split_buffers_come_back_whole_once_unshared() {
        let mut b = take();
        let ptr = b.as_ptr();
        b.extend_from_slice(&[7u8; 100]);
        let front = b.split_to(60).freeze();
        b.advance(40);
        // Still shared with `front`: dropped, not kept.
        give(b);
        assert_ne!(take().as_ptr(), ptr);
        let mut b = BytesMut::with_capacity(BUF_SIZE);
        let ptr = b.as_ptr();
        b.extend_from_slice(&[7u8; 100]);
        drop(b.split_to(100).freeze());
        give(b);
        drop(front);
        let again = take();
        assert_eq!(again.as_ptr(), ptr);
        assert!(again.capacity() >= BUF_SIZE);
    }
}

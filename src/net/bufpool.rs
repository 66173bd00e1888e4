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
    FREE.with(|f| f.borrow_mut().pop())
        .unwrap_or_else(|| BytesMut::with_capacity(BUF_SIZE))
}

/// Gives an empty buffer back; odd-sized or non-empty ones are simply dropped.
pub fn give(mut buf: BytesMut) {
    if !buf.is_empty() || buf.capacity() < BUF_SIZE || buf.capacity() > 4 * BUF_SIZE {
        return;
    }
    buf.clear();
    FREE.with(|f| {
        let mut f = f.borrow_mut();
        if f.len() < KEEP {
            f.push(buf);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

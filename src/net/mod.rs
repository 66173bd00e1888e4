//! Sockets: the listeners (TCP and UNIX) and a [`Stream`] that is either.

pub mod bufpool;
pub mod framed;
pub mod listener;
pub mod stream;

pub use listener::{accept_tcp, accept_unix, bind_listeners, Listeners};
pub use stream::{Origin, PeerAddr, StdStream, Stream};

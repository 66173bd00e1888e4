//! Sockets: the listeners (TCP and UNIX) and a [`Stream`] that is either.

pub mod bufpool;
pub mod dns;
pub mod framed;
pub mod listener;
pub mod stream;
mod tls;
pub mod tune;

pub use listener::{bind_listeners, Acceptor, Listeners};
pub use stream::{Origin, PeerAddr, Socket, StdStream, Stream};
pub use tune::{Accepting, TcpTuning};

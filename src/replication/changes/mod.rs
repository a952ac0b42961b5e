//! Reading a source's `_changes`: the changes reader a replication runs ([`reader`], which
//! reads in pages or waits on a shared watch), the row format (`feed_line`), the streaming
//! parser of a normal feed (`normal_feed`), and the shared change watches ([`watch`]: one
//! continuous feed per watched database, followed by the task in `watch_follower`).

pub(crate) mod feed_line;
pub(crate) mod normal_feed;
pub mod reader;
pub mod watch;
pub(crate) mod watch_follower;

//! etcd's errors as the contract's: a compacted revision is FDB's `transaction_too_old`, too
//! many operations or too large a request is `TooLarge`, and anything that may have cut a
//! commit short (unavailable, timeout, leader change, lost connection) is `CommitUnknown`,
//! which the committer then resolves from etcd (`resolve.rs`); the same outside a commit is
//! `Unavailable`. Status messages are etcd's own (they carry no
//! credentials).

use etcd_client::Error;
use tonic::Code;

use crate::store::StoreError;

/// What an error means, before knowing whether a commit was in flight.
enum Kind {
    TooOld,
    TooLarge,
    /// The request may not have been served.
    Unavailable,
    /// The request was refused as it was: it did not apply.
    Refused,
}

fn kind(e: &Error) -> (Kind, String) {
    match e {
        Error::GRpcStatus(status) => {
            let message = status.message().to_string();
            let kind = match status.code() {
                _ if message.contains("compacted") => Kind::TooOld,
                _ if message.contains("too many operations") || message.contains("too large") => {
                    Kind::TooLarge
                }
                Code::ResourceExhausted => Kind::TooLarge,
                // "required revision is a future revision": a member behind the leader.
                Code::OutOfRange
                | Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Aborted
                | Code::Unknown
                | Code::Internal => Kind::Unavailable,
                _ => Kind::Refused,
            };
            (kind, format!("{:?}: {message}", status.code()))
        }
        Error::TransportError(_) | Error::IoError(_) => (Kind::Unavailable, e.to_string()),
        other => (Kind::Refused, other.to_string()),
    }
}

/// Whether a read at a revision was refused by a member that has not applied it yet
/// ("required revision is a future revision"). etcd answers it and a compacted revision
/// with the same gRPC code (`OutOfRange`), so only its message tells them apart; this is
/// the one place that reads it.
pub(crate) fn is_future_revision(e: &Error) -> bool {
    matches!(e, Error::GRpcStatus(s)
        if s.code() == Code::OutOfRange && s.message().contains("future revision"))
}

/// An error of a read (or of anything sent before the commit).
pub(crate) fn read_error(e: Error) -> StoreError {
    match kind(&e) {
        (Kind::TooOld, _) => StoreError::TooOld,
        (Kind::TooLarge, message) => StoreError::TooLarge(message),
        (Kind::Unavailable, message) => StoreError::Unavailable(message),
        (Kind::Refused, message) => StoreError::Engine(format!("etcd: {message}")),
    }
}

/// An error of the commit's `Txn`: whether it applied is unknown unless etcd refused it.
pub(crate) fn commit_error(e: Error) -> StoreError {
    match kind(&e) {
        (Kind::TooOld, _) => StoreError::TooOld,
        (Kind::TooLarge, message) => StoreError::TooLarge(message),
        (Kind::Unavailable, message) => {
            tracing::debug!(error = %message, "etcd: commit outcome unknown");
            StoreError::CommitUnknown
        }
        (Kind::Refused, message) => StoreError::Engine(format!("etcd: {message}")),
    }
}

/// After etcd cancelled a watch for `reason`: takes a new auth token when the reason is the
/// token (a stream re-armed after the token expired), since only unary calls refresh it.
pub(crate) async fn refresh_if_auth(client: &etcd_client::Client, reason: &str) {
    let auth = reason.contains("auth") || reason.contains("permission denied");
    if auth && let Err(e) = client.refresh_token().await {
        tracing::debug!(error = %e, "etcd: auth token not refreshed");
    }
}

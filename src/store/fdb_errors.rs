//! FoundationDB error codes and the [`StoreError`] each becomes: the one mapping shared by
//! the FDB adapter (with the client library's own retry predicates) and the fault-injecting
//! wrapper (with [`predicates`], FDB 7.3's table), so an injected fault and the real error
//! reach callers identically. Pure, so it is tested without `libfdb_c`. Compiled with the
//! `fdb` feature, and for the crate's tests (the wrapper is theirs).

use super::StoreError;

/// FDB error transaction_too_old: the read version is older than the 5 s MVCC window (retryable).
pub const TRANSACTION_TOO_OLD: i32 = 1007;
/// FDB error not_committed: the transaction conflicted with another (retryable).
pub const NOT_COMMITTED: i32 = 1020;
/// FDB error transaction_cancelled: the transaction was cancelled.
pub const TRANSACTION_CANCELLED: i32 = 1025;
/// FDB error transaction_timed_out: the transaction ran past its timeout option.
pub const TRANSACTION_TIMED_OUT: i32 = 1031;
/// FDB error accessed_unreadable: a versionstamped key written in this transaction was read.
pub const ACCESSED_UNREADABLE: i32 = 1036;
/// FDB error operation_cancelled: an asynchronous operation was cancelled.
pub const OPERATION_CANCELLED: i32 = 1101;
/// FDB error client_invalid_operation: an operation the client does not allow.
pub const CLIENT_INVALID_OPERATION: i32 = 2000;
/// FDB error key_outside_legal_range: a key at or above `\xff` without system access.
pub const KEY_OUTSIDE_LEGAL_RANGE: i32 = 2004;
/// FDB error inverted_range: a range whose end is before its begin.
pub const INVERTED_RANGE: i32 = 2005;
/// FDB error invalid_option_value: a transaction option with a bad value.
pub const INVALID_OPTION_VALUE: i32 = 2006;
/// FDB error invalid_option: an unknown transaction option.
pub const INVALID_OPTION: i32 = 2007;
/// FDB error network_not_setup: the client network thread is not running.
pub const NETWORK_NOT_SETUP: i32 = 2008;
/// FDB error used_during_commit: the transaction was used while it committed.
pub const USED_DURING_COMMIT: i32 = 2017;
/// FDB error transaction_too_large: more than 10 MB of writes (or the size limit option).
pub const TRANSACTION_TOO_LARGE: i32 = 2101;
/// FDB error key_too_large: a key over 10 kB.
pub const KEY_TOO_LARGE: i32 = 2102;
/// FDB error value_too_large: a value over 100 kB.
pub const VALUE_TOO_LARGE: i32 = 2103;

// Codes only the predicate table below names: it serves the fault injector and the tests,
// so they are compiled with it.
/// FDB error future_version: a storage server is behind the read version (retryable).
#[cfg(any(test, feature = "internals"))]
pub const FUTURE_VERSION: i32 = 1009;
/// FDB error commit_unknown_result: the commit may or may not have happened (retryable, maybe committed).
#[cfg(any(test, feature = "internals"))]
pub const COMMIT_UNKNOWN_RESULT: i32 = 1021;
/// FDB error too_many_watches: the client's watch limit is reached.
#[cfg(test)]
pub const TOO_MANY_WATCHES: i32 = 1032;
/// FDB error process_behind: a storage server is lagging (retryable).
#[cfg(any(test, feature = "internals"))]
pub const PROCESS_BEHIND: i32 = 1037;
/// FDB error database_locked: the database is locked (retryable).
#[cfg(any(test, feature = "internals"))]
pub const DATABASE_LOCKED: i32 = 1038;
/// FDB error cluster_version_changed: the cluster upgraded during the commit (retryable, maybe committed).
#[cfg(any(test, feature = "internals"))]
pub const CLUSTER_VERSION_CHANGED: i32 = 1039;
/// FDB error proxy_memory_limit_exceeded: a commit proxy is out of memory (retryable).
#[cfg(any(test, feature = "internals"))]
pub const PROXY_MEMORY_LIMIT_EXCEEDED: i32 = 1042;
/// FDB error batch_transaction_throttled: batch-priority work is throttled (retryable).
#[cfg(any(test, feature = "internals"))]
pub const BATCH_TRANSACTION_THROTTLED: i32 = 1051;
/// FDB error tag_throttled: the transaction's tag is throttled (retryable).
#[cfg(any(test, feature = "internals"))]
pub const TAG_THROTTLED: i32 = 1213;

/// FDB's two predicates for `code` as the 7.3 client defines them (`fdb_error_predicate`):
/// `(retryable, maybe_committed)`. The adapter asks the client library instead; this table
/// is for the wrapper and tests.
#[cfg(any(test, feature = "internals"))]
pub fn predicates(code: i32) -> (bool, bool) {
    match code {
        COMMIT_UNKNOWN_RESULT | CLUSTER_VERSION_CHANGED => (true, true),
        TRANSACTION_TOO_OLD
        | FUTURE_VERSION
        | NOT_COMMITTED
        | PROCESS_BEHIND
        | DATABASE_LOCKED
        | PROXY_MEMORY_LIMIT_EXCEEDED
        | BATCH_TRANSACTION_THROTTLED
        | TAG_THROTTLED => (true, false),
        _ => (false, false),
    }
}

/// The contract's error for an FDB error. `retryable` and `maybe_committed` are FDB's
/// predicates for the code; every code either has a dedicated variant or keeps them.
pub fn classify(code: i32, message: &str, retryable: bool, maybe_committed: bool) -> StoreError {
    match code {
        NOT_COMMITTED => StoreError::Conflict,
        TRANSACTION_TOO_OLD => StoreError::TooOld,
        TRANSACTION_TIMED_OUT => StoreError::TimedOut,
        TRANSACTION_TOO_LARGE => StoreError::TooLarge(message.to_string()),
        KEY_TOO_LARGE
        | VALUE_TOO_LARGE
        | INVERTED_RANGE
        | KEY_OUTSIDE_LEGAL_RANGE
        | INVALID_OPTION
        | INVALID_OPTION_VALUE
        | CLIENT_INVALID_OPERATION
        | USED_DURING_COMMIT
        | ACCESSED_UNREADABLE => {
            StoreError::Invalid(format!("foundationdb error {code}: {message}"))
        }
        TRANSACTION_CANCELLED | OPERATION_CANCELLED | NETWORK_NOT_SETUP => StoreError::Closed,
        // Every "may have committed, retry" code (1021, 1039, ...) needs the same care.
        _ if retryable && maybe_committed => StoreError::CommitUnknown,
        _ => StoreError::Fdb {
            code,
            message: message.to_string(),
            retryable,
        },
    }
}

/// [`classify`] with [`predicates`]: what the adapter returns for `code`.
#[cfg(any(test, feature = "internals"))]
pub fn store_error(code: i32) -> StoreError {
    let (retryable, maybe_committed) = predicates(code);
    classify(code, "injected", retryable, maybe_committed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_code_maps_to_its_variant() {
        assert_eq!(store_error(NOT_COMMITTED), StoreError::Conflict);
        assert_eq!(store_error(TRANSACTION_TOO_OLD), StoreError::TooOld);
        assert_eq!(
            store_error(COMMIT_UNKNOWN_RESULT),
            StoreError::CommitUnknown
        );
        assert_eq!(
            store_error(CLUSTER_VERSION_CHANGED),
            StoreError::CommitUnknown
        );
        assert_eq!(store_error(TRANSACTION_TIMED_OUT), StoreError::TimedOut);
        assert!(matches!(
            store_error(TRANSACTION_TOO_LARGE),
            StoreError::TooLarge(_)
        ));
        assert!(matches!(store_error(KEY_TOO_LARGE), StoreError::Invalid(_)));
        assert_eq!(store_error(OPERATION_CANCELLED), StoreError::Closed);
    }

    #[test]
    fn retry_predicates_survive_the_mapping() {
        for code in [
            FUTURE_VERSION,
            PROCESS_BEHIND,
            TAG_THROTTLED,
            DATABASE_LOCKED,
        ] {
            assert!(store_error(code).is_retryable(), "{code}");
        }
        for code in [TOO_MANY_WATCHES, TRANSACTION_TIMED_OUT, 4100] {
            assert!(!store_error(code).is_retryable(), "{code}");
        }
        assert!(store_error(COMMIT_UNKNOWN_RESULT).is_retryable());
    }
}

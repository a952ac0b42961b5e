//! What a caller who is not an admin may ask of this node ([`UserLimits`]): how many
//! unfinished replication jobs they may hold (`[replicator] max_jobs_per_user`), and the
//! ceilings on the worker options of each (`user_max_worker_processes`,
//! `user_max_worker_batch_size`, `user_max_http_connections`). CouchDB has no such limits:
//! there, one user's `_replicate` call may ask for 256 workers of 50,000 documents over
//! 1,000 connections, as many times as they like. Admins are not limited.

use axum::http::StatusCode;

use super::error::{HttpError, HttpResult};
use crate::replication::ReplicationOptions;
use crate::replicator::Replicator;

/// The limits on callers who are not admins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserLimits {
    /// Unfinished (pending, running or crashing) jobs one user may hold.
    pub max_jobs: usize,
    /// The most `worker_processes` a user's job may ask for.
    pub worker_processes: usize,
    /// The most `worker_batch_size`.
    pub worker_batch_size: usize,
    /// The most `http_connections`.
    pub http_connections: usize,
}

impl Default for UserLimits {
    /// Twice CouchDB's per-job defaults (4 workers, batches of 500, 20 connections), and
    /// 100 jobs.
    fn default() -> Self {
        Self {
            max_jobs: 100,
            worker_processes: 8,
            worker_batch_size: 1000,
            http_connections: 40,
        }
    }
}

impl UserLimits {
    /// 400 `bad_request` naming the first option above its ceiling.
    pub fn check_options(&self, o: &ReplicationOptions) -> HttpResult<()> {
        let asked = [
            (
                "worker_processes",
                o.worker_processes,
                self.worker_processes,
            ),
            (
                "worker_batch_size",
                o.worker_batch_size,
                self.worker_batch_size,
            ),
            (
                "http_connections",
                o.http_connections,
                self.http_connections,
            ),
        ];
        for (name, value, most) in asked {
            if value > most {
                return Err(HttpError::bad_request(format!(
                    "{name} {value} is more than the {most} a user who is not an admin may \
                     ask for ([replicator] user_max_{name})"
                )));
            }
        }
        Ok(())
    }

    /// 403 `forbidden` when `user` already holds `max_jobs` unfinished jobs (read from that
    /// user's own rows, not from every job).
    pub async fn check_jobs(&self, rep: &Replicator, user: &str) -> HttpResult<()> {
        let held = rep.unfinished_jobs_of(user).await?;
        if held >= self.max_jobs {
            return Err(HttpError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "user {user} has {held} unfinished replication jobs, the most \
                     [replicator] max_jobs_per_user allows"
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_option_above_its_ceiling_is_named() {
        let l = UserLimits::default();
        let ok = ReplicationOptions::default();
        assert!(l.check_options(&ok).is_ok());
        let greedy = ReplicationOptions {
            http_connections: 1000,
            ..ReplicationOptions::default()
        };
        let e = l.check_options(&greedy).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.reason.contains("http_connections 1000"), "{}", e.reason);
        assert!(
            e.reason.contains("user_max_http_connections"),
            "{}",
            e.reason
        );
    }
}

//! Log output for the `serve` command: human text or one JSON object per line (with the
//! fields of the current span and of every enclosing span, so a job's lines carry its
//! `job_id` and `rep_id`), filtered by `RUST_LOG` (default `info`).

use std::str::FromStr;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable text (colours on a terminal).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// An unknown `--log-format` value.
#[derive(Debug, thiserror::Error)]
#[error("unknown log format `{0}` (expected `text` or `json`)")]
pub struct UnknownLogFormat(String);

impl FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(UnknownLogFormat(other.to_owned())),
        }
    }
}

/// Installs the process's subscriber on stderr (a no-op if one is installed already).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

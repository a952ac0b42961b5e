//! CouchDB's `[prometheus]` section: `additional_port = true` serves the metrics on a port
//! of their own (`bind_address`, default `127.0.0.1`; `port`, default 17986), without
//! authentication, so operators can scrape there and keep the API's port closed to their
//! monitoring network. Off by default, as in CouchDB.

use std::net::{IpAddr, SocketAddr};

use super::config_file::ConfigFile;

/// The section.
pub const SECTION: &str = "prometheus";

/// The keys this file reads.
pub const KEYS: &[&str] = &["additional_port", "bind_address", "port"];

/// CouchDB's default port for the metrics.
const DEFAULT_PORT: u16 = 17986;

/// Where to serve the metrics on their own, when `additional_port` is true.
pub fn read(cfg: &ConfigFile) -> Result<Option<SocketAddr>, String> {
    let on = match cfg.get(SECTION, "additional_port").map(str::trim) {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => {
            return Err(format!(
                "[{SECTION}] additional_port must be true or false, not `{v}`"
            ));
        }
    };
    let ip: IpAddr = match cfg.get(SECTION, "bind_address") {
        None => IpAddr::from([127, 0, 0, 1]),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("[{SECTION}] bind_address must be an IP address, not `{v}`"))?,
    };
    let port = match cfg.get(SECTION, "port") {
        None => DEFAULT_PORT,
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("[{SECTION}] port must be a port number, not `{v}`"))?,
    };
    Ok(on.then_some(SocketAddr::new(ip, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_asked_for() {
        let none = ConfigFile::parse("[prometheus]\nport = 9100\n").unwrap();
        assert_eq!(read(&none).unwrap(), None);
        let on = ConfigFile::parse("[prometheus]\nadditional_port = true\nport = 9100\n").unwrap();
        assert_eq!(read(&on).unwrap(), Some("127.0.0.1:9100".parse().unwrap()));
        let bad = ConfigFile::parse("[prometheus]\nadditional_port = yes\n").unwrap();
        assert!(read(&bad).unwrap_err().contains("additional_port"));
    }
}

//! The two ends of a replication: one database ([`database::Endpoint`], URL with the
//! credentials kept apart) and a whole server ([`server`]: `_all_dbs`, `_db_updates`).

pub mod database;
pub mod server;

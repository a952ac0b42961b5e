//! Placeholder: the `replication` benchmark is written by its issue.
fn main() {
    eprintln!("the replication benchmark is not built yet");
    std::process::exit(1);
}

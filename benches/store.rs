//! Placeholder: the `store` benchmark is written by its issue.
fn main() {
    eprintln!("the store benchmark is not built yet");
    std::process::exit(1);
}

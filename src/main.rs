//! The `couch-replicator` binary: the command line lives in the library
//! (`couch_replicator::cli`), so this file only calls it.

/// mimalloc instead of glibc's malloc (docs/decisions/2026-11-27-allocator.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h (v3): how long freed pages stay resident.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// `mi_option_allow_thp` in mimalloc.h (v3): whether its arenas ask for transparent huge pages.
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

fn main() -> std::process::ExitCode {
    // Freed pages go back to the system at once instead of 10 ms later: a response body
    // read up to its cap and dropped otherwise stayed resident while the next one was read,
    // and a node's memory under hostile endpoints doubled (docs/operations.md, "Caps on what
    // endpoints send").
    // SAFETY: sets a process-wide option before any other thread exists; mimalloc allows
    // options to be set at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    // No transparent huge pages: with them a freed 4 KiB page inside a 2 MiB one stays
    // resident, and streaming a 1 GiB attachment left the node 30.8 MiB larger (3.0 MiB
    // without; docs/decisions/2026-11-29-no-huge-pages.md). The option stops later requests
    // for them; the arena reserved before `main` asked already, so the process opts out too.
    // SAFETY: as above; `prctl(PR_SET_THP_DISABLE)` only sets a flag of this process.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0);
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
    couch_replicator::cli::main()
}
